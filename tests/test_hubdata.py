"""Hub datasets: each hub schema maps onto our items through the file readers' row mappings (in-process
`datasets.Dataset` objects, no hub), saved dataset folders read as FORMAT:DIR, and no hub is one sentence."""

from __future__ import annotations

import json

import pytest

datasets = pytest.importorskip("datasets", reason="the hub readers need the datasets package (a dependency of lmlab; "
                                                   "a machine with its own packages may lack it)")
Dataset, DatasetDict = datasets.Dataset, datasets.DatasetDict

from lmlab.data import formats, hubdata
from lmlab.data.formats import QA_ROWS, glue_example, read_qa
from lmlab.data.math import gsm8k_row, math500_item, read_gsm8k, read_math_file
from lmlab.errors import LmlabError

POPQA = [{"id": 1, "subj": "George Rankin", "prop": "occupation", "obj": "politician", "s_pop": 142,
          "question": "What is George Rankin's occupation?", "possible_answers": json.dumps(["politician", "MP"])}]
TRIVIA = [{"question": "Which planet is red?", "question_id": "q1",
           "answer": {"value": "Mars", "aliases": ["Mars", "the red planet"], "normalized_value": "mars"}}]
NQ = [{"question": "where is the eiffel tower", "answer": ["Paris", "Paris, France"]}]
HOTPOT = [{"id": "5a8b", "question": "Which city hosts both teams?", "answer": "Milan", "type": "bridge",
           "level": "hard"}]
GSM = [{"question": "Tom has 3 apples and buys 4. How many?", "answer": "He has 3 + 4 = <<3+4=7>>7.\n#### 7"}]
MATH = [{"problem": "What is $2+3$?", "solution": "$\\boxed{5}$", "answer": "5", "subject": "Algebra", "level": 1,
         "unique_id": "test/algebra/1.json"}]


def _items(kind, rows):
    return [QA_ROWS[kind](row, where, i) for i, (where, row) in enumerate(hubdata.rows(Dataset.from_list(rows), kind))]


def test_each_qa_hub_schema_maps_onto_items():
    (p,) = _items("popqa", POPQA)
    assert (p.question, p.subject, p.prop, p.aliases, p.popularity) == (
        "What is George Rankin's occupation?", "George Rankin", "occupation", ["politician", "MP"], 142.0)
    (t,) = _items("triviaqa", TRIVIA)
    assert t.question == "Which planet is red?" and set(t.aliases) == {"Mars", "the red planet"}
    (n,) = _items("nq", NQ)
    assert n.aliases == ["Paris", "Paris, France"] and n.subject is None
    (h,) = _items("hotpotqa", HOTPOT)
    assert h.aliases == ["Milan"]


@pytest.mark.parametrize("kind,rows,field", [("popqa", POPQA, "subj"), ("triviaqa", TRIVIA, "answer"),
                                             ("nq", NQ, "answer"), ("hotpotqa", HOTPOT, "question")])
def test_a_hub_row_missing_a_field_is_one_sentence_naming_the_row(kind, rows, field):
    broken = [dict(rows[0]), {k: v for k, v in rows[0].items() if k != field}]
    with pytest.raises(LmlabError, match=rf"{kind} row 1: missing field '{field}"):
        _items(kind, broken)


def test_math_hub_schemas_map_onto_rows():
    (g,) = [gsm8k_row(row, where, 1) for where, row in hubdata.rows(Dataset.from_list(GSM), "gsm8k")]
    assert (g.answer, g.steps) == ("7", ("He has 3 + 4 = 7.",))
    (m,) = [math500_item(row, where, 1) for where, row in hubdata.rows(Dataset.from_list(MATH), "math500")]
    assert (m.answer, m.level, m.question) == ("5", 1, "What is $2+3$?")
    with pytest.raises(LmlabError, match="gsm8k row 0: a GSM8K row needs"):
        [gsm8k_row(row, where, 1) for where, row in hubdata.rows(Dataset.from_list([{"question": "q?"}]), "gsm8k")]
    with pytest.raises(LmlabError, match="math500 row 0: a MATH-500 row needs"):
        [math500_item(row, w, 1) for w, row in hubdata.rows(Dataset.from_list([{"problem": "p", "answer": ""}]),
                                                           "math500")]


def test_glue_hub_rows_keep_glue_label_order():
    mnli = glue_example("mnli", {"premise": "A dog runs.", "hypothesis": "An animal moves.", "label": 2}, "r0")
    assert (mnli.text_a, mnli.text_b, mnli.label) == ("A dog runs.", "An animal moves.", 2)  # 2 = contradiction
    stsb = glue_example("stsb", {"sentence1": "a", "sentence2": "b", "label": 3.2}, "r0")
    assert stsb.label == pytest.approx(3.2)
    sst2 = glue_example("sst2", {"sentence": "great film", "label": 1, "idx": 0}, "r0")
    assert (sst2.text_b, sst2.label) == (None, 1)
    with pytest.raises(LmlabError, match="r9: label -1 is not a class of qnli"):
        glue_example("qnli", {"question": "q", "sentence": "s", "label": -1}, "r9")
    with pytest.raises(LmlabError, match="r3: missing field 'hypothesis'"):
        glue_example("mnli", {"premise": "p", "label": 0}, "r3")


