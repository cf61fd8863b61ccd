"""docs/extending.md's worked example runs, and its claim can fail: the study skeleton a reader copies is code."""

import re
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd

DOC = Path(__file__).resolve().parents[1] / "docs" / "extending.md"


def _example():
    code = re.search(r"### A worked example.*?```python\n(.*?)```", DOC.read_text(), re.S).group(1)
    scope: dict = {}
    exec(compile(code, str(DOC), "exec"), scope)
    return scope["verdict"]


def _result(drop: float, clean: float = 0.8, k: int = 3, n: int = 300, seed: int = 0):
    rng = np.random.default_rng(seed)
    rows = []
    for r in range(k):
        base = rng.random(n) < clean
        hit = base & (rng.random(n) < drop)  # the ablation breaks this share of the right answers
        rows += [dict(replicate=r, idx=i, condition="clean", correct=int(b)) for i, b in enumerate(base)]
        rows += [dict(replicate=r, idx=i, condition="ablated", correct=int(b and not h))
                 for i, (b, h) in enumerate(zip(base, hit))]
    table = pd.DataFrame(rows)
    return SimpleNamespace(table=lambda name: table, config=SimpleNamespace(seed=seed), seconds=10.0)


def test_the_worked_example_says_yes_on_an_effect_and_never_yes_on_its_absence():
    verdict = _example()
    assert verdict(_result(drop=0.3)).status == "reproduced"
    null = verdict(_result(drop=0.0))  # an ablation that changes nothing
    assert null.status != "reproduced" and null.evidence["claims"][0]["decision"] != "yes"
    unable = verdict(_result(drop=0.0, clean=0.1))  # the model cannot do the task: the gate holds "no" back
    assert unable.status != "not reproduced"
