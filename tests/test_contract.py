"""Every registered study keeps the contract its StudySpec states: what it runs, the claims it declares, the tables
its analysis reads, the rows the report shows, and (where it derives tables or draws more figures) the functions
that do it, each found in the module the contract names; a study's __init__ is `define` and nothing else."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

from lmlab.claims import Declared
from lmlab.lazy import Lazy
from lmlab.studies import STUDIES
from lmlab.studies.config import StudyConfig

NAMES = sorted(STUDIES)


def test_every_study_of_the_package_is_registered():
    packages = {p.parent.name for p in (Path(importlib.import_module("lmlab.studies").__file__).parent).glob(
        "*/__init__.py")}
    assert {STUDIES[n].run.target.split(".")[2] for n in NAMES} == packages
    assert len(NAMES) >= 6


@pytest.mark.parametrize("name", NAMES)
def test_the_contract_holds(name):
    spec = STUDIES[name]
    assert issubclass(spec.config, StudyConfig) and spec.config.placebo_treatment, name
    for part in ("run", "verdict", "figure", "report_rows"):
        found = getattr(spec, part)
        assert isinstance(found, Lazy) and callable(found.resolve()), (name, part)
    claims = spec.claims()
    assert claims and all(isinstance(c, Declared) for c in claims), name
    assert len({c.name for c in claims}) == len(claims), f"{name}: a claim's name declared twice"
    assert any(c.decisive for c in claims), name
    tables = spec.tables()
    assert tables and all(isinstance(cols, tuple) and all(isinstance(c, str) for c in cols)
                          for cols in tables.values()), name
    analysis = importlib.import_module(spec.verdict.target.split(":")[0])
    # a derive or a figures function the contract does not name would never run: each is named, or absent
    assert (spec.derive is not None) == hasattr(analysis, "derive"), name
    assert (spec.figures is not None) == hasattr(analysis, "figures"), name
    for part in (spec.derive, spec.figures):
        assert part is None or callable(part.resolve()), name


@pytest.mark.parametrize("name", NAMES)
def test_a_study_init_is_its_definition(name):
    """No copied bodies: the docstring, two imports, `SPEC = define(...)`, `__all__` and `study_exports`."""
    package = STUDIES[name].run.target.rpartition(".")[0]
    tree = ast.parse(Path(importlib.import_module(package).__file__).read_text(encoding="utf-8"))
    targets = [t.id for node in tree.body if isinstance(node, ast.Assign) for t in node.targets]
    assert targets == ["SPEC", "__all__", "__getattr__"], (name, targets)
    calls = [node.value.func.id for node in tree.body if isinstance(node, ast.Assign)
             and isinstance(node.value, ast.Call)]
    assert calls == ["define", "study_exports"], (name, calls)


def test_what_one_study_reads_of_another_is_declared_there(tmp_path):
    """compare reads knockout's claim by the name knockout declares, and quantize's and sparse-circuits' models
    through the run-folder functions both sides use (lmlab.runs)."""
    from lmlab import runs
    from lmlab.studies.compare.pathways import knockout_claim
    from lmlab.studies.compare.recipe import expand

    assert knockout_claim(STUDIES["knockout"]) in {c.name for c in STUDIES["knockout"].claims()}
    quantize, sparse = tmp_path / "quantize-x", tmp_path / "sparse-circuits-x"
    for name in ("2bit-A-rep0", "2bit-A-rep1", "8bit-C-rep0"):
        runs.packed_student(quantize, name).parent.mkdir(parents=True, exist_ok=True)
        runs.packed_student(quantize, name).write_bytes(b"")
    for rep in (1, 0):
        runs.sparse_model_folder(sparse, rep).mkdir(parents=True)
    assert [(v.cell, v.replicate, v.kind) for v in expand(str(quantize))] == [
        ("2bit-A", 0, "packed"), ("2bit-A", 1, "packed"), ("8bit-C", 0, "packed")]
    assert [(v.cell, v.replicate) for v in expand(str(sparse))] == [("sparse", 0), ("sparse", 1)]
