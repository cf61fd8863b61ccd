"""`lmlab reproduce`: every registered study on the embedded defaults (or given models), one after another.

A study that fails does not stop the others: its one-line reason is recorded and shown in the report,
and the exit code is non-zero. A killed run, started again with the same options, skips the studies
that finished (their run folders are complete) and resumes the one that was interrupted.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

from lmlab.errors import LmlabError
from lmlab.files import atomic_write
from lmlab.studies import STUDIES, run_study


@dataclass
class Outcome:
    study: str
    model: str
    status: str  # ok | failed
    verdict: str | None = None
    summary: str | None = None
    path: str | None = None
    seconds: float = 0.0
    resumed: bool = False
    reason: str | None = None


def expected_seconds(name: str, profile: str) -> float | None:
    """The study's measured run time for the profile (its profiles.yaml `seconds`, on the machine named there)."""
    from lmlab.studies.base import load_profiles

    spec = STUDIES[name]
    table = load_profiles(spec.config.__module__.rpartition(".")[0]).get("seconds") or {}
    value = table.get(profile)
    return float(value) if value else None


def time_left(names: list[str], outcomes: list["Outcome"], profile: str) -> float | None:
    """Seconds left for the studies not yet run: their measured shares, scaled by how this machine compared on
    the studies already run (fresh runs only; a reused run took no time)."""
    done = {o.study for o in outcomes}
    left = [expected_seconds(n, profile) for n in names if n not in done]
    if not left or any(v is None for v in left):
        return None
    ran = [(o.seconds, expected_seconds(o.study, profile)) for o in outcomes if not o.resumed and o.status == "ok"]
    ran = [(a, e) for a, e in ran if e]
    speed = sum(a for a, _ in ran) / sum(e for _, e in ran) if ran else 1.0
    return speed * sum(left)


def reproduce(out: str | Path = "runs", profile: str = "quick", seed: int = 0, models: dict[str, str] | None = None,
              only: list[str] | None = None, overrides: dict[str, dict] | None = None,
              say: Callable[[str], None] = print,
              progress: Callable[[list[str], list["Outcome"], str | None, float | None], None] | None = None
              ) -> list[Outcome]:
    """`progress(names, outcomes, running, seconds_left)` is called before each study and after the last."""
    out = Path(out)
    names = only or list(STUDIES)
    unknown = [n for n in names if n not in STUDIES]
    if unknown:
        raise LmlabError(f"unknown study '{unknown[0]}'; registered: {', '.join(STUDIES)}")
    outcomes: list[Outcome] = []
    for i, name in enumerate(names, 1):
        if progress:
            progress(names, outcomes, name, time_left(names, outcomes, profile))
        spec = STUDIES[name]
        # the full profile runs the decoder studies on every embedded decoder (one figure, a row per model)
        default = ",".join(spec.full_models) if profile == "full" and spec.full_models else spec.default_model
        model = (models or {}).get(name, default)
        say(f"[{i}/{len(names)}] {spec.title} on {model} ({profile})")
        t0 = time.perf_counter()
        try:
            config = spec.config(model=model, profile=profile, seed=seed, **(overrides or {}).get(name, {}))
            result = run_study(spec, config, out)
            outcome = Outcome(name, model, "ok", result.verdict.status, result.verdict.summary, str(result.path),
                              round(time.perf_counter() - t0, 1), result.resumed)
            say(f"      {result.verdict.status} ({'already done' if result.resumed else f'{outcome.seconds:.0f} s'})")
        except KeyboardInterrupt:
            raise
        except Exception as exc:  # noqa: BLE001 - one study's failure must not stop the others
            reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            if not isinstance(exc, LmlabError):
                reason = f"{type(exc).__name__}: {reason}"
            outcome = Outcome(name, model, "failed", seconds=round(time.perf_counter() - t0, 1), reason=reason)
            say(f"      failed: {reason}")
        outcomes.append(outcome)
        _write_summary(out, profile, outcomes)
    if progress:
        progress(names, outcomes, None, 0.0)
    return outcomes


def _write_summary(out: Path, profile: str, outcomes: list[Outcome]) -> None:
    try:
        atomic_write(out / "reproduce.json", json.dumps({"profile": profile, "studies": [asdict(o) for o in outcomes]},
                                                        indent=2))
    except OSError as exc:
        raise LmlabError(f"cannot write to {out}: {exc.strerror or exc}") from exc
