"""The `lmlab` command. Every error a user can cause is one sentence and exit code 2, no traceback."""

from __future__ import annotations

import functools
import json
import os
import sys
import time
from pathlib import Path
from typing import Callable, Literal, Optional

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from lmlab.benchmarks import CATALOG as BENCH_CATALOG
from lmlab.errors import LmlabError
from lmlab.files import writable_folder

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
            err.print(f"[bold red]error:[/] {escape(str(exc))}", highlight=False)  # "lmlab[export]" stays
            raise typer.Exit(code=exc.exit_code) from None
        except KeyboardInterrupt:
            err.print("interrupted; run the same command again to resume where it stopped")
            raise typer.Exit(code=130) from None

    return wrapper


def _architectures(markdown: bool) -> None:
    """The shipped table of architectures (and encoders), or its Markdown."""
    from lmlab.models.architectures import counts, markdown as as_markdown, table

    if markdown:
        typer.echo(as_markdown(), nl=False)
        return
    rows = [[name, row["status"], row.get("blocks", ""), row["reason"]] for name, row in table()["types"].items()]
    supported, total = counts()
    out.print(_table(f"architectures: {supported} of {total} supported (transformers {table()['transformers']})",
                     ["model_type", "status", "blocks (a hybrid's kinds)", "what is refused, and why"], rows,
                     keep=("model_type",)))
    encoders = table()["encoders"]
    n = sum(r["status"] == "supported" for r in encoders.values())
    out.print(_table(f"encoders, for the quantize study's classifiers: {n} of {len(encoders)} supported",
                     ["model_type", "status", "what is refused, and why"],
                     [[name, row["status"], row["reason"]] for name, row in encoders.items()],
                     keep=("model_type",)))


def _check_architectures(types: list[str], write: bool, doc: Path | None) -> None:
    """--check TYPE: its conformance checks printed; --write: every type checked and the shipped table (and --doc's
    page) rewritten."""
    from lmlab import conformance

    if doc is not None and not doc.is_file():
        raise LmlabError(f"--doc {doc}: no such file")
    known = set(conformance.causal_types()) | set(conformance.ENCODERS)
    unknown = [t for t in types if t not in known]
    if unknown:
        raise LmlabError(f"--check {unknown[0]}: not a model type transformers registers as a causal LM, nor an "
                         "encoder the quantize study takes (lmlab models --architectures lists them)")
    for model_type in types:
        for kind, got in conformance.check(model_type).items():
            typer.echo(f"{model_type} ({kind}): {got['status']}{': ' + got['reason'] if got['reason'] else ''}")
            for name, failure in got.get("checks", {}).items():
                typer.echo(f"  {name}: {failure or 'ok'}")
    if write:
        conformance.write(doc, echo=lambda line: typer.echo(line))


@app.command()
@friendly
def models(prepare: bool = typer.Option(False, help="de-quantize and cache the embedded models now"),
           architectures: bool = typer.Option(False, "--architectures",
                                              help="every causal-LM architecture transformers registers, and the "
                                                   "encoders the quantize study takes: supported (each "
                                                   "intervention checked on a tiny random instance) or refused, "
                                                   "and why"),
           markdown: bool = typer.Option(False, "--markdown", help="with --architectures: print it as Markdown"),
           check: Optional[list[str]] = typer.Option(None, "--check", help="with --architectures: run every "
                                                     "conformance check on a tiny random instance of this model "
                                                     "type and print each outcome, writing nothing (repeatable)"),
           write: bool = typer.Option(False, "--write", help="with --architectures: run the checks on every type "
                                      "(a few minutes) and rewrite the table lmlab ships"),
           doc: Optional[Path] = typer.Option(None, "--doc", help="with --write: also rewrite the table in this "
                                              "Markdown page, between its <!-- architectures:begin --> and "
                                              "<!-- architectures:end --> marks")):
    """List the embedded, test and cached models (read from their config.json; no weights load)."""
    if check or write or doc:
        if not architectures or (doc and not write):
            raise LmlabError("--check and --write go with --architectures, and --doc with --write")
        _check_architectures(check or [], write, doc)
        return
    if architectures:
        _architectures(markdown)
        return
    from lmlab.models import cache_dir

    rows = _model_rows(prepare)
    out.print(_table(f"models (cache: {cache_dir()})", ["name", "family", "layers", "heads", "kv heads", "source",
                                                       "status"], rows, keep=("name",)))

