"""Low-level file writing shared by every layer: a file is written whole or not at all."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def atomic_write(path: Path | str, data: bytes | str) -> None:
    """Write to a temporary name in the same folder, fsync, then rename: a reader never sees half a file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes 0600; results are meant to be shared like any file
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data.encode() if isinstance(data, str) else data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException as exc:
        if os.path.exists(tmp):
            os.unlink(tmp)
        if isinstance(exc, OSError) and exc.filename is None:  # a write() that failed names no file: name it
            raise OSError(exc.errno, exc.strerror, str(path)) from exc
        raise


def writable_folder(path: str | Path, option: str) -> Path:
    """`path` is a folder lmlab can create or write in, checked without creating it: one sentence naming the
    option otherwise (a file in the way, a parent that is not a folder, no permission)."""
    from lmlab.errors import LmlabError

    path = Path(path).expanduser()
    if path.exists() and not path.is_dir():
        raise LmlabError(f"{option} {path}: a file is there, not a folder")
    probe = path
    while not probe.exists():
        probe = probe.parent
    if not probe.is_dir():
        raise LmlabError(f"{option} {path}: {probe} is a file, so the folder cannot be made")
    if not os.access(probe, os.W_OK | os.X_OK):
        raise LmlabError(f"{option} {path}: {probe} cannot be written (permission denied)")
    return path


def splice(text: str, name: str, body: str) -> str:
    """`text` with what lies between its `<!-- NAME:begin -->` and `<!-- NAME:end -->` lines replaced by `body`."""
    from lmlab.errors import LmlabError

    begin, end = f"<!-- {name}:begin -->\n", f"<!-- {name}:end -->"
    if begin not in text or end not in text:
        raise LmlabError(f"no '<!-- {name}:begin -->' ... '<!-- {name}:end -->' markers to write between")
    head, rest = text.split(begin, 1)
    return head + begin + body + end + rest.split(end, 1)[1]
