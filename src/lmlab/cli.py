"""The `lmlab` command. Every error a user can cause is one sentence and exit code 2, no traceback."""

from __future__ import annotations

import functools
import json
import os
import sys
from pathlib import Path
from typing import Callable, Optional

import typer
from rich.console import Console
from rich.table import Table

from lmlab.errors import LmlabError

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="lmlab: dissect and compress transformer language models; five published studies, one CLI.")
out = Console()
err = Console(stderr=True, soft_wrap=True)  # an error stays one line


def _table(title: str, columns: list[str], rows: list[list[str]], keep: tuple[str, ...] = (), **column) -> Table:
    """A table that never truncates: the `keep` columns (names, ids) are as wide as their longest cell and
    never break; the others wrap, and a word too long for its column folds onto the next line instead of
    ending in an ellipsis."""
    table = Table(title=title)
    for i, col in enumerate(columns):
        if col in keep:
            width = max([len(col)] + [len(str(r[i])) for r in rows])
            table.add_column(col, no_wrap=True, min_width=width, overflow="fold", **column)
        else:
            table.add_column(col, overflow="fold", **column)
    for r in rows:
        table.add_row(*map(str, r))
    return table


def friendly(fn: Callable) -> Callable:
    """Turn an LmlabError into `error: <sentence>` on stderr and exit code 2."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except LmlabError as exc:
            err.print(f"[bold red]error:[/] {exc}", highlight=False)
            raise typer.Exit(code=exc.exit_code) from None
        except KeyboardInterrupt:
            err.print("interrupted; run the same command again to resume where it stopped")
            raise typer.Exit(code=130) from None

    return wrapper


@app.command()
@friendly
def models(prepare: bool = typer.Option(False, help="de-quantize and cache the embedded models now")):
    """List the embedded, test and cached models."""
    from lmlab.models import EMBEDDED, cache_dir, load_model
    from lmlab.models.embedded import is_cached
    from lmlab.models.tiny import TINY_NAMES

    rows: list[list[str]] = []
    for name, entry in EMBEDDED.items():
        try:
            entry.package_dir()
            ready = (not entry.gguf_file) or is_cached(entry)
            if prepare or ready:
                lm = load_model(name)
                d = lm.layout.describe()
                status = "ready" if ready else f"cached now ({lm.load_seconds:.0f}s)"
                rows.append([name, d["family"], d["layers"], d["heads"], d["kv_heads"], entry.description, status])
            else:
                rows.append([name, "", "", "", "", entry.description, "installed; first load de-quantizes (~20 s)"])
        except LmlabError as exc:
            rows.append([name, "", "", "", "", entry.description, f"[red]missing[/]: {exc}"])
    for name in TINY_NAMES:
        d = load_model(name).layout.describe()
        rows.append([name, d["family"], d["layers"], d["heads"], d["kv_heads"], "tiny random model for tests",
                     "built in-process"])
    extra = sorted(p.name for p in (cache_dir() / "models").glob("*") if p.is_dir() and p.name not in EMBEDDED) \
        if (cache_dir() / "models").exists() else []
    for name in extra:
        rows.append([name, "", "", "", "", "cached", str(cache_dir() / "models" / name)])
    out.print(_table(f"models (cache: {cache_dir()})", ["name", "family", "layers", "heads", "kv heads", "source",
                                                       "status"], rows, keep=("name",)))


@app.command()
@friendly
def trace(prompt: str = typer.Argument("The capital of France is", help="the prompt"),
          target: str = typer.Option(" Paris", help="single-token answer whose probability is traced"),
          span: str = typer.Option("France", help="text in the prompt whose attention is knocked out"),
          model: str = typer.Option("smollm2-135m", help="embedded name, hub id, local directory or .gguf file"),
          out_dir: Optional[Path] = typer.Option(None, "--out", help="also write trace.csv here")):
    """Knock out attention from a span to later tokens in layers 0..k, for every k; print p(target)."""
    from lmlab.models import load_model
    from lmlab.files import atomic_write
    from lmlab.trace import knockout_trace

    lm = load_model(model)
    table = knockout_trace(lm, prompt, target, span)
    rows = [[row.layer, f"{row.p_clean:.3f}", f"{row.p_knockout:.3f}", f"{row.delta_pp:+.1f}"]
            for row in table.itertuples()]
    out.print(_table(f"{lm.name}: p({target!r} | {prompt!r}), knocking out {span!r} -> later tokens in layers 0..k",
                     ["k", "p clean", "p knockout", "ΔP (pp)"], rows, keep=("k",), justify="right"))
    if out_dir:
        atomic_write(Path(out_dir) / "trace.csv", table.to_csv(index=False))
        out.print(f"wrote {Path(out_dir) / 'trace.csv'}")


@app.command()
@friendly
def bench(only: list[str] = typer.Option(None, help="run only these benchmarks (repeatable)"),
          model: str = typer.Option("smollm2-135m", help="model to benchmark on"),
          out_dir: Path = typer.Option(Path("runs/bench"), "--out", help="where bench.json and bench.md go"),
          latent_run: Path = typer.Option(None, help="a finished `lmlab latent` run for latent-vs-cot (default: "
                                                      "run or reuse the quick study under --out)")):
    """Run the benchmarks and print one table of ratios, measured side by side."""
    from lmlab.benchmarks import load_all
    from lmlab.files import atomic_write

    registry = load_all()
    names = only or list(registry)
    unknown = [n for n in names if n not in registry]
    if unknown:
        raise LmlabError(f"unknown benchmark '{unknown[0]}'; known: {', '.join(registry)}")
    rows = []
    for name in names:
        out.print(f"[dim]running {name}...[/]")
        rows.extend(registry[name](model=model, out_dir=out_dir, latent_run=latent_run))
    cells = [[r["benchmark"], r["case"], r["value"], r["unit"], _ratio(r),
              r.get("note") or ("" if r.get("target") is None else f"≤ {r['target']}x")] for r in rows]
    out.print(_table("lmlab bench", ["benchmark", "case", "value", "unit", "ratio", "target"], cells,
                     keep=("benchmark", "value")))
    md = ["| benchmark | case | value | unit | ratio | target | setup |", "|---|---|---|---|---|---|---|"]
    md += [f"| {r['benchmark']} | {r['case']} | {r['value']} | {r['unit']} | {_ratio(r)} | "
           f"{r.get('note') or ('' if r.get('target') is None else '≤ ' + str(r['target']) + 'x')} | "
           f"{r.get('setup', '')} |" for r in rows]
    atomic_write(out_dir / "bench.json", json.dumps(rows, indent=2))
    atomic_write(out_dir / "bench.md", "\n".join(md) + "\n")
    out.print(f"wrote {out_dir / 'bench.json'} and {out_dir / 'bench.md'}")


def _ratio(row: dict) -> str:
    return "" if row.get("ratio") is None else f"{row['ratio']}x"


@app.command()
@friendly
def reproduce(profile: str = typer.Option("quick", help="quick (CPU minutes) or full"),
              out_dir: Path = typer.Option(Path("runs"), "--out", help="root folder of the run directories"),
              seed: int = typer.Option(0, help="random seed for every study"),
              only: list[str] = typer.Option(None, help="run only these studies (repeatable)"),
              model: list[str] = typer.Option(None, help="STUDY=MODEL to replace a study's default model"),
              report: bool = typer.Option(True, help="write OUT/report.html at the end")):
    """Run every registered study on the embedded defaults, then write the report."""
    from lmlab.reproduce import reproduce as run_all

    models = {}
    for item in model or []:
        study, _, name = item.partition("=")
        if not name:
            raise LmlabError(f"--model takes STUDY=MODEL, got '{item}'")
        models[study] = name
    outcomes = run_all(out_dir, profile, seed, models, only, say=out.print)
    if report:
        from lmlab.report import build_report

        path = build_report([out_dir], out_dir / "report.html")
        out.print(f"report: {path}")
    failed = [o for o in outcomes if o.status == "failed"]
    if failed:
        err.print(f"{len(failed)} of {len(outcomes)} studies failed: " + "; ".join(f"{o.study}: {o.reason}" for o in failed))
        raise typer.Exit(code=1)


@app.command()
@friendly
def report(run_dirs: list[Path] = typer.Argument(..., help="run folders, or roots holding them"),
           out_file: Path = typer.Option(Path("runs/report.html"), "--out", help="the HTML file to write")):
    """Write one self-contained HTML report of one or more runs."""
    from lmlab.report import build_report

    out.print(f"report: {build_report(run_dirs, out_file)}")


_registered: set[str] = set()
_COMMON = ("model", "profile", "seed")


def _parse_field(raw: str, field):
    """CLI text -> a value pydantic accepts: lists are comma-separated, the rest pydantic coerces."""
    import typing

    kinds = [field.annotation, *typing.get_args(field.annotation)]  # list[int] | None counts as a list
    is_list = any(k is list or typing.get_origin(k) is list for k in kinds)
    return [part.strip() for part in raw.split(",") if part.strip()] if is_list else raw


def _study_command(spec):
    """A typer command whose options are the study's Config fields (every knob is on the command line)."""
    import inspect

    from pydantic import ValidationError

    extra = {n: f for n, f in spec.config.model_fields.items() if n not in _COMMON}

    def command(model: str, profile: str, seed: int, out_dir: Path, **values):
        try:
            given = {k: _parse_field(v, extra[k]) for k, v in values.items() if v is not None}
            config = spec.config(model=model, profile=profile, seed=seed, **given)
        except ValidationError as exc:
            first = exc.errors()[0]
            raise LmlabError(f"bad option --{'.'.join(map(str, first['loc'])).replace('_', '-')}: {first['msg']}") from None
        from lmlab.studies import run_study

        result = run_study(spec, config, out_dir)
        out.print(f"{spec.title}: [bold]{result.verdict.status}[/] — {result.verdict.summary}")
        out.print(f"outputs in {result.path}")

    kw = inspect.Parameter.KEYWORD_ONLY
    params = [
        inspect.Parameter("model", kw, annotation=str, default=typer.Option(
            spec.default_model, help="embedded name, hub id, local directory or .gguf file")),
        inspect.Parameter("profile", kw, annotation=str, default=typer.Option("quick", help="quick (CPU minutes) or full")),
        inspect.Parameter("seed", kw, annotation=int, default=typer.Option(0, help="the same seed gives the same table")),
        inspect.Parameter("out_dir", kw, annotation=Path, default=typer.Option(Path("runs"), "--out",
                                                                               help="root folder of run directories")),
    ]
    for name, field in extra.items():
        default = field.default_factory() if field.default_factory else field.default
        shown = ",".join(map(str, default)) if isinstance(default, list) else default
        params.append(inspect.Parameter(name, kw, annotation=Optional[str], default=typer.Option(
            None, f"--{name.replace('_', '-')}", help=f"{field.description or name} (default: {shown})")))
    command.__signature__ = inspect.Signature(params)
    command.__doc__ = f"{spec.title} ({spec.paper})"
    return command


def _register_study_commands() -> None:
    """One command per registered study (the registry is the only list of studies)."""
    from lmlab.studies import STUDIES

    for name, spec in STUDIES.items():
        if name not in _registered:
            _registered.add(name)
            app.command(name=name.replace("_", "-"))(friendly(_study_command(spec)))


def main(argv: list[str] | None = None) -> None:
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    _register_study_commands()
    app(args=argv if argv is not None else sys.argv[1:], prog_name="lmlab")


if __name__ == "__main__":
    main()