def _model_rows(prepare: bool) -> list[list[str]]:
    """`lmlab models`' rows: the embedded models (cached, de-quantized now with `prepare`, or missing), the tiny
    test models and the other cached folders."""
    from lmlab.models import EMBEDDED, cache_dir
    from lmlab.models.catalog import TINY_NAMES, TINY_SHAPES, describe_folder
    from lmlab.models.embedded import cached_model_dir, is_cached

    def shape(d: dict) -> list:
        return [d["family"], d["layers"], d["heads"], d["kv_heads"]]

    rows: list[list[str]] = []
    for name, entry in EMBEDDED.items():
        try:
            entry.package_dir()
            ready = (not entry.gguf_file) or is_cached(entry)
            if prepare and not ready:
                from lmlab.models import load_model

                seconds = load_model(name).load_seconds
                ready, status = True, f"cached now ({seconds:.0f}s)"
            else:
                status = "ready"
            if ready:
                folder = entry.package_dir() if not entry.gguf_file else cached_model_dir(name)
                rows.append([name, *shape(describe_folder(folder)), entry.description, status])
            else:
                rows.append([name, "", "", "", "", entry.description, "installed; its first load de-quantizes it, then it is cached"])
        except LmlabError as exc:
            rows.append([name, "", "", "", "", entry.description, f"[red]missing[/]: {exc}"])
    for name in TINY_NAMES:
        rows.append([name, *shape(TINY_SHAPES[name]), "tiny random model for tests", "built in-process"])
    extra = sorted(p.name for p in (cache_dir() / "models").glob("*") if p.is_dir() and p.name not in EMBEDDED) \
        if (cache_dir() / "models").exists() else []
    for name in extra:
        rows.append([name, "", "", "", "", "cached", str(cache_dir() / "models" / name)])
    return rows



@app.command()
@friendly
def trace(prompt: str = typer.Argument("The capital of France is", help="the prompt"),
          target: str = typer.Option(" Paris", help="single-token answer whose probability is traced"),
          span: str = typer.Option("France", help="text in the prompt whose attention is knocked out"),
          model: str = typer.Option("smollm2-135m", help="embedded name, hub id, local directory or .gguf file"),
          out_dir: Optional[Path] = typer.Option(None, "--out", help="also write trace.csv here")):
    """Knock out attention from a span to later tokens in layers 0..k, for every k; print p(target)."""
    from lmlab.files import atomic_write
    from lmlab.models.catalog import check_model_available

    # the inputs that need no model, before torch loads (the target's single token needs the tokenizer: later)
    if not prompt.strip():
        raise LmlabError("the prompt is empty; give the text whose next token is traced, e.g. 'The capital of "
                         "France is'")
    if not target:
        raise LmlabError("--target is empty; give the answer whose probability is traced, e.g. ' Paris'")
    if not span or span not in prompt:
        raise LmlabError(f"--span {span!r} does not occur in the prompt {prompt!r}; give text the prompt contains")
    check_model_available(model)
    from lmlab.models import load_model
    from lmlab.trace import knockout_trace

    lm = load_model(model)
    table = knockout_trace(lm, prompt, target, span)
    rows = [[row.layer, f"{row.p_clean:.3f}", f"{row.p_knockout:.3f}", f"{row.delta_pp:+.1f}"]
            for row in table.itertuples()]
    out.print(_table(f"{lm.name}: p({target!r} | {prompt!r}), knocking out {span!r} -> later tokens in layers 0..k",
                     ["k", "p clean", "p knockout", "ΔP (pp)"], rows, keep=("k",), justify="right"))
    if lm.layout.hybrid:
        from lmlab.models.layout import layer_kinds_text

        out.print(f"{lm.name} is a hybrid ({layer_kinds_text(lm.layout.kinds)}): in its attention blocks the span's "
                  f"attention edges are cut, in the others its tokens are deleted from the mixer's input")
    if out_dir:
        atomic_write(Path(out_dir) / "trace.csv", table.to_csv(index=False))
        out.print(f"wrote {Path(out_dir) / 'trace.csv'}")


