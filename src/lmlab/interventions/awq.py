"""AWQ (Lin et al., arXiv 2306.00978) through Intel's AutoRound (`auto_round.AWQConfig`, the `autoround` extra): its
AWQ transform searches, for each group of linear layers that read one normalized or projected input, the per-channel
scales s = mean|x|^a / mean|w|^(1-a) (its default "duo" scaling, as AutoAWQ's and llm-compressor's; 19 values of a
from 0 to 1, and s = 1, plain rounding, among the candidates) that give the least output error of the layers' parent
on the calibration text, folds 1/s into the operation before them (a norm's weight, v_proj before o_proj, up_proj
before down_proj) and s into their weights, and its RTN block quantizer then rounds every linear layer of the blocks.
The library is used rather than lmlab's own search: it runs on the CPU beside lmlab's pins, and it is what a user of
AWQ checkpoints would run.

The grid, the same as lmlab's GPTQ for a like-for-like comparison: asymmetric integers, one scale and zero point per
output row in groups of 128 input columns (AutoAWQ's default group). AutoRound runs on a float32 copy of the model on
the model's device (its `amp` off, so nothing is rounded to bfloat16 on the way), and its results (the rounded
weights and the norms and projections the scales were folded into) are written back into the model's own parameters
in their dtype: the weights as de-quantized values, like rtn's and hqq's.

The library leaves some layers as they were, and lmlab reports them rather than hide them (`awq_model` returns them):
a layer with a dimension that is not a multiple of 32 stays in full precision (its export formats cannot pack it), and
the v_proj -> o_proj smoothing is skipped where grouped-query attention gives o_proj more inputs than v_proj has
outputs (o_proj is still rounded). Both are AutoRound's behaviour, not lmlab's choice.
"""

from __future__ import annotations

import contextlib
import copy
import importlib.util
import logging
import random

import torch
from torch import nn

from lmlab.errors import LmlabError
from lmlab.extras import AUTOROUND
from lmlab.interventions.quant import post_training_targets

AWQ_BITS = (8, 4, 3, 2)
AWQ_GROUP = 128  # input columns per group of a row's grid (AutoAWQ's default)


def check_autoround() -> None:
    """One sentence where the autoround extra is missing."""
    if importlib.util.find_spec("auto_round") is None:
        raise LmlabError(AUTOROUND)


def autoround_version() -> str:
    from importlib.metadata import version

    return version("auto-round")


def awq_model(model: nn.Module, tokenizer, bits: int, texts: list[torch.Tensor], group_size: int = AWQ_GROUP,
              seed: int = 0) -> tuple[list[str], list[str]]:
    """AWQ of every linear layer of the blocks, in place, calibrated on `texts` (token ids of one length, 1-D tensors);
    returns (the layers quantized, the layers AutoRound left in full precision). The embeddings and the output layer
    stay as they are."""
    if bits not in AWQ_BITS:
        raise LmlabError(f"AWQ takes {', '.join(map(str, AWQ_BITS))} bits, not {bits}")
    check_autoround()
    if len({len(t) for t in texts}) != 1:
        raise LmlabError("AWQ's calibration texts must all have one length")
    targets = post_training_targets(model, "awq")
    device = next(model.parameters()).device
    work = copy.deepcopy(model).float()
    with _own_random_state(device):  # (AutoRound seeds torch's, numpy's and Python's generators with its seed)
        library = _autoround_awq(work, tokenizer, bits, texts, group_size, seed, device)
    ours, theirs = dict(model.named_parameters()), dict(library.named_parameters())
    if set(ours) != set(theirs):
        raise LmlabError(f"AutoRound changed the model's parameters ({sorted(set(ours) ^ set(theirs))[:3]}): lmlab "
                         "cannot read its AWQ back")
    with torch.no_grad():
        for name, p in ours.items():
            p.copy_(theirs[name].to(device=p.device, dtype=p.dtype))
    path = {id(m): name for name, m in model.named_modules()}
    kept = sorted(name for name, m in targets.items()
                  if not isinstance(getattr(library.get_submodule(path[id(m)]), "scale", None), torch.Tensor))
    return sorted(set(targets) - set(kept)), kept


@contextlib.contextmanager
def _own_random_state(device: torch.device):
    """The random generators' states as they were before, whatever the code inside does to them."""
    import numpy as np

    python, numpy = random.getstate(), np.random.get_state()
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        try:
            yield
        finally:
            random.setstate(python)
            np.random.set_state(numpy)


def _autoround_awq(work: nn.Module, tokenizer, bits: int, texts: list[torch.Tensor], group_size: int, seed: int,
                   device: torch.device) -> nn.Module:
    """AutoRound's AWQ and RTN on `work` (float32, changed in place); the model it returns."""
    from auto_round import AutoRound, AWQConfig

    logging.getLogger("autoround").setLevel(logging.WARNING)  # (its progress lines at INFO, a dozen a block)
    grid = dict(bits=bits, group_size=group_size, sym=False, data_type="int")
    rounder = AutoRound(work, tokenizer=tokenizer, scheme=dict(grid), alg_configs=AWQConfig(**grid),
                        dataset=[t[None].to(device) for t in texts], seqlen=len(texts[0]), nsamples=len(texts),
                        batch_size=min(8, len(texts)), device_map=str(device), enable_torch_compile=False, amp=False,
                        format="fake", seed=seed)  # (fake: values only, no packed export, which refuses 8-bit zeros)
    rounder.quantize()
    return rounder.model
