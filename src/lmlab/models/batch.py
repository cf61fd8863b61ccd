"""The one padding function: token-id lists -> a batch on the model's device."""

from __future__ import annotations

from typing import Sequence

import torch

from lmlab.errors import LmlabError


def module_device(module: torch.nn.Module) -> torch.device:
    """Where a module's inputs go: where its weights are (cpu for a module without any); for a model dispatched
    over devices by accelerate (`hf_device_map`), the device its input embeddings run on, offloaded or not."""
    if getattr(module, "hf_device_map", None) and hasattr(module, "get_input_embeddings"):
        hook = getattr(module.get_input_embeddings(), "_hf_hook", None)
        device = getattr(hook, "execution_device", None)
        if device is not None:
            return torch.device(f"cuda:{device}" if isinstance(device, int) else device)
    param = next((p for p in module.parameters() if p.device.type != "meta"), None)
    return param.device if param is not None else torch.device("cpu")


def pad_sequences(sequences: Sequence[Sequence[int]], pad_id: int, side: str = "left", device=None,
                  position_ids: bool = False, label_from: Sequence[int] | None = None) -> dict[str, torch.Tensor]:
    """`input_ids` and `attention_mask` padded on `side`; `position_ids` counted from each row's first real
    token when asked; `labels` (padding and each row's first `label_from[i]` tokens at -100) when
    `label_from` is given. Every tensor goes to `device` (the model's)."""
    if not sequences:
        raise LmlabError("no sequences were given")
    width = max(len(s) for s in sequences)
    host = torch.device("cpu")  # assembled row by row on the host, then moved in one copy per tensor
    ids = torch.full((len(sequences), width), pad_id, dtype=torch.long, device=host)
    mask = torch.zeros((len(sequences), width), dtype=torch.long, device=host)
    labels = torch.full((len(sequences), width), -100, dtype=torch.long, device=host) if label_from is not None else None
    for i, seq in enumerate(sequences):
        start = width - len(seq) if side == "left" else 0
        ids[i, start:start + len(seq)] = torch.as_tensor(list(seq), dtype=torch.long, device=host)
        mask[i, start:start + len(seq)] = 1
        if labels is not None:
            skip = label_from[i]
            labels[i, start + skip:start + len(seq)] = ids[i, start + skip:start + len(seq)]
    batch = {"input_ids": ids, "attention_mask": mask}
    if position_ids:
        batch["position_ids"] = (mask.cumsum(-1) - 1).clamp_min(0)
    if labels is not None:
        batch["labels"] = labels
    return {k: v.to(device) for k, v in batch.items()} if device is not None else batch
