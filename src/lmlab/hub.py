"""Can a model hub be reached? Asked once per process and answered fast, so that a hub id on a machine
without one gives one clear sentence instead of minutes of retries.

The check opens a TCP connection to the hub's endpoint (HF_ENDPOINT, default huggingface.co) with a short
timeout. HF_HUB_OFFLINE=1 answers "no" without trying. Behind a proxy (HTTPS_PROXY / ALL_PROXY set) the
direct check means nothing, so it answers "yes" and leaves the request to the hub library.
"""

from __future__ import annotations

import functools
import os
import socket
from urllib.parse import urlparse


def endpoint() -> str:
    from huggingface_hub import constants

    return constants.ENDPOINT


@functools.lru_cache(maxsize=None)
def hub_reachable(timeout: float = 3.0) -> bool:
    from huggingface_hub import constants

    if constants.HF_HUB_OFFLINE:
        return False
    if any(os.environ.get(k) for k in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy")):
        return True
    url = urlparse(endpoint())
    port = url.port or (443 if url.scheme == "https" else 80)
    try:
        with socket.create_connection((url.hostname, port), timeout=timeout):
            return True
    except OSError:
        return False


def cached_locally(repo_id: str, filename: str = "config.json") -> bool:
    """`repo_id`'s `filename` is in the local hub cache (so it can load with local_files_only)."""
    from huggingface_hub import try_to_load_from_cache

    return isinstance(try_to_load_from_cache(repo_id, filename), str)


def unreachable_message(what: str, offline_hint: str) -> str:
    return (f"no hub reachable ({endpoint()}) and {what} is not in the local cache: {offline_hint}, or run where "
            f"the hub is reachable (HF_HUB_OFFLINE=1 uses only the local cache)")
