"""Results as data: a `StudyResult` holds a study's named tidy tables (every row carries `model`), a
metadata dict per model, the verdict per model and overall, and the figure.

On disk, in the run folder:
    tables/NAME.csv and tables/NAME.parquet   one file pair per named table
    meta.json                                  {model: {...}} what the run counted and chose (RunDir.describe)
    verdict.json                               {"overall": Verdict, "models": {model: Verdict}}
    figure.png / figure.svg                    the paper's figure (a row of panels per model)
`load_result(folder)` reads them back; `result.figure` is redrawn from the tables when not in memory.
"""

from __future__ import annotations

import io
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
import yaml

from lmlab.errors import LmlabError
from lmlab.files import atomic_write
from lmlab.studies.config import StudyConfig
from lmlab.studies.registry import STUDIES, StudySpec
from lmlab.studies.verdict import Verdict

def split_tables(frame: pd.DataFrame, model: str) -> dict[str, pd.DataFrame]:
    """A recipe's rows (each with a `kind`) -> named tables with a leading `model` column. (What a run counted and
    chose is not a row: the recipe gives it to `RunDir.describe`.)"""
    tables: dict[str, pd.DataFrame] = {}
    if frame.empty:
        return tables
    for kind, rows in frame.groupby("kind", sort=False):
        rows = rows.drop(columns="kind").dropna(axis=1, how="all").reset_index(drop=True)
        rows = rows.drop(columns="model", errors="ignore")
        rows.insert(0, "model", model)
        tables[str(kind)] = rows
    return tables


@dataclass
class StudyResult:
    study: str
    models: list[str]
    tables: dict[str, pd.DataFrame]
    meta: dict[str, dict[str, Any]]  # model -> metadata
    verdicts: dict[str, Verdict]  # model -> verdict
    verdict: Verdict  # overall (= the one model's verdict when there is one)
    config: StudyConfig | dict[str, Any] | None = None  # the study's own config type (a dict given is read into it)
    path: Path | None = None
    seconds: float = 0.0
    resumed: bool = False
    _figure: Any = None
    _spec: StudySpec | None = None  # set by the runner (a study need not be registered to run)

    def __post_init__(self) -> None:
        if not isinstance(self.config, StudyConfig):
            self.config = typed_config(self._spec or STUDIES.get(self.study), self.config or {},
                                       self.models[0] if self.models else "model")

    @property
    def spec(self) -> StudySpec:
        if self._spec is not None:
            return self._spec
        if self.study not in STUDIES:
            raise LmlabError(f"study '{self.study}' is not registered; import the package that defines it")
        return STUDIES[self.study]

    def table(self, name: str) -> pd.DataFrame:
        """The named table (an empty one when the run has none of that kind)."""
        found = self.tables.get(name)
        return found if found is not None else pd.DataFrame(columns=["model"])

    @property
    def info(self) -> dict[str, Any]:
        """The one model's metadata (a several-model result: use `meta[model]` or `for_model`)."""
        if len(self.models) != 1:
            raise LmlabError(f"this result holds {len(self.models)} models; use result.for_model(NAME).info")
        return self.meta.get(self.models[0], {})

    def for_model(self, model: str) -> "StudyResult":
        if model not in self.models:
            raise LmlabError(f"no model '{model}' in this result; it holds {', '.join(self.models)}")
        tables = {k: v[v["model"] == model].reset_index(drop=True) for k, v in self.tables.items()}
        tables = {k: v for k, v in tables.items() if not v.empty}
        verdict = self.verdicts.get(model, self.verdict)
        return StudyResult(self.study, [model], tables, {model: self.meta.get(model, {})}, {model: verdict}, verdict,
                           self.config, self.path, self.seconds, self.resumed, _spec=self._spec)

    @property
    def figure(self):
        """The paper's figure: one row of panels per model (drawn from the tables if not in memory)."""
        if self._figure is None:
            self._figure = draw(self)
        return self._figure

    def _repr_html_(self) -> str:
        """In a notebook: the study and its models, the verdict (and each model's where there are several), the
        figure, and the key rows."""
        import base64
        from html import escape

        title = self.spec.title if self.study in STUDIES or self._spec is not None else self.study
        parts = [f"<h3>{escape(title)}</h3><p>{escape(', '.join(self.models))}"
                 + (f"; run folder <code>{escape(str(self.path))}</code>" if self.path else "") + "</p>",
                 self.verdict._repr_html_()]
        if len(self.verdicts) > 1:
            parts += [f"<p><b>{escape(m)}</b></p>" + v._repr_html_() for m, v in self.verdicts.items()]
        png = self.path / "figure.png" if self.path else None
        if png is not None and png.is_file():
            data = png.read_bytes()
        else:
            buf = io.BytesIO()
            self.figure.savefig(buf, format="png", dpi=90)
            data = buf.getvalue()
        parts.append(f'<img alt="figure" style="max-width:100%" src="data:image/png;base64,'
                     f'{base64.b64encode(data).decode()}">')
        key = self.report_rows()
        if len(key):
            parts.append("<details><summary>Key rows</summary>" + key.to_html(index=False, na_rep="") + "</details>")
        return "".join(parts)

    def report_rows(self) -> pd.DataFrame:
        """The key rows for the report, per model."""
        parts = []
        for model in self.models:
            view = self.for_model(model)
            key = self.spec.report_rows(view) if self.spec.report_rows else pd.concat(list(view.tables.values())[:1])
            parts.append(key.assign(model=model) if "model" not in key else key)
        return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame()

    def long(self) -> pd.DataFrame:
        """Every table stacked into one frame with a `kind` column naming its table (metadata not included)."""
        parts = [t.assign(kind=name) for name, t in self.tables.items()]
        return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(columns=["model", "kind"])

    def save(self, folder: Path) -> None:
        for name, table in self.tables.items():
            buf = io.StringIO()
            table.to_csv(buf, index=False)
            atomic_write(folder / "tables" / f"{name}.csv", buf.getvalue())
            pq = io.BytesIO()
            table.to_parquet(pq, index=False)
            atomic_write(folder / "tables" / f"{name}.parquet", pq.getvalue())
        atomic_write(folder / "meta.json", json.dumps(self.meta, indent=1, default=str))
        atomic_write(folder / "verdict.json", json.dumps(
            {"overall": self.verdict.model_dump(), "models": {m: v.model_dump() for m, v in self.verdicts.items()}},
            indent=2, default=str))


