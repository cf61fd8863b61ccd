"""`lmlab report RUN_DIR...`: one self-contained HTML file (figures inlined, no network needed).

At the top, a table of the verdicts (per model, and overall for a several-model run). Then, per study:
the paper's figure as described (seed) next to ours, the verdict with its numbers, the key rows, the
model, data and configuration, and the run time. A study recorded as failed by `lmlab reproduce` is
shown with its one-line reason. The page comes from a jinja2 template with autoescaping on.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path

from jinja2 import Environment, PackageLoader, select_autoescape

from lmlab.environment import describe
from lmlab.errors import LmlabError
from lmlab.files import atomic_write
from lmlab.studies import STUDIES, load_result


def _run_dirs(paths: list[Path]) -> tuple[list[Path], list[dict]]:
    """Expand roots into study run folders (those with a config), plus failures recorded by reproduce.
    A single-model run that a several-model run combines is shown inside that run, not again on its own."""
    runs, failures = [], []
    for path in paths:
        if not path.exists():
            raise LmlabError(f"no run directory at {path}")
        if (path / "config.yaml").exists():
            runs.append(path)
            continue
        runs += sorted(p.parent for p in path.glob("*/config.yaml"))
        summary = path / "reproduce.json"
        if summary.exists():
            failures += [s for s in json.loads(summary.read_text())["studies"] if s["status"] == "failed"]
    children = set()
    for run in runs:
        manifest = run / "manifest.json"
        if manifest.exists():
            children |= {Path(c).resolve() for c in json.loads(manifest.read_text()).get("children", [])}
    if len(runs) > 1:
        runs = [r for r in runs if r.resolve() not in children]
    if not runs and not failures:
        raise LmlabError(f"no study runs found under {', '.join(map(str, paths))}")
    return runs, failures


def _study_of(run: Path) -> str:
    manifest = run / "manifest.json"
    if manifest.exists():
        return json.loads(manifest.read_text()).get("study", "")
    prefixes = [name for name in STUDIES if run.name.startswith(name + "-")]  # names have dashes: longest wins
    return max(prefixes, key=len) if prefixes else run.name.split("-")[0]


def _section(run: Path) -> dict:
    study = _study_of(run)
    spec = STUDIES.get(study)
    manifest = json.loads((run / "manifest.json").read_text()) if (run / "manifest.json").exists() else {}
    if manifest.get("status") == "failed":
        return dict(anchor=run.name, study=study, title=spec.title if spec else study, model="", status="failed",
                    summary=f"failed: {manifest.get('reason', 'no reason recorded')} (rerun the command to resume)",
                    seconds=None, complete=False, folder=str(run), rows=[])
    try:
        result = load_result(run)
    except LmlabError as exc:
        return dict(anchor=run.name, study=study, title=spec.title if spec else study, model="", status="incomplete",
                    summary=str(exc), seconds=None, complete=False, folder=str(run), rows=[])
    figure = base64.b64encode((run / "figure.png").read_bytes()).decode() if (run / "figure.png").exists() else ""
    key = result.summary()
    rows = [dict(model=m, status=v.status, summary=v.summary) for m, v in result.verdicts.items()]
    return dict(anchor=run.name, study=study, title=spec.title if spec else study, model=", ".join(result.models),
                status=result.verdict.status, summary=result.verdict.summary, seconds=result.seconds, complete=True,
                paper=spec.paper if spec else "", seed_file=spec.seed_file if spec else "",
                seed_summary=spec.seed_summary if spec else "", claim=result.verdict.claim, figure=figure,
                key_html=key.to_html(index=False, na_rep="", float_format=lambda v: f"{v:.3g}"),
                evidence=json.dumps({m: v.evidence for m, v in result.verdicts.items()} if len(rows) > 1
                                    else result.verdict.evidence, indent=1, default=str),
                config=json.dumps(result.config), profile=result.config.get("profile"),
                seed=result.config.get("seed"), folder=str(run), per_model=rows if len(rows) > 1 else [],
                environment=describe(manifest.get("environment") or {}))


def build_report(paths: list[str | Path], out_file: str | Path) -> Path:
    runs, failures = _run_dirs([Path(p) for p in paths])
    order = {name: i for i, name in enumerate(STUDIES)}
    sections = sorted((_section(run) for run in runs), key=lambda s: (order.get(s["study"], len(order)), s["anchor"]))
    for fail in failures:
        sections.append(dict(anchor=f"failed-{fail['study']}", study=fail["study"], title=fail["study"],
                             model=fail["model"], status="failed", summary=fail["reason"] or "",
                             seconds=fail.get("seconds"), complete=False, folder="", per_model=[]))
    env = Environment(loader=PackageLoader("lmlab", "templates"), autoescape=select_autoescape(["html"]))
    page = env.get_template("report.html").render(sections=sections)
    out_file = Path(out_file)
    try:
        atomic_write(out_file, page)
    except OSError as exc:
        raise LmlabError(f"cannot write the report to {out_file}: {exc.strerror or exc}") from exc
    return out_file