@app.command(epilog="Benchmarks (--only NAME):\n\n" + "\n\n".join(f"{name}: {line}"
                                                                   for name, line in BENCH_CATALOG.items()))
@friendly
def bench(only: list[str] = typer.Option(None, help="run only these benchmarks (repeatable; the list below)"),
          model: str = typer.Option("smollm2-135m", help="model to benchmark on"),
          device: str = typer.Option("cpu", help="where the benchmarks that take a device run (replicates, generation, "
                                                 "generation-cache): cpu, "
                                                 "cuda, cuda:N or auto"),
          out_dir: Path = typer.Option(Path("runs/bench"), "--out", help="where bench.json and bench.md go"),
          latent_run: Path = typer.Option(None, help="a finished `lmlab latent` run for latent-vs-cot (default: "
                                                      "run or reuse the quick study under --out)")):
    """Run the benchmarks and print one table of ratios, measured side by side."""
    from lmlab.benchmarks import load_all
    from lmlab.files import atomic_write

    unknown = [n for n in only or [] if n not in BENCH_CATALOG]
    if unknown:
        raise LmlabError(f"unknown benchmark '{unknown[0]}'; known: {', '.join(BENCH_CATALOG)}")
    from lmlab.studies.runtime import resolve_device

    device = resolve_device(device)
    registry = load_all()
    names = only or list(registry)
    rows = []
    for name in names:
        out.print(f"[dim]running {name}...[/]")
        rows.extend(registry[name](model=model, out_dir=out_dir, latent_run=latent_run, device=device))
    cells = [[r["benchmark"], r["case"], "" if r["value"] is None else r["value"], r["unit"], _ratio(r),
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
def reproduce(profile: Literal["demo", "quick", "full"] = typer.Option(
                  "quick", help="demo (a first run: minutes a study on 2 cores, run with --jobs 2), quick (up to about an "
                                "hour a study on 2 cores; the progress table estimates the time left) or full (the "
                                "papers' sizes, a GPU)"),
              out_dir: Path = typer.Option(Path("runs"), "--out", help="root folder of the run directories"),
              seed: int = typer.Option(0, help="random seed for every study"),
              seeds: Optional[int] = typer.Option(None, min=1, help="replicates per cell for every study that draws "
                                                                    "randomness (default: each profile's)"),
              only: list[str] = typer.Option(None, help="run only these studies (repeatable)"),
              model: list[str] = typer.Option(None, help="STUDY=MODEL to replace a study's default model"),
              report: bool = typer.Option(True, help="write OUT/report.html at the end"),
              device: str = typer.Option("auto", help="auto (cuda, then mps, then cpu), cpu, cuda, cuda:N or mps"),
              dtype: Literal["auto", "float32", "bfloat16", "float16"] = typer.Option(
                  "auto", help="inference weights (auto: float32 on cpu, bfloat16 on a GPU); training keeps float32 "
                               "master weights under autocast"),
              jobs: int = typer.Option(1, min=1, help="studies run at once, each in its own process with the CPU threads "
                                               "shared out (make demo: 2)"),
              placebo: bool = typer.Option(False, help="run every study's placebo instead: its treatment replaced by "
                                                       "one that cannot have the paper's effect, judged by the same "
                                                       "claims; the report sets each beside the study's own verdict")):
    """Run every registered study on the embedded defaults, then write the report."""
    writable_folder(out_dir, "--out")  # what needs no model is checked before torch loads
    from lmlab.reproduce import reproduce as run_all
    from lmlab.studies import STUDIES
    from lmlab.studies.runtime import resolve_device

    from lmlab.parallel import is_distributed

    if is_distributed():
        raise LmlabError("lmlab reproduce runs in one process; launch one study at a time instead "
                         "(accelerate launch -m lmlab knockout ...), see docs/scaling.md")
    models = _study_models(model or [])
    resolve_device(device)  # a misspelt device, or one the machine lacks, fails before any study
    _bf16_note(dtype, device)
    settings = {name: {"device": device, "dtype": dtype, **({"seeds": seeds} if seeds and not
                                                             STUDIES[name].config.replicate_refusal else {})}
                for name in STUDIES}
    outcomes = run_all(out_dir, profile, seed, models, only, overrides=settings, say=out.print,
                       progress=functools.partial(_progress_table, profile, time.perf_counter()), jobs=jobs,
                       placebo=placebo)
    _reproduced(outcomes, out_dir, report)


def _reproduced(outcomes: list, out_dir: Path, report: bool) -> None:
    """After `lmlab reproduce`: the report written (unless --no-report), and exit 1 naming each study that failed."""
    if report:
        from lmlab.report import build_report

        path = build_report([out_dir], out_dir / "report.html")
        out.print(f"report: {path}")
    failed = [o for o in outcomes if o.status == "failed"]
    if failed:
        err.print(f"{len(failed)} of {len(outcomes)} studies failed: " + "; ".join(f"{o.study}: {o.reason}" for o in failed))
        raise typer.Exit(code=1)


def _study_models(items: list[str]) -> dict[str, str]:
    """`--model STUDY=MODEL` items as {study: model}, each checked for its form."""
    models = {}
    for item in items:
        study, _, name = item.partition("=")
        if not name:
            raise LmlabError(f"--model takes STUDY=MODEL, got '{item}'")
        models[study] = name
    return models


def _bf16_note(dtype: str, device: str) -> None:
    """One line where a run on a CPU could go faster: float32 (dtype auto) on a CPU that computes bf16 matmuls in
    hardware (AMX, or AVX512-BF16: S2's KD step 2.0x faster under bf16 autocast on such an AMD EPYC) and oneDNN not
    capped below it (ONEDNN_MAX_CPU_ISA), said by the first process of a launch. The default stays float32 on a
    CPU, so that the numbers of one seed compare across CPUs."""
    from lmlab import parallel
    from lmlab.environment import bf16_hardware
    from lmlab.studies.runtime import resolve_device

    if os.environ.get("ONEDNN_MAX_CPU_ISA") or not parallel.is_main():
        return
    found = bf16_hardware()
    if dtype == "auto" and resolve_device(device) == "cpu" and found:
        err.print(f"note: this CPU computes bf16 in hardware ({found[0]}); --dtype bfloat16 trains under bf16 "
                  "autocast, faster a step on such a CPU, with numbers that differ from float32's in rounding "
                  "(docs/install.md)")


def _progress_table(profile: str, started: float, names: list[str], outcomes: list, running: list[str],
                    left: float | None) -> None:
    """The whole run as one table: each study, what its run at this profile can give on a CPU (an answer, or its
    figure and the price of its answer), its state, time and verdict, and the time left."""
    from lmlab.reproduce import expected_seconds
    from lmlab.stats import duration
    from lmlab.studies import STUDIES

    done = {o.study: o for o in outcomes}
    rows = []
    for name in names:
        o = done.get(name)
        expected = expected_seconds(name, profile)
        if o is None:
            state, took, verdict = ("running" if name in running else "waiting"), "", ""
        else:
            state = "reused" if o.resumed else o.status
            took, verdict = duration(o.seconds), (o.verdict or o.reason or "")
        rows.append([STUDIES[name].title, STUDIES[name].answers.get(profile, ""), state, took,
                     duration(expected) if expected else "", verdict])
    elapsed = time.perf_counter() - started  # wall time: with --jobs the studies' own times overlap
    title = f"lmlab reproduce --profile {profile}: {duration(elapsed)} so far" + (
        "" if left is None else f", about {duration(left)} left" if left else ", done")
    out.print(_table(title, ["study", "at this size", "state", "took", "measured", "verdict"], rows,
                     keep=("state",)))


@app.command()
@friendly
def report(run_dirs: list[Path] = typer.Argument(..., help="run folders, or roots holding them"),
           out_file: Path = typer.Option(Path("runs/report.html"), "--out", help="the HTML file to write")):
    """Write one self-contained HTML report of one or more runs."""
    from lmlab.report import build_report

    out.print(f"report: {build_report(run_dirs, out_file)}")


@app.command()
@friendly
def results(run_dirs: Optional[list[Path]] = typer.Argument(None, help="finished run folders, or roots holding "
                                                                    "them (none: the pages made again from the records)"),
            records: Path = typer.Option(Path("runs/results.jsonl"), help="the record of every run read so far "
                                         "(JSON lines; a run read again replaces its own record)"),
            out_file: Path = typer.Option(Path("runs/results.md"), "--out", help="the Markdown page to write"),
            timings: Path = typer.Option(None, help="also update this timings file (lmlab's own: "
                                         "src/lmlab/timings.json, which reproduce reads)"),
            readme: Path = typer.Option(None, help="also write the results table and sample output of this README "
                                        "(between its <!-- results:begin/end --> and <!-- sample:begin/end --> "
                                        "markers) from the records")):
    """Record finished runs and write the results page from every record: each run's verdict, what decided it, its
    time and the machine it ran on; nothing typed in by hand."""
    import shlex

    from lmlab.results import update

    # the run folders by name only: the page is read on other machines, where this one's paths mean nothing
    run_dirs = run_dirs or []
    args = [p.name for p in run_dirs] + ["--records", str(records), "--out", str(out_file)]
    args += (["--timings", str(timings)] if timings else []) + (["--readme", str(readme)] if readme else [])
    command = "lmlab results " + " ".join(shlex.quote(a) for a in args)
    new = update(run_dirs, records, out_file, timings, command, readme)
    out.print(f"results: {len(new)} run(s) recorded in {records}; {out_file}" + (f"; {timings}" if timings else "")
              + (f"; {readme}" if readme else ""))


@app.command()
@friendly
def claims(study: Optional[str] = typer.Argument(None, help="a registered study (none: the list of them)"),
           markdown: bool = typer.Option(False, help="print the Markdown table the study's doc carries")):
    """What a study checks: each claim, its statistic and bar, whose it is (the paper's, with where the paper states
    it, or ours, with why) and whether it decides the verdict or is reported. Without a study: every registered
    study and how many claims of the paper's and of ours it declares."""
    from lmlab.report import claims_markdown, declared_claims
    from lmlab.studies import STUDIES

    if study is None:
        rows = [[name, spec.title, str(sum(c.source == "paper" for c in spec.claims())),
                 str(sum(c.source == "lmlab" for c in spec.claims()))] for name, spec in STUDIES.items()]
        out.print(_table("the registered studies", ["study", "title", "paper's claims", "ours"], rows))
        return
    if markdown:
        print(claims_markdown(study), end="")
        return
    rows = [[c.name, c.bar, c.source, c.where + (f" Bar: {c.bar_note}" if c.bar_note else ""),
             "decisive" if c.decisive else "reported"] for c in declared_claims(study)]
    out.print(_table(f"{study}: the claims", ["claim", "bar", "whose", "where, or why", "decides"], rows,
                     keep=("whose",)))


@app.command()
@friendly
def verdict(run_dirs: list[Path] = typer.Argument(..., help="finished run folders")):
    """Judge finished runs again from their measurements with this lmlab's claims (their sources and bars): the
    tables a study derives from its measurements are made again, then each run's verdict.json and figures rewritten;
    the measured tables stay as they are. Then `lmlab report` shows the new verdicts."""
    from lmlab.render import decided_text
    from lmlab.studies.runner import rejudge

    for folder in run_dirs:
        result = rejudge(folder.expanduser())
        decided = (result.verdict.evidence or {}).get("deciding") or {}
        out.print(f"{folder}: {result.verdict.status}" + (f" ({decided_text(decided)})" if decided else ""),
                  highlight=False)


@app.command()
@friendly
def export(run_dir: Path = typer.Argument(..., help="a quantize run folder (runs/quantize-...)"),
           fmt: str = typer.Option("compressed-tensors", "--format", help="compressed-tensors (the only one so far)"),
           out_dir: Optional[Path] = typer.Option(None, "--out", show_default=False,
                                                  help="where the student folders go (default RUN_DIR/export/FORMAT)")):
    """Write a quantize run's students as Hugging Face folders that transformers loads (compressed-tensors)."""
    from lmlab.export import _check, export_run

    _check(run_dir.expanduser(), fmt)  # before torch
    if out_dir is not None:
        writable_folder(out_dir, "--out")
    rows = export_run(run_dir, fmt, out_dir)
    mib = lambda b: f"{b / 2**20:.2f}"
    out.print(_table(f"{fmt} export of {run_dir.name}", ["student", "bits", "MiB", "packed MiB", "fp32 MiB",
                                                         "vs fp32", "max |logit diff|"],
                     [[r["student"], r["bits"], mib(r["file_bytes"]), mib(r["packed_bytes"]), mib(r["fp32_bytes"]),
                       f"1/{r['fp32_bytes'] / r['file_bytes']:.1f}", f"{r['max_logit_diff']:.1e}"] for r in rows],
                     keep=("student",)))
    out.print("the word embeddings take one byte per entry (transformers cannot load a packed nn.Embedding); "
              f"folders in {Path(rows[0]['folder']).parent}")


@app.command(name="lm-eval", context_settings={"allow_extra_args": True, "ignore_unknown_options": True,
                                               "help_option_names": []})
@friendly
def lm_eval_command(ctx: typer.Context):
    """lm-evaluation-harness's command line with lmlab's model type: lmlab lm-eval --model lmlab --model_args
    model=M,intervention=... --tasks T (every lm_eval argument; lm_eval's own --help)."""
    import importlib.util

    from lmlab.extras import LMEVAL

    if importlib.util.find_spec("lm_eval") is None:
        raise LmlabError(LMEVAL)
    check_lm_eval_model(ctx.args)  # a model that is not there: one sentence before lm_eval and torch load
    from lmlab.lmeval import main as lm_eval_main

    sys.argv = ["lmlab lm-eval", *ctx.args]
    lm_eval_main()


def check_lm_eval_model(args: list[str]) -> None:
    """The model named in lm_eval's --model_args (model=..., for the interventions that load one), checked as a
    study checks --model: an unknown name, a path that is not a model, a hub id with no hub."""
    from lmlab.models.catalog import check_model_available

    text = next((a.split("=", 1)[1] for a in args if a.startswith("--model_args=")), None)
    if text is None and "--model_args" in args and args.index("--model_args") + 1 < len(args):
        text = args[args.index("--model_args") + 1]
    fields = dict(p.split("=", 1) for p in (text or "").split(",") if "=" in p)
    if fields.get("model") and fields.get("intervention", "none") not in ("student", "sparse"):
        check_model_available(fields["model"].strip())


_registered: set[str] = set()


def _option_kind(field) -> tuple[object, str | None]:
    """(type for typer, metavar) of a Config field: a Literal stays (typer shows it as a choice), a list is
    comma-separated text, Optional[X] is X."""
    import types
    import typing

    kind = field.annotation
    if typing.get_origin(kind) in (typing.Union, types.UnionType):  # Optional[X] -> X
        args = [a for a in typing.get_args(kind) if a is not type(None)]
        kind = args[0] if len(args) == 1 else kind
    if typing.get_origin(kind) is typing.Literal:
        return kind, None
    if kind is list or typing.get_origin(kind) is list:
        if _repeatable(field):  # given once per value (a value may hold commas: quantized:2,1)
            return list[str], "TEXT"
        item = (typing.get_args(kind) or (str,))[0]
        return str, {int: "INT,...", float: "FLOAT,...", str: "TEXT,..."}.get(item, "LIST")
    if kind in (int, float, bool, str):
        return kind, None
    return str, None


def _shown_default(spec, name: str, field) -> str | bool:
    """What --help shows as the default: the field's, or the demo/quick/full values from profiles.yaml."""
    from lmlab.studies.config import load_profiles

    def text(value):
        if isinstance(value, list):
            return ",".join(map(str, value))
        return str(value).lower() if isinstance(value, bool) else str(value)

    if name == "model":
        return spec.default_model
    default = field.default_factory() if field.default_factory else field.default
    if default is not None:
        return text(default)
    profiles = load_profiles(spec.config.__module__.rpartition(".")[0])
    names = ("demo", "quick", "full")
    if any(name in profiles[p] for p in names):
        return ", ".join(f"{p} {text(profiles[p].get(name, profiles['quick'].get(name, '-')))}" for p in names)
    return False


def _repeatable(field) -> bool:
    """A list option given once per value (`--variant a --variant b`): its Config field says so."""
    return bool((field.json_schema_extra or {}).get("repeatable")) if isinstance(field.json_schema_extra, dict) else False


def _parse_field(raw, field):
    """CLI value -> a value pydantic accepts: lists are comma-separated (a repeatable option's values arrive as a list
    and stay whole), the rest pydantic coerces."""
    import typing

    if isinstance(raw, (list, tuple)):
        return list(raw)
    kinds = [field.annotation, *typing.get_args(field.annotation)]  # list[int] | None counts as a list
    is_list = any(k is list or typing.get_origin(k) is list for k in kinds)
    return [part.strip() for part in raw.split(",") if part.strip()] if is_list and isinstance(raw, str) else raw


def build_config(spec, given: dict, file: Path | None = None):
    """The study's Config from a --config file (if any) with the given options over it; a bad value is one
    sentence naming the option (or the file's key)."""
    from pydantic import ValidationError

    from lmlab.studies.registry import read_config_file

    from_file = read_config_file(file, spec) if file else {}
    values = {**from_file, **given}
    values.setdefault("model", spec.default_model)
    try:
        return spec.config(**values)
    except ValidationError as exc:
        first = exc.errors()[0]
        name = ".".join(map(str, first["loc"]))
        where = f"{file}: key '{name}'" if name in from_file and name not in given else f"option --{name.replace('_', '-')}"
        raise LmlabError(f"bad {where}: {first['msg'].removeprefix('Value error, ')}") from None


def _study_command(spec):
    """A typer command whose options are the study's Config fields, typed, with their sentence and default."""
    import inspect

    fields = spec.config.model_fields

    def command(out_dir: Path, config: Optional[Path], **values):
        given = {k: _parse_field(v, fields[k]) for k, v in values.items() if v is not None and v != []}
        settings = build_config(spec, given, config)
        settings.check_inputs()  # files, names and model paths: before torch and transformers load
        writable_folder(out_dir, "--out")
        from lmlab.studies import run_study

        _bf16_note(settings.dtype, settings.device)
        result = run_study(spec, settings, out_dir)
        if result is None:  # another process of a launch: rank 0 reports
            return
        from lmlab.render import headline

        decided = headline(result.verdict.status, result.verdict.evidence)
        out.print(f"{spec.title}: [bold]{result.verdict.status}[/]", highlight=False)
        if decided:
            out.print(f"decided by: {decided}", highlight=False)
        out.print(f"the whole verdict: {result.verdict.summary}", highlight=False)
        out.print(f"outputs in {result.path} (lmlab report {result.path} draws it as HTML)", highlight=False)

    kw = inspect.Parameter.KEYWORD_ONLY
    params = [
        inspect.Parameter("out_dir", kw, annotation=Path, default=typer.Option(
            Path("runs"), "--out", help="root folder of run directories")),
        inspect.Parameter("config", kw, annotation=Optional[Path], default=typer.Option(
            None, "--config", metavar="FILE.yaml", show_default=False,
            help="settings from a YAML file (e.g. a run's config.yaml); options given here override it")),
    ]
    for name, field in fields.items():
        kind, metavar = _option_kind(field)
        flag = f"--{name.replace('_', '-')}"
        decls = [f"{flag}/--no-{flag[2:]}"] if kind is bool else [flag]
        extra = {"metavar": metavar} if metavar else {}
        params.append(inspect.Parameter(name, kw, annotation=Optional[kind], default=typer.Option(
            None, *decls, help=field.description or name.replace("_", " "),
            show_default=_shown_default(spec, name, field), **extra)))
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
    """The command line. A bad option or value is one line (`error: ...`) and exit code 2, as every other error."""
    try:  # typer >= 0.2x carries its own copy of click
        from typer._click import exceptions as click_errors
    except ImportError:
        from click import exceptions as click_errors

    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    _register_study_commands()
    args = list(argv if argv is not None else sys.argv[1:]) or ["--help"]
    try:
        try:
            code = typer.main.get_command(app).main(args=args, prog_name="lmlab", standalone_mode=False)
        finally:
            if "torch.distributed" in sys.modules:  # under a launch: leave the process group before exiting
                from lmlab import parallel

                parallel.close()
    except click_errors.UsageError as exc:
        hint = f" (see lmlab {exc.ctx.info_name} --help)" if exc.ctx and exc.ctx.parent else " (see lmlab --help)"
        message = exc.format_message().replace("Value error, ", "").replace("\n", " ")
        err.print(f"[bold red]error:[/] {escape(message + hint)}", highlight=False)
        code = 2
    except typer.Abort:
        err.print("interrupted")
        code = 130
    except click_errors.ClickException as exc:
        err.print(f"[bold red]error:[/] {escape(exc.format_message())}", highlight=False)
        code = exc.exit_code
    if code:
        raise SystemExit(code)


if __name__ == "__main__":
    main()
