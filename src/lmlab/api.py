"""The Python API: the studies as functions, for a notebook or a script.

    import lmlab
    lm = lmlab.load_model("smollm2-135m")              # or any hub id / folder / .gguf; edit it as you like
    result = lmlab.run("knockout", model=lm, profile="quick", per_dataset=32)
    result.verdict.status, result.table("knockout"), result.figure
    again = lmlab.load_result(result.path)             # the same tables, verdicts and figure, from disk

`model` is a name or a `LoadedModel`; `models=[...]` (names or LoadedModels) runs the study on each into
one result with a row of panels per model. Other keyword arguments are the study's config fields, e.g.
`device="cuda:1"`, `dtype="bfloat16"`, `per_dataset=64`. `config="run/config.yaml"` (a run's config, or any
YAML file of settings) starts from that file; keyword arguments override it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

from pydantic import ValidationError

import lmlab.interventions  # noqa: F401  (registers how a saved sparse-attention folder is restored)
from lmlab.errors import LmlabError
from lmlab.models import LoadedModel
from lmlab.models import load_model as _load_model
from lmlab.studies import STUDIES, StudyResult, get_study, load_result, run_study

__all__ = ["load_model", "load_result", "run", "studies"]


def studies() -> list[str]:
    """The registered study names, in the order `lmlab reproduce` runs them."""
    return list(STUDIES)


def load_model(spec: str, **kwargs) -> LoadedModel:
    """`lmlab.models.load_model`, with every saved lmlab extra (e.g. a sparse-attention gate) restored."""
    return _load_model(spec, **kwargs)


def run(study: str, model: str | LoadedModel | None = None, *, models: Sequence[str | LoadedModel] | None = None,
        profile: str | None = None, seed: int | None = None, out: str | Path = "runs", config: str | Path | None = None,
        **overrides: Any) -> StudyResult:
    """Run `study` (e.g. "knockout") on `model` (or each of `models`) and return its `StudyResult`."""
    from lmlab.studies.registry import read_config_file

    spec = get_study(study)
    settings = read_config_file(config, spec) if config is not None else {}
    settings.update({k: v for k, v in (("profile", profile), ("seed", seed)) if v is not None})
    if model is None and models is None and "model" in settings:
        model = settings["model"]
    chosen = list(models) if models is not None else [model if model is not None else spec.default_model]
    if not chosen:
        raise LmlabError("models=[] names no model")
    loaded = [m for m in chosen if isinstance(m, LoadedModel)]
    if loaded and len(loaded) != len(chosen):
        chosen = [m if isinstance(m, LoadedModel) else _load_model(m) for m in chosen]
        loaded = chosen
    names = ",".join(m.name if isinstance(m, LoadedModel) else str(m) for m in chosen)
    try:
        study_config = spec.config(**{**settings, **overrides, "model": names})
    except ValidationError as exc:
        first = exc.errors()[0]
        raise LmlabError(f"bad setting {'.'.join(map(str, first['loc']))}: {first['msg']}") from None
    study_config.check_inputs(models=not loaded)  # models passed in need no name check; files and names do
    return run_study(spec, study_config, out, lm=loaded or None)
