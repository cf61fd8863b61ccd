"""lmlab's model type for lm-evaluation-harness (`pip install 'lmlab[lmeval]'`): any lm-eval task on a model with
one of lmlab's interventions applied.

    lmlab lm-eval --model lmlab --model_args model=smollm2-135m,intervention=arm,c=0.13,p1=99.5 --tasks hellaswag
    # from Python: import lmlab.lmeval (it registers "lmlab"), then
    lm_eval.simple_evaluate(model="lmlab", model_args="model=...,intervention=...", tasks=[...])
    lm_eval.simple_evaluate(model=lmlab.lmeval.LmlabLM(model=..., intervention=...), tasks=[...])

`lmlab lm-eval` (= `python -m lmlab.lmeval`) is lm_eval's own command line (the same arguments) with the model type
registered:
lm-eval 0.4 has no plugin mechanism for models, so a plain `lm_eval --model lmlab` cannot find it.

The model type is lm-eval's HFLM (its batching, request handling and scoring) around a model lmlab loaded
(`model=`: any name or folder `lmlab models` lists), with the intervention in every forward pass (loglikelihood,
rolling loglikelihood and generation requests):
    intervention=none
    intervention=filler,filler=Mless|Mful,count=55   the filler study's meaningless (" /") or meaningful (" he")
                                                    tokens, `count` of them inserted before each request's text
                                                    (after a BOS token)
    intervention=arm,c=0.13,p1=99.5,layer=0           the filler study's Activation Redistribution Module in that
                                                    layer's MLP
    intervention=knockout,spans=1-3+7,layers=0-5      the knockout study's knockout: the listed token positions of
                                                    each input (0 = its first token) may not be read by any later
                                                    position in those layers (default all)
    intervention=student,run=RUN_DIR,student=NAME     a packed student of a quantize run on a decoder
                                                    (RUN_DIR/packed/NAME)
    intervention=sparse,run=RUN_DIR,replicate=0       the sparse-attention model of a sparse-circuits run
"""

from __future__ import annotations

import copy

from lmlab.errors import LmlabError
from lmlab.extras import LMEVAL
from lmlab.runs import packed_student, packed_students, sparse_model_folder, study_run

KINDS = ("none", "filler", "arm", "knockout", "student", "sparse")

try:
    import torch
    from lm_eval.api.registry import register_model
    from lm_eval.models.huggingface import HFLM
except ImportError:  # the module still imports, so that `lmlab` can name the extra in one sentence
    HFLM, register_model = object, None


def _positions(text, what: str) -> list[int]:
    """'1-3+7' -> [1, 2, 3, 7]."""
    out = []
    for part in str(text).split("+"):
        lo, _, hi = part.partition("-")
        try:
            out += list(range(int(lo), int(hi or lo) + 1))
        except ValueError:
            raise LmlabError(f"{what} '{text}' is not a list of positions like 1-3+7") from None
    return out


