"""`run_study`: one study on one model or several, into a run folder, resumable, as a `StudyResult`.

A model is a name (embedded, hub id, folder, .gguf) or a `LoadedModel` already in memory. A model passed
in is fingerprinted by its weights, so an edited model never reuses the run folder of the unedited one.
Several models: each runs as its own single-model run (reused and resumed like any other), and a parent
folder holds the combined result: the tables stacked (every row carries `model`), a verdict per model and
an overall one, and a figure with one row of panels per model.

Under a launcher (`accelerate launch -m lmlab ...`, see lmlab.parallel) every process runs the study on its
share of the units; rank 0 alone finishes it and writes the folder, and `run_study` returns None elsewhere.
"""

from __future__ import annotations

import errno
import time
from pathlib import Path
from typing import Sequence

import pandas as pd

from lmlab import parallel
from lmlab.environment import environment
from lmlab.errors import LmlabError
from lmlab.models import LoadedModel, weights_fingerprint
from lmlab.runs import RunDir
from lmlab.studies.config import StudyConfig
from lmlab.studies.registry import StudySpec
from lmlab.studies.runtime import seed_everything
from lmlab.studies.verdict import Verdict, placebo_verdict
from lmlab.studies.result import StudyResult, draw, load_result, overall_verdict, split_tables


def model_names(model: str) -> list[str]:
    """`--model a,b` -> ["a", "b"] (hub ids, paths and embedded names never hold a comma)."""
    names = [m.strip() for m in str(model).split(",") if m.strip()]
    if not names:
        raise LmlabError("give a model: an embedded name, a hub id, a local directory or a .gguf file")
    if len(set(names)) != len(names):
        raise LmlabError(f"a model is named twice in '{model}'")
    return names


def run_study(spec: StudySpec, config: StudyConfig, out: str | Path = "runs",
              lm: LoadedModel | Sequence[LoadedModel] | None = None) -> StudyResult | None:
    """Run (or finish, or just re-read) `spec` with `config` on its model(s); every artefact lands in a run folder.
    On a process other than rank 0 of a launch: its share of the work, then None."""
    lms = list(lm) if isinstance(lm, (list, tuple)) else ([lm] if lm is not None else [])
    config.torch_device()  # a device this machine lacks fails here, before any folder or model
    config.check_launch()  # a study that cannot share its work out over processes says so
    names = [m.name for m in lms] if lms else model_names(config.model)
    if lms and len({m.name for m in lms}) != len(lms):
        raise LmlabError("two models passed in share a name; give each LoadedModel its own .name")
    if parallel.is_distributed() and len(names) > 1:
        raise LmlabError("several models under one launch: launch one command per model (each model's run "
                         "shards its own units)")
    children = [_run_one(spec, config.model_copy(update={"model": name}), out, lms[i] if lms else None)
                for i, name in enumerate(names)]
    if children[0] is None:  # a follower process: its share is recorded, rank 0 finishes the run
        return None
    if len(children) == 1:
        return children[0]
    return _combine(spec, config.model_copy(update={"model": ",".join(names)}), out, children, lms)