def test_saved_dataset_folders_read_as_format_dir(tmp_path):
    Dataset.from_list(POPQA * 3).save_to_disk(tmp_path / "popqa")
    items = read_qa("popqa", tmp_path / "popqa")
    assert len(items) == 3 and items[0].subject == "George Rankin"
    DatasetDict({"train": Dataset.from_list(GSM * 2), "test": Dataset.from_list(GSM)}).save_to_disk(tmp_path / "gsm")
    assert len(read_gsm8k(tmp_path / "gsm")) == 1  # the hub's default split for gsm8k: test
    assert len(read_math_file("math500", _saved(tmp_path / "m", MATH))) == 1
    glue = DatasetDict({"train": Dataset.from_list([{"premise": "p", "hypothesis": "h", "label": 1}] * 4),
                        "validation_matched": Dataset.from_list([{"premise": "p", "hypothesis": "h", "label": 0}] * 2)})
    glue.save_to_disk(tmp_path / "mnli")
    train, dev = formats.glue_splits("mnli", tmp_path / "mnli")
    assert (len(train), len(dev), train[0].label, dev[0].label) == (4, 2, 1, 0)
    (tmp_path / "empty").mkdir()
    with pytest.raises(LmlabError, match="not a dataset folder written by save_to_disk"):
        read_qa("nq", tmp_path / "empty")


def _saved(path, rows):
    Dataset.from_list(rows).save_to_disk(path)
    return path


def test_hub_id_without_a_hub_is_one_sentence(monkeypatch):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    import lmlab.hub

    monkeypatch.setattr(lmlab.hub, "hub_reachable", lambda: False)
    with pytest.raises(LmlabError, match=r"^no hub reachable .* the dataset akariasai/PopQA: pass popqa:PATH"):
        formats.hub_qa("popqa")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(LmlabError, match="not in the local datasets cache and HF_HUB_OFFLINE=1"):
        formats.glue_splits("rte")


def test_the_studies_take_hub_ids(monkeypatch):
    """`--datasets popqa`, `--benchmark gsm8k`, `--data gsm8k`, `--tasks glue-rte` reach the hub loader with the
    dataset the issue names (the loader replaced by in-process datasets)."""
    calls = []

    def fake(repo, name, split, kind):
        calls.append((repo, name, split))
        gsm = [{"question": f"Tom has {i} apples and buys 4. How many?",
                "answer": f"He has {i} + 4 = {i + 4}.\n#### {i + 4}"} for i in range(40)]
        table = {"akariasai/PopQA": POPQA * 4, "openai/gsm8k": gsm,
                 "nyu-mll/glue": [{"sentence1": "a", "sentence2": "b", "label": 0}] * 4}
        return Dataset.from_list(table[repo])

    monkeypatch.setattr(hubdata, "load_hub", fake)
    from lmlab.studies.filler.config import Config as FillerConfig
    from lmlab.studies.filler.recipe import load_problems
    from lmlab.studies.knockout.config import Config as KnockoutConfig
    from lmlab.studies.knockout.recipe import load_items
    from lmlab.studies.latent.config import Config as LatentConfig
    from lmlab.studies.latent.recipe import load_problems as latent_problems
    from lmlab.studies.quantize.config import Config as QuantizeConfig
    from lmlab.studies.quantize.recipe import load_task

    assert len(load_items(KnockoutConfig(model="tiny-llama", datasets=["popqa"], per_dataset=2))) == 2
    dev, test = load_problems(FillerConfig(model="tiny-llama", benchmark="gsm8k", n_test_per_level=1))
    assert len(dev) + len(test) >= 2 and test[0].answer.isdigit()
    cfg = LatentConfig(model="scratch", data="gsm8k", n_train=5, n_test=2)
    assert cfg.task == "gsm8k" and set(latent_problems(cfg)) == {"train", "dev", "test"}
    task = load_task("glue-rte", QuantizeConfig(model="tiny-bert"))
    assert (task.metric, len(task.train)) == ("accuracy", 4)
    assert [c[:2] for c in calls] == [("akariasai/PopQA", None), ("openai/gsm8k", "main"), ("openai/gsm8k", "main"),
                                      ("nyu-mll/glue", "rte"), ("nyu-mll/glue", "rte")]
    assert [c[2] for c in calls] == ["test", "test", "train", "train", "validation"]
