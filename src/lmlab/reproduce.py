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


def reproduce(out: str | Path = "runs", profile: str = "quick", seed: int = 0, models: dict[str, str] | None = None,
              only: list[str] | None = None, overrides: dict[str, dict] | None = None,
              say: Callable[[str], None] = print) -> list[Outcome]:
    out = Path(out)
    names = only or list(STUDIES)
    unknown = [n for n in names if n not in STUDIES]
    if unknown:
        raise LmlabError(f"unknown study '{unknown[0]}'; registered: {', '.join(STUDIES)}")
    outcomes = []
    for i, name in enumerate(names, 1):
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
    return outcomes


def _write_summary(out: Path, profile: str, outcomes: list[Outcome]) -> None:
    try:
        atomic_write(out / "reproduce.json", json.dumps({"profile": profile, "studies": [asdict(o) for o in outcomes]},
                                                        indent=2))
    except OSError as exc:
        raise LmlabError(f"cannot write to {out}: {exc.strerror or exc}") from exc