class LmlabLM(HFLM):
    """lm-eval's HFLM around a model lmlab loads, with one intervention in every forward pass (the module
    docstring lists them). ARM draws its random redistribution from a generator seeded `seed` afresh in every
    forward call, so a request's score does not depend on how many calls came before it."""

    def __init__(self, model: str | None = None, intervention: str = "none", *, filler: str = "Mless",
                 count: int = 55, c: float = 0.13, p1: float = 99.5, layer: int = 0, spans=None, layers=None,
                 run: str | None = None, student: str | None = None, replicate: int = 0, seed: int = 0,
                 device: str | None = None, dtype: str | None = None, batch_size: int | str = 1, **kwargs):
        if register_model is None:
            raise LmlabError(LMEVAL)
        intervention = "none" if intervention is None else str(intervention)  # (lm-eval reads "none" as None)
        if intervention not in KINDS:
            raise LmlabError(f"unknown intervention '{intervention}'; use one of {', '.join(KINDS)}")
        self.kind, self._fill, self._knock, self._arm = intervention, [], None, None
        device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        torch_dtype = getattr(torch, dtype) if dtype else None
        lm = self._load_model(intervention, model, run, student, replicate, device, torch_dtype)
        if not lm.layout.causal:
            raise LmlabError(f"{lm.name} is not a causal language model; lm-eval's tasks need one")
        self._lm = lm
        if intervention == "filler":
            # (the tokens the filler study inserts; data, not a study's code path)
            from lmlab.studies.filler.measure import FILLERS

            if filler not in FILLERS:
                raise LmlabError(f"unknown filler '{filler}'; use one of {', '.join(FILLERS)}")
            self._fill = lm.tokenizer(FILLERS[filler], add_special_tokens=False)["input_ids"] * int(count)
        elif intervention == "arm":
            from lmlab.interventions.arm import ActivationRedistribution

            self._arm = lambda: ActivationRedistribution(c=float(c), p1=float(p1), layers=[int(layer)], seed=seed)
        elif intervention == "knockout":
            if spans is None:
                raise LmlabError("the knockout needs spans=POSITIONS (e.g. spans=1-3+7)")
            self._knock = (_positions(spans, "spans"), None if layers is None else _positions(layers, "layers"))
        super().__init__(pretrained=lm.model, tokenizer=lm.tokenizer, backend="causal", batch_size=batch_size,
                         device=device, **kwargs)

    def _load_model(self, intervention: str, model: str | None, run: str | None, student: str | None, replicate: int,
               device: str, torch_dtype):
        """The model lm-eval scores: a study run's student or sparse model, else `model` (a name or folder)."""
        from lmlab.models import load_model

        if intervention == "student":
            return self._student(run, student, device)
        if intervention == "sparse":
            run_dir, _ = study_run(run, "sparse-circuits")
            folder = sparse_model_folder(run_dir, replicate)
            if not (folder / "lmlab.json").is_file():
                raise LmlabError(f"{run_dir} has no finished sparse model for replicate {replicate} ({folder})")
            return load_model(str(folder), device=device, dtype=torch_dtype)
        if model is None:
            raise LmlabError("give model=NAME_OR_FOLDER in --model_args")
        return load_model(model, device=device, dtype=torch_dtype)

    @staticmethod
    def _student(run, student, device):
        from lmlab.interventions.quant import load_packed
        from lmlab.studies.quantize.config import Config

        run_dir, config = study_run(run, "quantize")
        path = packed_student(run_dir, student)
        if not student or not path.is_file():
            names = [p.stem for p in packed_students(run_dir)]
            raise LmlabError(f"give student=NAME, one of {', '.join(names) or 'none yet'}")
        base = Config(**config).load(train=True)
        if not base.layout.causal:
            raise LmlabError(f"{run_dir}'s students are classifiers (an encoder run); lm-eval needs a decoder run")
        model = copy.deepcopy(base.model).float()
        load_packed(model, path)
        import dataclasses

        return dataclasses.replace(base, model=model.to(device).eval(), name=f"{base.name} {student}")

    # --- filler tokens: inserted after a leading BOS token, in every encoding HFLM makes
    def _insert(self, ids: list[int]) -> list[int]:
        if not self._fill:
            return ids
        bos = self.tokenizer.bos_token_id
        at = 1 if ids and bos is not None and ids[0] == bos else 0
        return ids[:at] + self._fill + ids[at:]

    def tok_encode(self, string, add_special_tokens=None, left_truncate_len=None, **kwargs):
        ids = self._insert(super().tok_encode(string, add_special_tokens=add_special_tokens, **kwargs))
        return ids[-left_truncate_len:] if left_truncate_len else ids

    def tok_batch_encode(self, strings, padding_side="left", left_truncate_len=None, truncation=False):
        if not self._fill:
            return super().tok_batch_encode(strings, padding_side, left_truncate_len, truncation)
        rows = []
        for s in strings:
            ids, mask = super().tok_batch_encode([s], padding_side, None, truncation)
            row = self._insert(ids[0][mask[0].bool()].tolist())
            rows.append(row[-left_truncate_len:] if left_truncate_len else row)
        width = max(map(len, rows))
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        ids = torch.full((len(rows), width), pad, dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        for i, row in enumerate(rows):
            span = slice(width - len(row), width) if padding_side == "left" else slice(0, len(row))
            ids[i, span], mask[i, span] = torch.tensor(row), 1
        return ids, mask

    # --- per-call interventions (ARM's MLP edit and the knockout need each batch's shape)
    def _edits(self, ids: torch.Tensor, mask: torch.Tensor | None) -> list:
        from lmlab.interventions import Knockout

        edits = []
        if self._arm is not None:
            edits.append(self._arm())
        if self._knock is not None:
            mask = torch.ones_like(ids) if mask is None else mask
            keys, layers = self._knock
            lengths = mask.sum(1).tolist()
            edits.append(Knockout.spans(mask, [[p for p in keys if p < n] for n in lengths], layers=layers))
        return edits

    def _model_call(self, inps, attn_mask=None, labels=None):
        from lmlab.interventions import intervene

        # loglikelihood batches are right-padded without a mask: every row's positions count from column 0
        with intervene(self._lm, *self._edits(inps, None)):
            return super()._model_call(inps, attn_mask, labels)

    def _model_generate(self, context, max_length, stop, **generation_kwargs):
        from lmlab.interventions import intervene

        with intervene(self._lm, *self._edits(context, generation_kwargs.get("attention_mask"))):
            return super()._model_generate(context, max_length, stop, **generation_kwargs)


if register_model is not None:
    register_model("lmlab")(LmlabLM)


def main() -> None:
    if register_model is None:
        raise SystemExit(f"error: {LMEVAL}")
    from lm_eval.__main__ import cli_evaluate

    cli_evaluate()


if __name__ == "__main__":
    main()
