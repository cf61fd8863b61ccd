"""GPTQ (Frantar et al., arXiv 2210.17323), implemented here: no maintained library makes it beside lmlab's pins (the
maintained ones need older transformers or are not on the package index; AutoRound writes GPTQ-format checkpoints
but quantizes them by other algorithms).

Per linear layer of the blocks, with X its inputs on calibration text:
- the Hessian of the layer's squared output error, H = 2 X^T X / n (n the calibration tokens), dampened by 1% of its
  mean diagonal; an input that is zero on every token is dropped (its column zeroed, its diagonal set to 1);
- the columns (input dimensions) quantized in their natural order (no act-order, the paper's own), each column's
  rounding error spread over the columns not yet quantized through the upper Cholesky factor of H^-1 (the OBQ update
  of the paper's Algorithm 1); lazy batches of `group_size` columns are only the paper's speed trick;
- the grid: asymmetric, one per output row in groups of 128 input columns (llm-compressor's W4A16 default group;
  a layer narrower than 128 inputs has one group per row), 2^bits levels from the group's minimum to its maximum with
  zero on a level, the scale and zero point of a group found when its first column is reached (from the weights as
  the earlier columns' errors left them), as the paper's code does.

Sequential, as the paper and the libraries run it: block after block, each block's inputs the outputs of the blocks
already quantized; inside a block the linear layers are quantized in the order the forward reaches them, those that
read the same input together (q, k, v; gate, up), each layer's Hessian taken on inputs that pass through the layers
quantized before it. The embeddings and the output layer are left as they are. A linear layer the calibration text
never reaches (H = 0) is rounded to nearest on the same grid (GPTQ with H = identity is exactly that).
"""

from __future__ import annotations

import torch
from torch import nn
from transformers.pytorch_utils import Conv1D

from lmlab.errors import LmlabError
from lmlab.interventions.quant import asymmetric_grid, check_rtn_bits, on_grid, post_training_targets
from lmlab.models.layout import layout_of

GPTQ_BITS = (8, 4, 3, 2)
GPTQ_GROUP = 128  # input columns per group of a row's grid (llm-compressor's W4A16 default)
GPTQ_DAMP = 0.01  # of the Hessian's mean diagonal, added to its diagonal (the paper's)


def gptq_weight(w: torch.Tensor, hessian: torch.Tensor, bits: int, group_size: int = GPTQ_GROUP,
                damp: float = GPTQ_DAMP) -> torch.Tensor:
    """GPTQ of a (out, in) matrix given the (in, in) Hessian of its inputs, returned de-quantized in `w`'s dtype.
    Computed in float32 (float64 for a float64 matrix) on `w`'s device."""
    check_rtn_bits(bits)
    dtype = torch.promote_types(w.dtype, torch.float32)
    W = w.detach().to(dtype).clone()
    H = hessian.detach().to(device=W.device, dtype=dtype).clone()
    n = W.shape[1]
    dead = torch.diag(H) == 0
    H[dead, dead] = 1
    W[:, dead] = 0
    H += damp * torch.diag(H).mean() * torch.eye(n, dtype=dtype, device=W.device)
    try:
        U = torch.linalg.cholesky(torch.cholesky_inverse(torch.linalg.cholesky(H)), upper=True)
    except torch.linalg.LinAlgError:
        raise LmlabError("GPTQ: the calibration Hessian is not positive definite even dampened (too few calibration "
                         "tokens, or inputs of inf or nan)") from None
    Q = torch.zeros_like(W)
    step = min(group_size, n)
    for start in range(0, n, step):  # a lazy batch is a group: its grid from its columns as the errors left them
        end = min(start + step, n)
        W1, U1 = W[:, start:end].clone(), U[start:end, start:end]
        scale, zero = asymmetric_grid(W1, bits)
        errors = torch.zeros_like(W1)
        for i in range(end - start):
            q = on_grid(W1[:, i:i + 1], scale, zero, bits)[:, 0]
            Q[:, start + i] = q
            errors[:, i] = (W1[:, i] - q) / U1[i, i]
            W1[:, i:] -= errors[:, i:i + 1] * U1[i:i + 1, i:]
        W[:, end:] -= errors @ U[start:end, end:]
    return Q.to(w.dtype)


class _Reached(Exception):
    """Raised by the hook on the first block once it has its inputs: the rest of the model need not run."""


def _first_block_inputs(model: nn.Module, block: nn.Module, texts: list[torch.Tensor]) -> list[tuple[tuple, dict]]:
    """The (args, kwargs) the first block is called with on each calibration text (one text a call: no padding)."""
    seen = []

    def grab(module, args, kwargs):
        seen.append((args, kwargs))
        raise _Reached

    handle = block.register_forward_pre_hook(grab, with_kwargs=True)
    try:
        for ids in texts:
            try:
                model(input_ids=ids[None], use_cache=False)
            except _Reached:
                pass
    finally:
        handle.remove()
    return seen


