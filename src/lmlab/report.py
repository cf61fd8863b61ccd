"""`lmlab report RUN_DIR...`: one self-contained HTML file (figures inlined, no network needed).

At the top, a table of one line per study (and per model of a several-model run): its verdict, the claim that decided
it with its 95% interval (or the gate that kept it open), and its run time. Then, per study:
the paper's figure as described (seed) next to ours, the verdict with its numbers, the key rows, the
model, data and configuration, and the run time. A study recorded as failed by `lmlab reproduce` is
shown with its one-line reason. The page comes from a jinja2 template with autoescaping on.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path

from jinja2 import Environment, PackageLoader, select_autoescape

from lmlab.render import headline
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
        for summary in (path / "reproduce.json", path / "placebo.json"):
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
    key = result.report_rows()
    rows = [dict(model=m, status=v.status, summary=v.summary, headline=headline(v.status, v.evidence))
            for m, v in result.verdicts.items()]
    placebo = result.config.placebo
    title = (spec.title if spec else study) + (" · placebo" if placebo else "")
    return dict(anchor=run.name, study=study, title=title, placebo=placebo, model=", ".join(result.models),
                status=result.verdict.status, summary=result.verdict.summary, seconds=result.seconds, complete=True,
                headline=headline(result.verdict.status, result.verdict.evidence),
                paper=spec.paper if spec else "", citation=spec.citation if spec else "",
                paper_figure=spec.paper_figure if spec else "", claim=result.verdict.claim, figure=figure,
                key_html=key.to_html(index=False, na_rep="", float_format=lambda v: f"{v:.3g}"),
                evidence=json.dumps({m: v.evidence for m, v in result.verdicts.items()} if len(rows) > 1
                                    else result.verdict.evidence, indent=1, default=str),
                forests=[dict(model=m, png=forest_png(v.evidence.get("claims", [])),
                              gates=v.evidence.get("gates", [])) for m, v in result.verdicts.items()],
                config=json.dumps(result.config.identity()), profile=result.config.profile,
                seed=result.config.seed, folder=str(run), per_model=rows if len(rows) > 1 else [],
                environment=describe(manifest.get("environment") or {}))


DECISION_COLORS = {"yes": "#2e7d32", "no": "#c62828", "open": "#b58900"}


def declared_claims(study: str) -> list:
    """The claims a study declares (its spec's claims): name, statistic, bar, whose, where, decisive."""
    if study not in STUDIES:
        raise LmlabError(f"no study '{study}'; the studies: {', '.join(STUDIES)}")
    return list(STUDIES[study].claims())


def claims_markdown(study: str) -> str:
    """A study's declared claims as a Markdown table (the study's doc carries it; a test keeps the two equal)."""
    lines = ["| claim | statistic | bar | whose | where the paper states it, or why it is ours | decides |",
             "|---|---|---|---|---|---|"]
    for c in declared_claims(study):
        where = c.where + (f" Bar: {c.bar_note}" if c.bar_note else "")
        lines.append(f"| {c.name} | {c.statistic} | {c.bar} | {c.source} | {where} | "
                     f"{'decisive' if c.decisive else 'reported'} |")
    return "\n".join(lines) + "\n"


def layout_markdown() -> str:
    """The package's layout as a Markdown table (docs/usage.md carries it; a test keeps the two equal): every module
    and package under lmlab, and every study's package, with the first sentence of its docstring."""
    import ast
    import re

    root = Path(__file__).resolve().parent

    def first_sentence(path: Path) -> str:
        doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))) or ""
        paragraph = " ".join(doc.split("\n\n")[0].split())
        return re.split(r"(?<=[.?])\s", paragraph)[0].replace("|", "\\|")

    entries = [(p.name, p) for p in sorted(root.glob("*.py")) if p.name not in ("__init__.py", "__main__.py")]
    entries += [(f"{p.parent.name}/", p) for p in sorted(root.glob("*/__init__.py"))]
    entries += [(f"studies/{p.parent.name}/", p) for p in sorted((root / "studies").glob("*/__init__.py"))]
    lines = ["| in src/lmlab/ | what it holds |", "|---|---|"]
    lines += [f"| `{name}` | {first_sentence(path)} |" for name, path in sorted(entries, key=lambda e: e[0])]
    return "\n".join(lines) + "\n"


