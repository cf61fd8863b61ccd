"""Fault injection: a study killed (SIGKILL) at chosen points of its run and resumed each time, against the same
study run once without a kill.

Where a run can be cut is where it changes something a resume reads: a training step, a file renamed into place
(atomic_write's rename: tables, figures, the verdict, the manifest, checkpoints), a unit appended to a partial table.
Each of those is an *event* with an identity that a resumed run meets again (the step's number, the file's path,
the unit's key). The uninterrupted run lists its events; `kills` of them, each kind represented, are drawn with a
seeded generator and sorted into the run's order; one chain of processes then works on one run folder, process i
killing itself at event i (a unit's append is sometimes torn first: half its line written, no newline), and a last
process resumes to the end. Each process is forked from a server that imported torch and lmlab once, so a kill
costs what it interrupts, not an interpreter's start.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import random
import signal
import sys
from pathlib import Path

KINDS = ("step", "record", "replace")


def _context():
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(["torch", "lmlab.studies", "lmlab.train", "lmlab.models.load", "matplotlib.pyplot",
                                "lmlab.studies.knockout.recipe", "lmlab.studies.quantize.recipe",
                                "lmlab.studies.filler.recipe", "lmlab.studies.sparse_circuits.recipe",
                                "lmlab.studies.latent.recipe", "study_worker", "fault_preload"])
    return ctx


def _install(root: Path, log: str | None, target: list[str] | None, mode: str) -> None:
    """Event hooks in this (child) process: each event is logged to `log`; at `target` the process ends with
    SIGKILL (mode "kill"; "tear": a record's line half written first) or the disk fills (mode "full": that write and
    every later one fails with ENOSPC)."""
    import errno

    import lmlab.runs as runs
    import lmlab.train.loop as loop

    full = []

    def event(ident: list, before_kill=None, path=None) -> None:
        ident = [str(x) for x in ident]
        if log:
            with open(log, "a") as fh:
                fh.write(json.dumps(ident) + "\n")
        if target is not None and ident == target:
            if mode == "full":
                full.append(True)
            else:
                if before_kill and mode == "tear":
                    before_kill()
                os.kill(os.getpid(), signal.SIGKILL)
        if full and path is not None:
            raise OSError(errno.ENOSPC, "No space left on device", str(path))

    def rel(path) -> str:
        path = Path(os.fspath(path)).resolve()
        return str(path.relative_to(root)) if path.is_relative_to(root) else str(path)

    real_replace, real_rename = os.replace, os.rename

    def replace(src, dst, *a, **k):
        event(["replace", rel(dst)], path=dst)
        return real_replace(src, dst, *a, **k)

    def rename(src, dst, *a, **k):
        event(["replace", rel(dst)], path=dst)
        return real_rename(src, dst, *a, **k)

    os.replace, os.rename = replace, rename
    real_record = runs.RunDir.record

    def record(self, part, key, rows):
        def torn():
            line = (json.dumps({"key": str(key), "rows": rows}, default=runs._jsonable) + "\n").encode()
            file = self._partial(part)
            file.parent.mkdir(parents=True, exist_ok=True)
            with open(file, "ab") as fh:
                fh.write(line[:len(line) // 2])
                fh.flush()
                os.fsync(fh.fileno())
        event(["record", part, key], torn, path=self._partial(part))
        return real_record(self, part, key, rows)

    runs.RunDir.record = record
    real_init, real_advance = loop._progress.__init__, loop._progress.advance

    def init(self, config, main, start):
        self._fault_name, self._fault_step = config.description, start
        real_init(self, config, main, start)

    def advance(self, loss):
        self._fault_step += 1
        event(["step", self._fault_name, self._fault_step])
        real_advance(self, loss)

    loop._progress.__init__, loop._progress.advance = init, advance


def _child(study: str, out: str, log: str | None, target: list[str] | None, mode: str) -> None:
    import study_worker

    from lmlab import LmlabError
    from lmlab.studies import run_study

    _install(Path(out).resolve(), log, target, mode)
    spec, config, lm = study_worker.build(study, out)
    try:
        run_study(spec, config, out, lm=lm)
    except LmlabError as exc:  # what the command line would print: kept beside the run root
        Path(out).with_suffix(".error").write_text(str(exc))
        sys.exit(2)


def _run(ctx, study: str, out: Path, log: Path | None = None, target: list[str] | None = None,
         mode: str = "kill") -> int:
    proc = ctx.Process(target=_child, args=(study, str(out), str(log) if log else None, target, mode))
    proc.start()
    proc.join(600)
    if proc.is_alive():
        proc.kill()
        raise AssertionError(f"{study}: a run under fault injection did not end in 600 s")
    return proc.exitcode


def choose(events: list[list[str]], kills: int, seed: int) -> list[list[str]]:
    """`kills` events of the run, in its order: each kind (training step, rename into place, unit appended) at
    least twice where it occurs, the rest drawn from all; only events that occur once (an identity a resumed run
    meets exactly where the killed one stopped)."""
    counts: dict[tuple, int] = {}
    for e in events:
        counts[tuple(e)] = counts.get(tuple(e), 0) + 1
    unique = [i for i, e in enumerate(events) if counts[tuple(e)] == 1
              and not (e[0] == "replace" and e[1].startswith("/"))]  # (outside the run: caches a resume finds made)
    rng = random.Random(seed)
    picked: set[int] = set()
    for kind in KINDS:
        of_kind = [i for i in unique if events[i][0] == kind]
        picked |= set(rng.sample(of_kind, min(2, len(of_kind))))
    rest = [i for i in unique if i not in picked]
    picked |= set(rng.sample(rest, max(0, min(kills - len(picked), len(rest)))))
    return [events[i] for i in sorted(picked)][:kills]


def kill_and_resume(study: str, root: Path, kills: int = 20, seed: int = 0) -> dict:
    """The study once whole (root/whole) and once killed at `kills` points and resumed (root/killed)."""
    sys.path.insert(0, str(Path(__file__).parent / "workers"))  # study_worker, for the server's preload
    ctx = _context()
    log = root / "events.jsonl"
    assert _run(ctx, study, root / "whole", log=log) == 0, f"{study}: the uninterrupted run failed"
    events = [json.loads(line) for line in log.read_text().splitlines()]
    targets = choose(events, kills, seed)
    rng = random.Random(seed + 1)
    made, missed = [], []
    for target in targets:
        tear = target[0] == "record" and rng.random() < 0.5
        code = _run(ctx, study, root / "killed", target=target, mode="tear" if tear else "kill")
        (made if code == -signal.SIGKILL else missed).append((target, tear, code))
    assert _run(ctx, study, root / "killed") == 0, f"{study}: the last resume failed"
    kinds = {k: sum(1 for t, _, _ in made if t[0] == k) for k in KINDS}
    available = {k: len({tuple(e) for e in events if e[0] == k and not e[1].startswith("/")}) for k in KINDS}
    return {"events": len(events), "targets": targets, "made": made, "missed": missed, "kinds": kinds,
            "available": available,
            "torn": sum(1 for _, tear, _ in made if tear)}


def disk_fills(study: str, root: Path, points: int = 3, seed: int = 0) -> dict:
    """The study once whole (root/whole); then, for each of `points` write events (a unit appended, a file renamed
    into place), a run in root/full whose writes fail from that event on (ENOSPC), then the same run with room again.
    Returns the errors said and the exit codes."""
    sys.path.insert(0, str(Path(__file__).parent / "workers"))
    ctx = _context()
    log = root / "events.jsonl"
    assert _run(ctx, study, root / "whole", log=log) == 0, f"{study}: the uninterrupted run failed"
    events = [json.loads(line) for line in log.read_text().splitlines()]
    writes = [e for e in choose(events, 10 * points, seed) if e[0] in ("record", "replace")]
    rng = random.Random(seed)
    targets = sorted(rng.sample(writes, min(points, len(writes))), key=events.index)
    said, codes, folders = [], [], []
    for i, target in enumerate(targets):
        out = root / f"full{i}"
        codes.append(_run(ctx, study, out, target=target, mode="full"))
        error = out.with_suffix(".error")
        said.append(error.read_text() if error.is_file() else None)
        assert _run(ctx, study, out) == 0, f"{study}: the run with room again failed"
        folders.append(out)
    return {"targets": targets, "said": said, "codes": codes, "folders": folders}