def draw(result: StudyResult):
    """One model: the study's figure. Several: one SubFigure (a row of panels) per model, titled by model."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    spec = result.spec
    if len(result.models) == 1:
        return spec.figure(result)
    first = spec.figure(result.for_model(result.models[0]))
    width, height = first.get_size_inches()
    plt.close(first)
    parent = plt.figure(figsize=(width, height * len(result.models)), layout="constrained")
    for sub, model in zip(parent.subfigures(len(result.models), 1, squeeze=False)[:, 0], result.models):
        spec.figure(result.for_model(model), fig=sub)
        sub.suptitle(model, fontsize="large", fontweight="bold")
    return parent


def overall_verdict(verdicts: dict[str, Verdict]) -> Verdict:
    """Several models: the shared status when they agree, else inconclusive; the per-model lines as summary."""
    items = list(verdicts.values())
    if len(items) == 1:
        return items[0]
    statuses = {v.status for v in items}
    status = items[0].status if len(statuses) == 1 else "inconclusive"
    parts = [{"kind": "models", "agree": len(statuses) == 1, "models": [[m, v.status] for m, v in verdicts.items()]}]
    return Verdict(status=status, claim=items[0].claim, parts=parts,
                   evidence={m: {"status": v.status, "summary": v.summary} for m, v in verdicts.items()})


def from_rows(study: str, rows: pd.DataFrame | list[dict], model: str = "model",
              meta: dict[str, Any] | None = None) -> StudyResult:
    """A one-model result from recipe-shaped rows (each with a `kind`) and the metadata a recipe would describe,
    without a verdict yet: for checking a verdict rule on rows made by hand."""
    frame = rows if isinstance(rows, pd.DataFrame) else pd.DataFrame(rows)
    pending = Verdict(status="inconclusive", claim="", parts=[{"kind": "pending"}])
    return StudyResult(study, [model], split_tables(frame, model), {model: dict(meta or {})}, {model: pending},
                       pending)


def typed_config(spec: StudySpec | None, saved: dict[str, Any], model: str = "model") -> StudyConfig:
    """A run's saved settings (its config.yaml) as the study's config type, every default applied; a setting this
    lmlab no longer has is left out (nothing reads it). A study that is not registered gets the shared fields."""
    from pydantic import ValidationError

    kind = spec.config if spec is not None else StudyConfig
    known = {k: v for k, v in {"model": model, **saved}.items() if k in kind.model_fields}
    try:
        return kind.model_validate(known)
    except ValidationError as exc:
        problem = exc.errors()[0]
        raise LmlabError(f"a saved setting does not fit this lmlab: {'.'.join(map(str, problem['loc']))}: "
                         f"{problem['msg']}; run the study again") from None


def read_config(folder: str | Path, spec: StudySpec | None, model: str = "model") -> StudyConfig:
    """A run folder's config.yaml as the study's config type (`typed_config`); one sentence where it has none."""
    path = Path(folder).expanduser() / "config.yaml"
    if not path.is_file():
        raise LmlabError(f"{folder} is not a run folder (no config.yaml)")
    return typed_config(spec, yaml.safe_load(path.read_text()) or {}, model)


def load_result(folder: str | Path) -> StudyResult:
    """Read a finished run folder back into a `StudyResult`."""
    folder = Path(folder).expanduser()
    manifest_file = folder / "manifest.json"
    if not manifest_file.is_file() or not (folder / "verdict.json").is_file():
        raise LmlabError(f"{folder} holds no finished study run (no manifest.json and verdict.json)")
    manifest = json.loads(manifest_file.read_text())
    config = yaml.safe_load((folder / "config.yaml").read_text()) if (folder / "config.yaml").is_file() else {}
    tables = {p.stem: pd.read_parquet(p) for p in sorted((folder / "tables").glob("*.parquet"))}
    meta = json.loads((folder / "meta.json").read_text()) if (folder / "meta.json").is_file() else {}
    saved = json.loads((folder / "verdict.json").read_text())
    if "overall" not in saved:
        raise LmlabError(f"{folder} was written by an older lmlab (one table.csv); run the study again")
    verdicts = {m: Verdict.model_validate(v) for m, v in saved["models"].items()}
    models = manifest.get("models") or list(verdicts)
    return StudyResult(manifest["study"], models, tables, meta, verdicts, Verdict.model_validate(saved["overall"]),
                       config, folder, float(manifest.get("run_seconds", manifest.get("seconds", 0.0))), True)