def forest_png(claims: list[dict]) -> str:
    """The verdict's claims as a forest plot, one row each on its own scale: the estimate (a dot, coloured by the
    decision), its 95% interval over replicates and items, the bar it is checked against (dashed, the side the
    claim needs shaded), and its size: replicates x items, and what would decide it. Base64 PNG ("" without
    claims)."""
    if not claims:
        return ""
    import io

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(claims), 1, figsize=(9.5, 0.62 * len(claims) + 0.5), squeeze=False)
    for ax, c in zip(axes[:, 0], claims):
        _forest_row(ax, c)
    fig.tight_layout(h_pad=0.4)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    plt.close(fig)
    return base64.b64encode(buf.getvalue()).decode()


def _forest_row(ax, c: dict) -> None:
    """One claim's row of the forest plot, on its own scale."""
    scale = float(c.get("scale", 1.0) or 1.0)
    est, low, high = (scale * float(c[k]) if c.get(k) is not None else float("nan")
                      for k in ("estimate", "low", "high"))
    bar = scale * float(c["bar"]["value"])
    points = [v for v in (est, low, high, bar) if v == v] + [scale * float(x) for x in c.get("replicate_estimates", [])
                                                           if x == x]
    span = (max(points) - min(points)) or 1.0
    left, right = min(points) - 0.15 * span, max(points) + 0.15 * span
    color = DECISION_COLORS.get(c.get("decision"), "grey")
    side = (bar, right) if c["bar"]["direction"] == ">=" else (left, bar)
    ax.axvspan(*side, color="#e8f5e9", zorder=0)
    ax.axvline(bar, color="black", linestyle="--", lw=1)
    if low == low and high == high:
        ax.hlines(0, low, high, color=color, lw=2.5)
    for x in c.get("replicate_estimates", []):
        if x == x:
            ax.plot(scale * float(x), 0, "|", color=color, ms=9, alpha=0.6)
    ax.plot(est, 0, "o", color=color, ms=7)
    ax.set_xlim(left, right)
    ax.set_yticks([])
    for spine in ("left", "right", "top"):
        ax.spines[spine].set_visible(False)
    ax.tick_params(axis="x", labelsize=7)
    name = c["name"] + (f" ({c['group']})" if c.get("group") else "")
    ax.set_title(name, loc="left", fontsize=8, pad=2)
    size = f"{c.get('replicates', 1)} x {int(c.get('n', 0)):,} {c.get('n_unit', 'items')}"
    decides = (c.get("decides_at") or {}).get("text")
    label = ("reported only" if c.get("reported") else c.get("decision", "")) + f"; {size}" + (
        f"; decides at {decides}" if decides and c.get("decision") == "open" else "")
    ax.text(1.0, 1.02, label, transform=ax.transAxes, ha="right", va="bottom", fontsize=7, color=color)


def _beside_placebos(sections: list[dict]) -> None:
    """Each study's verdict gets its placebo's (the same study, model, profile and seed run with --placebo) beside
    it, where both ran; such a placebo keeps its section but not a row of its own in the verdicts table."""
    same = lambda s: (s["study"], s.get("model"), s.get("profile"), s.get("seed"))  # noqa: E731
    placebos = {same(s): s for s in sections if s.get("complete") and s.get("placebo")}
    for s in sections:
        p = placebos.get(same(s)) if s.get("complete") and not s.get("placebo") else None
        if p is not None:
            s["placebo_status"], s["placebo_anchor"] = p["status"], p["anchor"]
            p["beside"] = True


def build_report(paths: list[str | Path], out_file: str | Path) -> Path:
    runs, failures = _run_dirs([Path(p) for p in paths])
    order = {name: i for i, name in enumerate(STUDIES)}
    sections = sorted((_section(run) for run in runs),
                      key=lambda s: (order.get(s["study"], len(order)), bool(s.get("placebo")), s["anchor"]))
    _beside_placebos(sections)
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
