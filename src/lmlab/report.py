"""`lmlab report RUN_DIR...`: one self-contained HTML file (figures inlined, no network needed).

At the top, a table of the verdicts. Then, per study: the paper's figure as described (seed) next to
ours, the verdict with its numbers, the table's key rows, the model, data and configuration, and the
run time. A study recorded as failed by `lmlab reproduce` is shown with its one-line reason.
"""

from __future__ import annotations

import base64
import html
import json
from pathlib import Path

import pandas as pd
import yaml

from lmlab.errors import LmlabError
from lmlab.runs import atomic_write
from lmlab.studies import STUDIES

CSS = """
body{font-family:system-ui,sans-serif;max-width:1180px;margin:2em auto;padding:0 1em;color:#222}
h1{font-size:1.6em} h2{border-top:1px solid #ccc;padding-top:1em} table{border-collapse:collapse;font-size:.85em}
td,th{border:1px solid #ddd;padding:3px 7px;text-align:right} th{background:#f4f4f4} td:first-child{text-align:left}
.v{font-weight:600;padding:2px 8px;border-radius:4px} .reproduced{background:#d4f4d4} .notreproduced{background:#f8d7d7}
.inconclusive{background:#fcefc7} .failed{background:#ddd} .cols{display:flex;gap:1.5em;align-items:flex-start}
.seed{flex:1;background:#f8f8f8;padding:.8em;border-left:3px solid #888} .ours{flex:2} img{max-width:100%}
pre{background:#f8f8f8;padding:.6em;font-size:.78em;overflow-x:auto;max-height:22em}
"""


def _seconds(value) -> str:
    return "" if value is None else f"{float(value):.0f} s"


def _badge(status: str) -> str:
    return f'<span class="v {status.replace(" ", "")}">{html.escape(status)}</span>'


def _run_dirs(paths: list[Path]) -> tuple[list[Path], list[dict]]:
    """Expand roots into study run folders (those with a manifest or config), plus failures recorded by reproduce."""
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
    if not runs and not failures:
        raise LmlabError(f"no study runs found under {', '.join(map(str, paths))}")
    return runs, failures


def _section(run: Path) -> tuple[dict, str]:
    config = yaml.safe_load((run / "config.yaml").read_text())
    manifest = json.loads((run / "manifest.json").read_text()) if (run / "manifest.json").exists() else {}
    # the folder is STUDY-MODEL-HASH and study names have dashes too: the longest registered prefix wins
    prefixes = [name for name in STUDIES if run.name.startswith(name + "-")]
    study = manifest.get("study") or (max(prefixes, key=len) if prefixes else run.name.split("-")[0])
    spec = STUDIES.get(study)
    if not manifest or not (run / "verdict.json").exists():
        row = dict(study=study, model=config.get("model"), status="incomplete", summary="run did not finish",
                   seconds=None, anchor=run.name)
        return row, f'<h2 id="{run.name}">{html.escape(study)}: incomplete</h2><p>{html.escape(str(run))} has no verdict yet.</p>'
    verdict = json.loads((run / "verdict.json").read_text())
    table = pd.read_csv(run / "table.csv", low_memory=False)
    key = spec.summary(table) if spec and spec.summary else table.head(20)
    figure = base64.b64encode((run / "figure.png").read_bytes()).decode() if (run / "figure.png").exists() else ""
    title = spec.title if spec else study
    row = dict(study=title, model=config.get("model"), status=verdict["status"], summary=verdict["summary"],
               seconds=manifest.get("run_seconds", manifest.get("seconds")), anchor=run.name)
    evidence = json.dumps(verdict.get("evidence", {}), indent=1, default=str)
    body = f"""
<h2 id="{run.name}">{html.escape(title)} {_badge(verdict['status'])}</h2>
<p><b>Paper:</b> {html.escape(spec.paper if spec else '')}. <b>Claim checked:</b> {html.escape(verdict['claim'])}</p>
<p><b>Result:</b> {html.escape(verdict['summary'])}</p>
<div class="cols"><div class="seed"><b>The paper's figure</b> (seed {html.escape(spec.seed_file if spec else '')}):
<p>{html.escape(spec.seed_summary if spec else '')}</p></div>
<div class="ours"><b>Ours</b> ({html.escape(str(config.get('model')))}, profile {html.escape(str(config.get('profile')))},
seed {config.get('seed')}):<br><img alt="{html.escape(title)} figure" src="data:image/png;base64,{figure}"></div></div>
<h3>Key rows</h3>{key.to_html(index=False, na_rep="", float_format=lambda v: f"{v:.3g}")}
<h3>Numbers behind the verdict</h3><pre>{html.escape(evidence)}</pre>
<p><b>Configuration:</b> <code>{html.escape(json.dumps(config))}</code><br><b>Run time:</b> {row['seconds']} s.
<b>Folder:</b> <code>{html.escape(str(run))}</code></p>"""
    return row, body


def build_report(paths: list[str | Path], out_file: str | Path) -> Path:
    runs, failures = _run_dirs([Path(p) for p in paths])
    order = {name: i for i, name in enumerate(STUDIES)}
    runs.sort(key=lambda r: (order.get(r.name.split("-")[0], len(order)), r.name))
    rows, bodies = [], []
    for run in runs:
        row, body = _section(run)
        rows.append(row)
        bodies.append(body)
    for fail in failures:
        rows.append(dict(study=fail["study"], model=fail["model"], status="failed", summary=fail["reason"],
                         seconds=fail.get("seconds"), anchor=f"failed-{fail['study']}"))
        bodies.append(f'<h2 id="failed-{fail["study"]}">{html.escape(fail["study"])} {_badge("failed")}</h2>'
                      f'<p>{html.escape(fail["reason"] or "")}</p>')
    summary = "".join(
        f'<tr><td><a href="#{r["anchor"]}">{html.escape(str(r["study"]))}</a></td><td>{html.escape(str(r["model"]))}</td>'
        f'<td>{_badge(r["status"])}</td><td style="text-align:left">{html.escape(str(r["summary"]))}</td>'
        f'<td>{_seconds(r["seconds"])}</td></tr>' for r in rows)
    page = f"""<!doctype html><html><head><meta charset="utf-8"><title>lmlab report</title><style>{CSS}</style></head>
<body><h1>lmlab report</h1><p>Each study restates its paper's claim as a check on our table: reproduced, not
reproduced, or inconclusive, with 95% intervals. Small embedded models on CPU: an honest "not reproduced" is a
result.</p><table><tr><th>study</th><th>model</th><th>verdict</th><th>summary</th><th>run time</th></tr>{summary}</table>
{''.join(bodies)}</body></html>"""
    out_file = Path(out_file)
    try:
        atomic_write(out_file, page)
    except OSError as exc:
        raise LmlabError(f"cannot write the report to {out_file}: {exc.strerror or exc}") from exc
    return out_file
