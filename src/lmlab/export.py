"""`lmlab export RUN_DIR`: the students of a quantize run in a format other tools load.

Each packed student (RUN_DIR/packed/*.safetensors) is rebuilt exactly as the study scored it (its teacher's
architecture, `load_packed`) and written by interventions/export.py to RUN_DIR/export/FORMAT/NAME (or --out):
config.json with the quantization config, model.safetensors, the tokenizer, lmlab_export.json with the sizes.
The written folder is then loaded back by transformers (with compressed-tensors, as a user would) and its logits
compared with the student's on a few inputs: the largest difference is printed and kept in lmlab_export.json.
"""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

from lmlab.errors import LmlabError
from lmlab.extras import EXPORT, EXPORT_FORMATS
from lmlab.runs import packed_students, study_run

NAME = re.compile(r"^(?:(?P<task>.+)-)?(?P<bits>\d+)bit-(?P<budget>[ABC])-rep(?P<rep>\d+)$")


def _check(run_dir: Path, fmt: str) -> list[Path]:
    """Input errors, before torch: the folder, its study, its packed students, the format and its package."""
    if fmt not in EXPORT_FORMATS:
        raise LmlabError(f"unknown export format '{fmt}'; use {', '.join(EXPORT_FORMATS)}")
    if not run_dir.is_dir():
        raise LmlabError(f"{run_dir} is not a folder; give a quantize run folder (runs/quantize-...)")
    study_run(run_dir, "quantize")
    packed = [p for p in packed_students(run_dir) if NAME.match(p.stem)]
    if not packed:
        raise LmlabError(f"{run_dir} holds no packed students yet (packed/*.safetensors): run the quantize study "
                         "first; the students are packed as each finishes")
    if importlib.util.find_spec("compressed_tensors") is None:
        raise LmlabError(EXPORT)
    return packed


def _student_shell(run_dir: Path, path: Path, task: str | None, base, config):
    """The float model a packed student's weights load into: a copy of the run's decoder, or its task's teacher
    (every other layer kept where the run reduced layers, as the study built it: teacher layers 1, 3, 5, ...)."""
    import copy

    from transformers import AutoModelForSequenceClassification

    from lmlab.interventions.quant import keep_layers
    from lmlab.models.layout import layout_of

    if base.layout.causal:
        return copy.deepcopy(base.model).float()
    teacher = run_dir / "teachers" / (task or "")
    if not (teacher / "model.safetensors").exists():
        raise LmlabError(f"{path.name}: its teacher {teacher} is missing; the student's architecture is the teacher's")
    model = AutoModelForSequenceClassification.from_pretrained(teacher).float()
    if config.layer_reduction:
        n = layout_of(model).n_layers
        keep_layers(model, list(range(1, n, 2)) if n > 1 else [0])
    return model


def export_run(run_dir: str | Path, fmt: str = "compressed-tensors", out: str | Path | None = None,
               check_rows: int = 2) -> list[dict]:
    """Export every packed student of a quantize run; returns one row per student (sizes, and the largest logit
    difference of the folder loaded back, over `check_rows` random inputs; 0 skips the check)."""
    run_dir = Path(run_dir).expanduser()
    packed = _check(run_dir, fmt)
    root = Path(out).expanduser() if out is not None else run_dir / "export" / fmt
    from lmlab.interventions.export import export_compressed
    from lmlab.interventions.quant import load_packed
    from lmlab.studies.quantize.config import Config

    config = Config(**study_run(run_dir, "quantize")[1])
    base = config.load(train=True)
    decoder = base.layout.causal
    rows = []
    for path in packed:
        m = NAME.match(path.stem)
        model = _student_shell(run_dir, path, m["task"], base, config)
        load_packed(model, path)
        model.eval()
        folder = root / path.stem
        sizes = export_compressed(model, folder, base.tokenizer)
        diff = _check_loaded(model, folder, decoder, check_rows) if check_rows else None
        sizes["max_logit_diff"] = diff
        from lmlab.files import atomic_write

        atomic_write(folder / "lmlab_export.json",
                     json.dumps({**json.loads((folder / "lmlab_export.json").read_text()), "max_logit_diff": diff},
                                indent=1))
        rows.append(dict(student=path.stem, bits=int(m["bits"]), folder=str(folder),
                         packed_bytes=path.stat().st_size, **sizes))
        del model
    return rows


def _check_loaded(model, folder: Path, decoder: bool, n: int) -> float:
    """Largest |logit difference| between the student and its exported folder loaded by transformers."""
    import torch
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification

    loaded = (AutoModelForCausalLM if decoder else AutoModelForSequenceClassification).from_pretrained(folder).eval()
    device = next(model.parameters()).device
    loaded.to(device)
    g = torch.Generator().manual_seed(0)
    vocab = model.config.get_text_config().vocab_size
    ids = torch.randint(0, vocab, (n, 16), generator=g, device="cpu").to(device)
    with torch.no_grad():
        a, b = model(input_ids=ids).logits, loaded(input_ids=ids).logits
    return float((a.float() - b.float()).abs().max())
