"""How fast a bad input fails: each error class that needs no model, as `lmlab` on the command line, timed by
the clock (wall seconds for the whole process, Python's start included). Aim: under 1 s each; the error is
raised before torch and transformers load (tests/test_cli.py checks the sentences and that torch stays out)."""

from __future__ import annotations

import subprocess
import sys
import tempfile
import time
from pathlib import Path

from lmlab.benchmarks.registry import benchmark


def bad_inputs(folder: Path) -> list[tuple[str, list[str]]]:
    """(error class, lmlab arguments) for every input error that needs no model."""
    (folder / "bad.jsonl").write_text('{"question": "q", "answers": ["a"]}\nnot json\n')
    (folder / "not-a-model").mkdir(exist_ok=True)
    (folder / "no-weights").mkdir(exist_ok=True)
    (folder / "no-weights" / "config.json").write_text('{"model_type": "llama"}')
    (folder / "renamed.gguf").write_bytes(b"PK\x03\x04" + bytes(60))  # a zip file named .gguf
    (folder / "damaged").mkdir(exist_ok=True)  # a model.safetensors cut short: its header promises 40 bytes, 8 follow
    (folder / "damaged" / "config.json").write_text('{"model_type": "llama"}')
    header = b'{"w": {"dtype": "F32", "shape": [10], "data_offsets": [0, 40]}}'
    (folder / "damaged" / "model.safetensors").write_bytes(len(header).to_bytes(8, "little") + header + bytes(8))
    return [("missing data file", ["knockout", "--datasets", f"popqa:{folder / 'missing.jsonl'}"]),
            ("a line that is not JSON", ["knockout", "--datasets", f"popqa:{folder / 'bad.jsonl'}"]),
            ("a malformed GSM8K row", ["filler", "--benchmark", f"gsm8k:{folder / 'bad.jsonl'}"]),
            ("--bits 3", ["quantize", "--bits", "3"]),
            ("--rates 0", ["latent", "--rates", "0"]),
            ("unknown task", ["sparse-circuits", "--tasks", "nope"]),
            ("a folder that is not a model", ["knockout", "--model", str(folder / "not-a-model")]),
            ("no such model path", ["knockout", "--model", str(folder / "nothere")]),
            ("unknown model name", ["knockout", "--model", "no-such-model"]),
            ("a model folder without weights", ["knockout", "--model", str(folder / "no-weights")]),
            ("a .gguf that is not GGUF", ["knockout", "--model", str(folder / "renamed.gguf")]),
            ("--max-memory not a size", ["knockout", "--device-map", "auto", "--max-memory", "cpu=lots"]),
            ("--offload on a file", ["knockout", "--device-map", "auto", "--offload", str(folder / "bad.jsonl")]),
            ("--jobs below 1", ["reproduce", "--jobs", "-1"]),
            ("--out that cannot be made", ["knockout", "--out", str(folder / "bad.jsonl" / "runs")]),
            ("reproduce --out that cannot be made", ["reproduce", "--out", str(folder / "bad.jsonl" / "runs")]),
            ("unknown tracker", ["quantize", "--log-with", "tensorbored"]),
            ("export of a folder that is not a quantize run", ["export", str(folder / "not-a-model")]),
            ("a model folder with damaged weights", ["knockout", "--model", str(folder / "damaged")]),
            ("trace of an empty prompt", ["trace", "", "--target", " Paris", "--span", "France"]),
            ("trace of a span not in the prompt", ["trace", "The capital of Spain is", "--span", "France"]),
            ("lm-eval of a model that is not there", ["lm-eval", "--model", "lmlab", "--model_args",
                                                      "model=no/such-model", "--tasks", "hellaswag"])]


def with_out(args: list[str], folder: Path) -> list[str]:
    """The arguments with an --out under `folder` unless the case names its own."""
    return args if "--out" in args else [*args, "--out", str(folder / "runs")]


@benchmark("bad-input")
def bad_input_bench(repeats: int = 3, **_) -> list[dict]:
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        for case, args in bad_inputs(folder):
            times, code = [], None
            for _ in range(repeats):
                t0 = time.perf_counter()
                done = subprocess.run([sys.executable, "-m", "lmlab", *with_out(args, folder)],
                                      capture_output=True, text=True)
                times.append(time.perf_counter() - t0)
                code = done.returncode
            rows.append(dict(benchmark="bad-input", case=case, value=round(min(times), 2), unit="s to the error",
                             ratio=None, target=None, note="aim < 1 s",
                             setup=f"exit {code}: {done.stderr.strip().splitlines()[-1][:90] if done.stderr else ''}"))
    return rows