def _run_one(spec: StudySpec, config: StudyConfig, out, lm: LoadedModel | None) -> StudyResult | None:
    tag = weights_fingerprint(lm) if lm is not None else None
    run = RunDir.open(out, spec.name, config.model, config.identity(), tag=tag)
    if run.complete:
        return _with_spec(load_result(run.path), spec) if parallel.is_main() else None
    t0 = time.perf_counter()
    run.log(f"start {spec.name} model={config.model} profile={config.profile} seed={config.seed}"
            + (f" weights={tag}" if tag else ""))
    seed_everything(config.seed)
    try:
        from lmlab.train.loop import log_root

        with log_root(run.path / "logs"):  # where a training's trackers write (--log-with)
            frame = spec.run(config, run, lm)
        parallel.main_only()  # (a sharding study has stopped its followers already; this is the backstop)
    except parallel.Follower:
        return None
    except Exception as exc:  # an interrupt (KeyboardInterrupt) keeps the folder as it is, to resume
        _stop_on_storage(run, exc)
        run.fail(str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
        raise
    try:
        return _finish_run(spec, config, run, frame, t0, tag)
    except OSError as exc:
        _stop_on_storage(run, exc)
        raise


# a write that failed for want of room or permission: the run stops with one sentence and resumes once it can write
_STORAGE = {errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM, errno.EFBIG}


def storage_error(exc: OSError) -> LmlabError | None:
    """One sentence naming the path for an error of the disk (full, read-only, no permission); None otherwise."""
    if exc.errno not in _STORAGE:
        return None
    where = exc.filename or "the run folder"
    return LmlabError(f"cannot write {where}: {exc.strerror or exc}; what the run finished is kept: make room (or "
                      "fix the permission) and run the same command again to resume")


def _stop_on_storage(run: RunDir, exc: BaseException) -> None:
    """A disk error is raised again as its one sentence, the run marked failed where the disk still allows it (a
    full disk may refuse even that); any other error returns."""
    stopped = storage_error(exc) if isinstance(exc, OSError) else None
    if stopped is None:
        return
    try:
        run.fail(str(stopped))
    except OSError:
        pass
    raise stopped from None


def _finish_run(spec: StudySpec, config: StudyConfig, run: RunDir, frame, t0: float, tag) -> StudyResult:
    if spec.derive is not None:  # the tables the analysis derives from the measurements (made again by rejudge)
        frame = spec.derive(frame, config)
    tables, meta = split_tables(frame, config.model), dict(run.meta)
    if config._placed:
        meta["device_map"] = dict(config._placed)
    result = StudyResult(spec.name, [config.model], tables, {config.model: meta}, {}, _PENDING,
                         config, run.path, _spec=spec)
    # the verdict sizes what would decide it from this run's pace: every session of a resumed run counts
    result.seconds = max(time.perf_counter() - t0, run.logged_seconds())
    result.verdict = judged(spec, result)
    result.verdicts = {config.model: result.verdict}
    _write(run, result)
    session = time.perf_counter() - t0
    run.log(f"done in {session:.1f}s: {result.verdict.status}")
    total = max(session, run.logged_seconds())
    result.seconds = total  # the run's time over its sessions, as load_result reads it back
    run.finish(model=config.model, models=[config.model], verdict=result.verdict.status,
               run_seconds=round(total, 1), session_seconds=round(session, 1),
               environment=environment(config.torch_device()),
               **({"weights": tag} if tag else {}))
    return result


def judged(spec: StudySpec, result: StudyResult) -> Verdict:
    """The study's verdict on `result`; a placebo run's marked as the placebo's (`placebo_verdict`)."""
    verdict = spec.verdict(result)
    if result.config.placebo:
        verdict = placebo_verdict(verdict, spec.config.placebo_treatment)
    return verdict


def _combine(spec: StudySpec, config: StudyConfig, out, children: list[StudyResult], lms) -> StudyResult:
    tag = "+".join(weights_fingerprint(m) for m in lms) if lms else None
    run = RunDir.open(out, spec.name, config.model.replace(",", "+"), config.identity(), tag=tag)
    names = [c.models[0] for c in children]
    tables: dict[str, pd.DataFrame] = {}
    for name in dict.fromkeys(k for c in children for k in c.tables):
        tables[name] = pd.concat([c.tables[name] for c in children if name in c.tables], ignore_index=True)
    verdicts = {c.models[0]: c.verdict for c in children}
    result = StudyResult(spec.name, names, tables, {c.models[0]: c.meta.get(c.models[0], {}) for c in children},
                         verdicts, overall_verdict(verdicts), config, run.path,
                         sum(c.seconds for c in children), all(c.resumed for c in children), _spec=spec)
    _write(run, result)
    run.finish(model=config.model, models=names, verdict=result.verdict.status,
               run_seconds=round(sum(c.seconds for c in children), 1),
               children=[str(c.path) for c in children])
    return result


def _write(run: RunDir, result: StudyResult) -> None:
    """The tables, meta and verdict, the figure, and (one model's run) the study's figures beside it."""
    import matplotlib.pyplot as plt

    result.save(run.path)
    fig = draw(result)
    run.write_figure(fig)
    plt.close(fig)
    if result.spec.figures is not None and len(result.models) == 1:
        for name, extra in result.spec.figures(result).items():
            run.write_figure(extra, name=name)
            plt.close(extra)


def _with_spec(result: StudyResult, spec: StudySpec) -> StudyResult:
    result._spec = spec
    return result


_PENDING = Verdict(status="inconclusive", claim="", parts=[{"kind": "pending"}])


def rejudge(folder) -> StudyResult:
    """A finished run judged again from its measurements by this lmlab's rules (the claims, their sources and bars may
    have changed since it ran): the derived tables made again from the measured ones (a study with `derive`), then
    verdict.json, the figures and the manifest's verdict rewritten, so the folder agrees with itself. A several-model
    run judges each model's rows by themselves and the whole by the usual rule."""
    import json

    from lmlab.files import atomic_write

    result = load_result(folder)
    spec = result.spec
    if spec.derive is not None:
        _derive_again(spec, result)
    if len(result.models) == 1:
        verdicts = {result.models[0]: judged(spec, result)}
    else:
        verdicts = {m: judged(spec, result.for_model(m)) for m in result.models}
    result.verdicts = verdicts
    result.verdict = next(iter(verdicts.values())) if len(verdicts) == 1 else overall_verdict(verdicts)
    run = RunDir(result.path, spec.name, result.config.identity())
    _write(run, result)
    manifest_file = result.path / "manifest.json"
    manifest = json.loads(manifest_file.read_text())
    manifest["verdict"] = result.verdict.status
    atomic_write(manifest_file, json.dumps(manifest, indent=2))
    return result


def _derive_again(spec: StudySpec, result: StudyResult) -> None:
    """Each model's derived tables made again from its measured ones (`spec.derive` replaces its own kinds); the
    files of a derived table the rules no longer make are removed."""
    tables: dict[str, pd.DataFrame] = {}
    for model in result.models:
        frame = result.for_model(model).long().drop(columns="model")
        made = split_tables(spec.derive(frame, result.config), model)
        for name, table in made.items():
            tables[name] = pd.concat([tables[name], table], ignore_index=True) if name in tables else table
    for stale in set(result.tables) - set(tables):
        for suffix in (".csv", ".parquet"):
            (result.path / "tables" / f"{stale}{suffix}").unlink(missing_ok=True)
    result.tables = tables
