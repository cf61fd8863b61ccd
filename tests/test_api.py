"""The Python API as a notebook uses it: a study by name or on a model in memory, results as data,
several models in one result."""

import copy

import pandas as pd
import torch

import lmlab
from lmlab.models import load_model

SMALL = dict(n_test_per_level=2, n_dev_per_level=1, sweep_problems=2, profile_problems=2, max_new_tokens=4,
             sweep_lengths=[5], arm_c=[0.13], arm_p1=[99.5])


def _zero_head(lm, layer: int = 0, head: int = 0):
    """An edit a researcher might make: head `head` of `layer` writes nothing (its slice of o_proj's input)."""
    edited = copy.deepcopy(lm)
    width = edited.layout.head_dim
    with torch.no_grad():
        edited.model.model.layers[layer].self_attn.o_proj.weight[:, head * width:(head + 1) * width] = 0
    return edited


def test_the_readme_example_runs_on_a_tiny_model(tmp_path):
    result = lmlab.run("filler", model="tiny-llama", profile="quick", out=tmp_path, **SMALL)
    assert result.verdict.status in ("reproduced", "not reproduced", "inconclusive")
    answers = result.table("answer")
    assert len(answers) and set(answers["model"]) == {"tiny-llama"}
    assert {"answer", "tuning", "profile", "mlp"} <= set(result.tables)
    assert result.info["max_new_tokens"] == 4
    assert result.figure.get_axes()
    again = lmlab.load_result(result.path)
    assert (again.verdict.status, again.verdict.summary) == (result.verdict.status, result.verdict.summary)
    assert again.models == ["tiny-llama"]
    for name, table in result.tables.items():
        pd.testing.assert_frame_equal(again.table(name), table, check_dtype=False)
    assert again.figure.get_axes()  # redrawn from the tables on disk


def test_a_model_passed_in_is_studied_as_it_is_in_memory(tmp_path):
    named = lmlab.run("filler", model="tiny-llama", out=tmp_path, **SMALL)
    same = lmlab.run("filler", model=load_model("tiny-llama"), out=tmp_path, **SMALL)
    pd.testing.assert_frame_equal(same.table("mlp"), named.table("mlp"))  # unedited: the same numbers
    edited = lmlab.run("filler", model=_zero_head(load_model("tiny-llama")), out=tmp_path, **SMALL)
    assert edited.path != named.path  # never the unedited run's folder
    # head 0 of layer 0 zeroed: the layer-0 MLP reads a different residual stream
    assert not edited.table("mlp")["mean_abs"].equals(named.table("mlp")["mean_abs"])


def test_two_models_give_one_result_with_a_panel_row_each(tmp_path):
    base = load_model("tiny-llama")
    other = _zero_head(base)
    other.name = "tiny-llama-head0-zeroed"
    result = lmlab.run("filler", models=[base, other], out=tmp_path, **SMALL)
    assert result.models == ["tiny-llama", "tiny-llama-head0-zeroed"]
    assert set(result.table("answer")["model"]) == set(result.models)
    assert set(result.verdicts) == set(result.models)
    assert len(result.figure.subfigs) == 2  # one row of the seed's panels per model
    assert (result.path / "figure.png").is_file()
    one = result.for_model("tiny-llama-head0-zeroed")
    assert set(one.table("mlp")["model"]) == {"tiny-llama-head0-zeroed"}
    again = lmlab.load_result(result.path)
    assert again.models == result.models and len(again.figure.subfigs) == 2
    from lmlab.report import build_report

    page = build_report([tmp_path], tmp_path / "report.html").read_text()
    assert "tiny-llama-head0-zeroed" in page
