"""Knowledge distillation losses (XTC's one-stage KD): logits + attention scores + hidden states.

    loss = w_logit * KL(teacher || student) on the logits (MSE for regression)
         + w_att   * sum over layers of MSE(pre-softmax attention scores), masked pairs left out
         + w_hid   * sum over hidden states (embedding output included) of MSE, padding left out
KL rather than soft cross-entropy: the same gradient, and 0 for a student identical to its teacher.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from lmlab.interventions import Capture, intervene


def _masked_mse(a: torch.Tensor, b: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    if mask is None:
        return F.mse_loss(a, b)
    m = mask.to(a.dtype)
    while m.dim() < a.dim():
        m = m.unsqueeze(-1)
    m = m.expand_as(a)
    return ((a - b) ** 2 * m).sum() / m.sum().clamp_min(1)


def kd_loss(student, teacher, batch: dict, regression: bool = False, w_logit: float = 1.0, w_att: float = 1.0,
            w_hid: float = 1.0, layer_map: list[int] | None = None) -> tuple[torch.Tensor, dict]:
    """`layer_map[j]` is the teacher block that student block j learns from (layer reduction);
    None pairs blocks one to one."""
    inputs = {k: v for k, v in batch.items() if k != "labels"}
    mask = inputs.get("attention_mask")
    want_scores = w_att > 0
    with torch.no_grad():
        with intervene(teacher, *([Capture("scores")] if want_scores else [])) as tcap:
            t = teacher(**inputs, output_hidden_states=True)
    with intervene(student, *([Capture("scores", grad=True)] if want_scores else [])) as scap:
        s = student(**inputs, output_hidden_states=True)
    if regression:
        logit = F.mse_loss(s.logits.float(), t.logits.float())
    else:
        logit = F.kl_div(F.log_softmax(s.logits.float(), -1), F.log_softmax(t.logits.float(), -1), log_target=True,
                         reduction="batchmean")
    pairs = list(enumerate(layer_map if layer_map is not None else range(len(s.hidden_states) - 1)))
    att = torch.zeros((), device=s.logits.device)
    if want_scores:
        for j, k in pairs:
            att = att + F.mse_loss(scap.store["scores"][j].float(), tcap.store["scores"][k].float())
    hid = _masked_mse(s.hidden_states[0].float(), t.hidden_states[0].float(), mask)  # embedding output
    for j, k in pairs:
        hid = hid + _masked_mse(s.hidden_states[j + 1].float(), t.hidden_states[k + 1].float(), mask)
    total = w_logit * logit + w_att * att + w_hid * hid
    return total, {"logit": float(logit.detach()), "attention": float(att.detach()), "hidden": float(hid.detach())}
