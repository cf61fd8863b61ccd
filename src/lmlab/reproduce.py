"""`lmlab reproduce`: every registered study on the embedded defaults (or given models), one after another,
or `jobs` at a time.

A study that fails does not stop the others: its one-line reason is recorded and shown in the report,
and the exit code is non-zero. A killed run, started again with the same options, skips the studies
that finished (their run folders are complete) and resumes the one that was interrupted.

With `jobs` > 1 each study runs in a process of its own (spawned), with the CPU threads shared out between
the processes, the longest expected study first. On 2 CPU cores two one-thread processes get more from the
cores than one process of two threads: the small models' matrix products and elementwise steps split poorly
over two threads (a toy training step gains far less than twice from a second thread).
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
    """The study's measured run time for the profile: its entry in the timings file that `lmlab results` writes
    from finished run folders (the machine it was measured on is recorded beside it); None where none is."""
    from lmlab.results import load_timings

    value = (load_timings().get(name) or {}).get(profile, {}).get("seconds")
    return float(value) if value else None


def time_left(names: list[str], outcomes: list["Outcome"], profile: str) -> float | None:
    """Seconds left for the studies not yet run: their measured shares, scaled by how this machine compared on
    the studies run by this call, in whole or in part (a run reused whole tells nothing of this machine)."""
    done = {o.study for o in outcomes}
    left = [expected_seconds(n, profile) for n in names if n not in done]
    if not left or any(v is None for v in left):
        return None
    ran = [(o.seconds, expected_seconds(o.study, profile)) for o in outcomes if not o.resumed and o.status == "ok"]
    ran = [(a, e) for a, e in ran if e]
    speed = sum(a for a, _ in ran) / sum(e for _, e in ran) if ran else 1.0
    return speed * sum(left)


def _model_of(name: str, profile: str, models: dict[str, str] | None) -> str:
    spec = STUDIES[name]
    # the full profile runs the decoder studies on every embedded decoder (one figure, a row per model)
    default = ",".join(spec.full_models) if profile == "full" and spec.full_models else spec.default_model
    return (models or {}).get(name, default)


def _run_one(name: str, model: str, profile: str, seed: int, settings: dict, out: Path,
             threads: int | None = None) -> Outcome:
    """One study, its failure caught as an Outcome (a KeyboardInterrupt goes on up)."""
    if threads:
        import torch

        torch.set_num_threads(threads)
    spec = STUDIES[name]
    t0 = time.perf_counter()
    try:
        config = spec.config(model=model, profile=profile, seed=seed, **settings)
        result = run_study(spec, config, out)
        # the run's own time over every session (a run already done: the time it took then), not this call's
        return Outcome(name, model, "ok", result.verdict.status, result.verdict.summary, str(result.path),
                       round(result.seconds or time.perf_counter() - t0, 1), result.resumed)
    except KeyboardInterrupt:
        raise
    except Exception as exc:  # noqa: BLE001 - one study's failure must not stop the others
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        if not isinstance(exc, LmlabError):
            reason = f"{type(exc).__name__}: {reason}"
        return Outcome(name, model, "failed", seconds=round(time.perf_counter() - t0, 1), reason=reason)


def _said(outcome: Outcome, name: str = "") -> str:
    head = f"      {name}: " if name else "      "
    if outcome.status == "failed":
        return f"{head}failed: {outcome.reason}"
    return f"{head}{outcome.verdict} ({'already done' if outcome.resumed else f'{outcome.seconds:.0f} s'})"


SUMMARY_FILES = {False: "reproduce.json", True: "placebo.json"}  # what a reproduce run (or its placebo) records


def reproduced_studies() -> list[str]:
    """The studies `reproduce` runs, in registration order (those that need inputs of their own left out)."""
    return [name for name, spec in STUDIES.items() if spec.in_reproduce]


def reproduce(out: str | Path = "runs", profile: str = "quick", seed: int = 0, models: dict[str, str] | None = None,
              only: list[str] | None = None, overrides: dict[str, dict] | None = None,
              say: Callable[[str], None] = print,
              progress: Callable[[list[str], list["Outcome"], list[str], float | None], None] | None = None,
              jobs: int = 1, placebo: bool = False) -> list[Outcome]:
    """`progress(names, outcomes, running, seconds_left)` is called whenever a study starts or ends (`running`: the
    studies under way). `jobs`: how many studies run at once, each in its own process. `placebo`: every study's
    placebo instead (its treatment replaced by one that cannot have the paper's effect), recorded in placebo.json."""
    out = Path(out)
    names = only or reproduced_studies()
    if placebo:
        overrides = {name: {**(overrides or {}).get(name, {}), "placebo": True} for name in names}
    unknown = [n for n in names if n not in STUDIES]
    if unknown:
        raise LmlabError(f"unknown study '{unknown[0]}'; registered: {', '.join(STUDIES)}")
    refused = [n for n in names if not STUDIES[n].in_reproduce]
    if refused:
        raise LmlabError(f"{refused[0]} needs inputs of its own and is not part of reproduce; run lmlab {refused[0]}")
    if jobs < 1:
        raise LmlabError(f"--jobs takes a whole number of at least 1, got {jobs}")
    if jobs > 1 and len(names) > 1:
        return _reproduce_parallel(out, profile, seed, models, names, overrides or {}, say, progress, jobs, placebo)
    outcomes: list[Outcome] = []
    for i, name in enumerate(names, 1):
        if progress:
            progress(names, outcomes, [name], time_left(names, outcomes, profile))
        model = _model_of(name, profile, models)
        say(f"[{i}/{len(names)}] {STUDIES[name].title} on {model} ({profile})")
        outcome = _run_one(name, model, profile, seed, (overrides or {}).get(name, {}), out)
        say(_said(outcome))
        outcomes.append(outcome)
        _write_summary(out, profile, outcomes, placebo)
    if progress:
        progress(names, outcomes, [], 0.0)
    return outcomes


def _reproduce_parallel(out, profile, seed, models, names, overrides, say, progress, jobs,
                        placebo: bool = False) -> list[Outcome]:
    import multiprocessing
    from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait

    import torch

    threads = max(1, torch.get_num_threads() // jobs)
    # the longest expected first, so that the processes finish close together
    order = sorted(names, key=lambda n: -(expected_seconds(n, profile) or 0.0))
    outcomes: list[Outcome] = []
    running: dict = {}
    pool = ProcessPoolExecutor(max_workers=jobs, mp_context=multiprocessing.get_context("spawn"),
                               initializer=_die_with_parent)
    try:
        waiting = list(order)
        while waiting or running:
            while waiting and len(running) < jobs:
                name = waiting.pop(0)
                model = _model_of(name, profile, models)
                say(f"[{names.index(name) + 1}/{len(names)}] {STUDIES[name].title} on {model} ({profile}), "
                    f"in a process of {threads} thread{'s' if threads > 1 else ''}")
                running[pool.submit(_run_one, name, model, profile, seed, overrides.get(name, {}), out, threads)] = name
                if progress:
                    progress(names, outcomes, list(running.values()), _left(names, outcomes, profile, jobs))
            finished, _ = wait(list(running), return_when=FIRST_COMPLETED)
            for future in finished:
                running.pop(future)
                outcome = future.result()
                say(_said(outcome, outcome.study))
                outcomes.append(outcome)
                _write_summary(out, profile, sorted(outcomes, key=lambda o: names.index(o.study)), placebo)
            if progress:
                progress(names, outcomes, list(running.values()), _left(names, outcomes, profile, jobs))
    except BaseException:
        pool.shutdown(wait=False, cancel_futures=True)
        raise
    pool.shutdown()
    return sorted(outcomes, key=lambda o: names.index(o.study))


def _die_with_parent() -> None:
    """A study's process ends when the `reproduce` process that started it dies, however it dies (SIGKILL, an
    out-of-memory kill): no study keeps running unseen, holding cores and its run folder. Linux's parent-death
    signal; elsewhere a Ctrl-C reaches the whole process group anyway."""
    import signal
    import sys

    if sys.platform.startswith("linux"):
        import ctypes

        try:
            ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, int(signal.SIGKILL))  # PR_SET_PDEATHSIG
        except OSError:
            pass


def _left(names, outcomes, profile, jobs) -> float | None:
    left = time_left(names, outcomes, profile)
    return None if left is None else left / jobs


def _write_summary(out: Path, profile: str, outcomes: list[Outcome], placebo: bool = False) -> None:
    try:
        atomic_write(out / SUMMARY_FILES[placebo], json.dumps({"profile": profile, "studies": [asdict(o) for o in outcomes]},
                                                        indent=2))
    except OSError as exc:
        raise LmlabError(f"cannot write to {out}: {exc.strerror or exc}") from exc