def _hidden(args: tuple, kwargs: dict) -> torch.Tensor:
    return args[0] if args else kwargs["hidden_states"]


def _with_hidden(args: tuple, kwargs: dict, hidden: torch.Tensor) -> tuple[tuple, dict]:
    if args:
        return (hidden, *args[1:]), kwargs
    return args, {**kwargs, "hidden_states": hidden}


def _run(block: nn.Module, call: tuple[tuple, dict]) -> torch.Tensor:
    out = block(*call[0], **call[1])
    return out[0] if isinstance(out, tuple) else out


def _stages(block: nn.Module, linears: dict[str, nn.Module], call: tuple[tuple, dict]) -> list[list[str]]:
    """The block's linear layers in the order its forward reaches them, those that read one input tensor together (q,
    k and v; gate and up); layers the forward does not reach come last, one stage each."""
    order: list[tuple[str, torch.Tensor]] = []
    handles = [m.register_forward_pre_hook(lambda m, args, name=name: order.append((name, args[0])))
               for name, m in linears.items()]
    try:
        _run(block, call)
    finally:
        for h in handles:
            h.remove()
    stages: list[list[str]] = []
    last = None
    for name, x in order:  # (the inputs are kept alive in `order`, so no two distinct ones share an address)
        if name in (n for s in stages for n in s):
            continue
        if stages and x is last:
            stages[-1].append(name)
        else:
            stages.append([name])
        last = x
    return stages + [[n] for n in linears if n not in {n for s in stages for n in s}]


def _matrix(module: nn.Module) -> torch.Tensor:
    """A linear layer's weight as (out, in): GPT-2's Conv1D keeps it as (in, out)."""
    return module.weight.t() if isinstance(module, Conv1D) else module.weight


def _hessians(block: nn.Module, modules: dict[str, nn.Module], calls: list) -> dict[str, torch.Tensor]:
    """2 X^T X / n of each module's inputs over the calibration calls (in float32, or float64 for float64 weights, on
    the weights' device); the identity for a module no call reached."""
    sums = {name: torch.zeros(_matrix(m).shape[1], _matrix(m).shape[1], device=m.weight.device,
                              dtype=torch.promote_types(m.weight.dtype, torch.float32)) for name, m in modules.items()}
    counts = dict.fromkeys(modules, 0)

    def add(name):
        def hook(module, args):
            x = args[0].detach().reshape(-1, args[0].shape[-1]).to(sums[name].dtype)
            sums[name].addmm_(x.t(), x)
            counts[name] += x.shape[0]
        return hook

    handles = [m.register_forward_pre_hook(add(name)) for name, m in modules.items()]
    try:
        for call in calls:
            _run(block, call)
    finally:
        for h in handles:
            h.remove()
    return {name: (2 * sums[name] / counts[name]) if counts[name] else torch.eye(len(s), device=s.device, dtype=s.dtype)
            for name, s in sums.items()}


def gptq_model(model: nn.Module, bits: int, texts: list[torch.Tensor], group_size: int = GPTQ_GROUP,
               progress: bool = True) -> list[str]:
    """GPTQ of every linear layer of the blocks (the ones `round_to_nearest` rounds), in place, calibrated on `texts`
    (token ids, each a 1-D tensor on the model's device), sequentially (the module's docstring); returns the layers.
    Each weight is written in its own dtype; the embeddings and the output layer stay as they are."""
    from rich.progress import Progress

    if bits not in GPTQ_BITS:
        raise LmlabError(f"GPTQ takes {', '.join(map(str, GPTQ_BITS))} bits, not {bits}")
    targets = post_training_targets(model, "gptq")
    blocks = layout_of(model).blocks
    with torch.no_grad(), Progress(transient=True, disable=not progress) as bar:
        task = bar.add_task(f"GPTQ at {bits} bits, block by block", total=len(blocks))
        calls = _first_block_inputs(model, blocks[0], texts)
        for layer, block in enumerate(blocks):
            linears = {name.split(".", 2)[2]: m for name, m in targets.items() if name.split(".")[1] == str(layer)}
            for stage in _stages(block, linears, calls[0]):
                hessians = _hessians(block, {name: linears[name] for name in stage}, calls)
                for name in stage:
                    _write(linears[name], gptq_weight(_matrix(linears[name]), hessians[name], bits, group_size))
            calls = [_with_hidden(*call, _run(block, call)) for call in calls]  # the quantized block's outputs
            bar.advance(task)
    return sorted(targets)


def _write(module: nn.Module, values: torch.Tensor) -> None:
    module.weight.copy_((values.t() if isinstance(module, Conv1D) else values).to(module.weight.dtype))
