"""Small helpers shared by the study tests."""

import importlib.util

import pytest
import torch

# (atol, rtol) per dtype for a quantity of scale 1: float32 the atol most tests here use with torch.allclose's rtol;
# bf16 and fp16 torch.testing's rtol, and an atol as large (two bf16 computations of a logit near 0 differ by ~1e-2)
TOLERANCE = {torch.float64: (1e-7, 1e-7), torch.float32: (1e-5, 1e-5), torch.bfloat16: (1.6e-2, 1.6e-2),
             torch.float16: (1e-3, 1e-3)}


def tolerance(dtype: torch.dtype, scale: float = 1.0) -> dict:
    """{"atol", "rtol"} for values of typical magnitude `scale` computed in `dtype`."""
    atol, rtol = TOLERANCE[dtype]
    return {"atol": atol * max(float(scale), 1e-12), "rtol": rtol}


def interrupt_on_call(monkeypatch, module, name: str, n: int, exc: type[BaseException] = KeyboardInterrupt):
    """Replace module.name by a wrapper that raises `exc` on its n-th call (a run killed mid-way)."""
    real = getattr(module, name)
    calls = {"n": 0}

    def wrapper(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == n:
            raise exc()
        return real(*args, **kwargs)

    monkeypatch.setattr(module, name, wrapper)
    return real


def launch_env() -> dict:
    """The environment of a test's own lmlab processes (a one-process reference beside a two-process launch): one
    torch thread each, and no GPU. They check how processes share a study's work, over gloo on the CPU, where a
    machine of any kind can launch two; two processes on one GPU would share it (NCCL refuses that), and several
    GPUs are not what CI or the GPU check has."""
    import os

    return {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}


def run_at_once(commands: list[list[str]], env: dict, timeout: float = 600) -> list:
    """Run the commands as processes side by side (a one-process reference beside a two-process launch: with one
    thread each they share the machine's cores instead of waiting for each other); each one's (returncode,
    stdout, stderr), in order. A command still running at `timeout` is killed and fails."""
    import subprocess
    from types import SimpleNamespace

    procs = [subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for cmd in commands]
    out = []
    for proc in procs:
        try:
            stdout, stderr = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            stdout, stderr = proc.communicate()
        out.append(SimpleNamespace(returncode=proc.returncode, stdout=stdout, stderr=stderr))
    return out


def _least_precise(*dtypes: torch.dtype) -> torch.dtype:
    return max(dtypes, key=lambda d: TOLERANCE.get(d, TOLERANCE[torch.float32])[0])


def near(got: torch.Tensor, expected: torch.Tensor, atol: float = 1e-5, rtol: float = 1e-5,
         dtype: torch.dtype | None = None) -> bool:
    """torch.allclose with the tolerances a test states for float32. Where the values were computed in a lower
    precision (`dtype`, else the least precise of the two tensors'), that dtype's instead: TOLERANCE times the
    quantity's scale (the largest |expected|), as a float32 tolerance of 1e-6 is below one bf16 step. Compared in
    float32 on the tensors' own device (a reference is computed on the device of what it checks: two devices are an
    error here, as everywhere)."""
    dtype = dtype or _least_precise(got.dtype, expected.dtype)
    if TOLERANCE[dtype][0] > TOLERANCE[torch.float32][0]:
        scale = float(expected.detach().abs().max()) if expected.numel() else 1.0
        atol, rtol = TOLERANCE[dtype][0] * scale, TOLERANCE[dtype][1]
    return torch.allclose(got.float(), expected.float(), atol=atol, rtol=rtol)


def max_diff(got: torch.Tensor, expected: torch.Tensor) -> float:
    return float((got.float() - expected.float()).abs().max())


def check_declared_columns(result) -> None:
    """Every non-empty table a study's run hands to its analysis is declared in the study's tables (its spec's
    `tables`: the analysis' COLUMNS) and carries every column declared there: a column renamed on one side fails
    here, not in a verdict."""
    from lmlab.studies import STUDIES

    declared = STUDIES[result.study].tables()
    tables = {name: t for name, t in result.tables.items() if len(t)}
    undeclared = {name: [c for c in t.columns if c != "model"] for name, t in tables.items() if name not in declared}
    assert not undeclared, f"{result.study}: tables not declared in COLUMNS: {undeclared}"
    for name, table in tables.items():
        missing = [c for c in declared[name] if c not in table.columns]
        assert not missing, f"{result.study}: table {name!r} lacks the declared columns {missing}"


# the export needs compressed-tensors (the export extra; `make setup` installs it, a GPU image may lack it)
needs_export_extra = pytest.mark.skipif(importlib.util.find_spec("compressed_tensors") is None,
                                        reason="the export extra (compressed-tensors) is not installed")


def run_main(capsys, *args) -> tuple[int, str, str]:
    """The real entry point (`lmlab ...`): exit code, stdout, stderr."""
    from lmlab.cli import main

    try:
        main(list(args))
        code = 0
    except SystemExit as exc:
        code = exc.code or 0
    captured = capsys.readouterr()
    return code, captured.out, captured.err
