"""Knowledge distillation losses (XTC's one-stage KD): logits + attention scores + hidden states.

    loss = w_logit * KL(teacher || student) on the logits (MSE for regression)
         + w_att   * sum over layers of MSE(pre-softmax attention scores) over the real (query, key) pairs
         + w_hid   * sum over hidden states (embedding output included) of MSE, padding left out
KL rather than soft cross-entropy: the same gradient, and 0 for a student identical to its teacher.

Padding is left out of both feature terms, so an example's loss does not depend on how long the other rows
of its batch are. That also makes the teacher's side a function of the example alone: `TeacherCache` runs
the frozen teacher once over the KD pool and every student, at every step, reads its outputs from memory
instead of recomputing them (the teacher does not change during KD).
"""

from __future__ import annotations

from typing import Callable, Sequence

import torch
import torch.nn.functional as F

from lmlab.interventions import Capture, intervene
from lmlab.models.batch import module_device
from lmlab.parallel import all_sum, group_size
from lmlab.train.loop import share


def _masked_mse(a: torch.Tensor, b: torch.Tensor, mask: torch.Tensor | None, count: float | None = None
                ) -> torch.Tensor:
    """The mean squared error over the real entries; `count`: how many there are over every process (then this
    process's `share` of the global mean, see train.loop)."""
    if mask is None:
        return F.mse_loss(a, b)
    m = mask.to(a.dtype)
    while m.dim() < a.dim():
        m = m.unsqueeze(-1)
    m = m.expand_as(a)
    total = ((a - b) ** 2 * m).sum()
    return total / m.sum().clamp_min(1) if count is None else share(total, float(m.sum()), count)


def _pair_mask(mask: torch.Tensor | None) -> torch.Tensor | None:
    """(batch, 1, query, key) True where both the query and the key are real tokens."""
    return None if mask is None else (mask[:, None, :, None].bool() & mask[:, None, None, :].bool())


class Indexed:
    """A dataset whose items are (index, example), so a batch knows which examples it holds (for the cache)."""

    def __init__(self, examples: Sequence):
        self.examples = examples

    def __len__(self) -> int:
        return len(self.examples)

    def __getitem__(self, i: int):
        return i, self.examples[i]


def indexed_collate(collate: Callable[[list], dict]) -> Callable[[list], dict]:
    """`collate` over (index, example) items, with the indices as `example_idx`."""
    def wrapped(items):
        batch = collate([example for _, example in items])
        batch["example_idx"] = torch.tensor([i for i, _ in items], dtype=torch.long, device="cpu")  # moved with the batch
        return batch
    return wrapped


class TeacherCache:
    """The teacher's logits, attention scores and hidden states for every example of a KD pool, computed once
    (in batches, without gradients) and kept on the teacher's device, each example at its own length.

    Memory: per example, (layers + 1) x length x width hidden values plus layers x heads x length^2 scores
    (about 0.6 MB for MiniLM-L6 at 30 tokens in float32; 1.2 GB for a 2000-example pool)."""

    def __init__(self, teacher, examples: Sequence, collate: Callable[[list], dict], batch_size: int = 64,
                 scores: bool = True):
        from lmlab.models.batch import module_device

        self.scores = scores
        self.logits: list[torch.Tensor] = []
        self.hidden: list[list[torch.Tensor]] = []
        self.attn: list[list[torch.Tensor]] = []
        device = module_device(teacher)
        for start in range(0, len(examples), batch_size):
            batch = collate(list(examples[start:start + batch_size]))
            inputs = {k: v.to(device) for k, v in batch.items() if k != "labels"}
            with torch.no_grad(), intervene(teacher, *([Capture("scores")] if scores else [])) as cap:
                out = teacher(**inputs, output_hidden_states=True)
            mask = inputs["attention_mask"]
            lengths = mask.sum(-1).tolist()
            if any(not bool(mask[row, :n].all()) for row, n in enumerate(lengths)):
                raise ValueError("TeacherCache needs right-padded batches (the tokenizer pads on the left)")
            for row, n in enumerate(lengths):  # right padding: an example's tokens are its first n positions
                self.logits.append(out.logits[row].float())
                self.hidden.append([h[row, :n].float() for h in out.hidden_states])
                if scores:  # the capture holds {layer: scores}
                    layers = cap.store["scores"]
                    self.attn.append([layers[layer][row, :, :n, :n].float() for layer in sorted(layers)])

    def outputs(self, idx: torch.Tensor, width: int) -> tuple[torch.Tensor, list[torch.Tensor], list[torch.Tensor]]:
        """(logits, hidden states, scores) of the examples `idx`, zero-padded on the right to `width` tokens."""
        rows = idx.tolist()
        logits = torch.stack([self.logits[i] for i in rows])
        hidden = []
        for layer in range(len(self.hidden[rows[0]])):
            parts = [self.hidden[i][layer] for i in rows]
            h = parts[0].new_zeros(len(rows), width, parts[0].shape[-1])
            for r, p in enumerate(parts):
                h[r, :p.shape[0]] = p
            hidden.append(h)
        scores = []
        for layer in range(len(self.attn[rows[0]]) if self.scores else 0):
            parts = [self.attn[i][layer] for i in rows]
            s = parts[0].new_zeros(len(rows), parts[0].shape[0], width, width)
            for r, p in enumerate(parts):
                s[r, :, :p.shape[1], :p.shape[2]] = p
            scores.append(s)
        return logits, hidden, scores


def _teacher_outputs(teacher, inputs: dict, batch: dict, cache: "TeacherCache | None", want_scores: bool):
    """The teacher's logits, hidden states and (where the attention term is weighed) attention scores on `inputs`:
    read from `cache` where one is given, else computed without gradients."""
    if cache is not None:
        device = inputs["attention_mask"].device
        t_logits, t_hidden, t_scores = cache.outputs(batch["example_idx"], inputs["input_ids"].shape[1])
        return t_logits.to(device), [h.to(device) for h in t_hidden], [s.to(device) for s in t_scores]
    with torch.no_grad():
        with intervene(teacher, *([Capture("scores")] if want_scores else [])) as tcap:
            t = teacher(**inputs, output_hidden_states=True)
    return t.logits, t.hidden_states, (tcap.store["scores"] if want_scores else [])


def kd_loss(student, teacher, batch: dict, regression: bool = False, w_logit: float = 1.0, w_att: float = 1.0,
            w_hid: float = 1.0, layer_map: list[int] | None = None,
            cache: TeacherCache | None = None) -> tuple[torch.Tensor, dict]:
    """`layer_map[j]` is the teacher block that student block j learns from (layer reduction); None pairs
    blocks one to one. With `cache` (built over the same examples, and the batch carrying `example_idx`) the
    teacher's outputs are read from it instead of recomputed; the loss is the same."""
    device = module_device(student)  # a batch collated on the host meets the models where they are
    inputs = {k: v.to(device) for k, v in batch.items() if k not in ("labels", "example_idx")}
    mask = inputs.get("attention_mask")
    want_scores = w_att > 0
    t_logits, t_hidden, t_scores = _teacher_outputs(teacher, inputs, batch, cache, want_scores)
    with intervene(student, *([Capture("scores", grad=True)] if want_scores else [])) as scap:
        s = student(**inputs, output_hidden_states=True)
    # over several processes each term is this process's share of the global batch's mean (train.loop.share),
    # so that a slice with longer rows weighs as much per token as it does in one process
    pair_mask = _pair_mask(mask) if want_scores else None
    counts = {}
    if group_size() > 1 and mask is not None:
        rows, tokens, pairs = all_sum([s.logits.shape[0], mask.sum(), pair_mask.sum() if want_scores else 0])
        heads = scap.store["scores"][0].shape[1] if want_scores else 1
        counts = {"rows": rows, "hidden": tokens * s.hidden_states[0].shape[-1], "scores": pairs * heads}
    if regression:
        logit = F.mse_loss(s.logits.float(), t_logits.float())
    else:
        logit = F.kl_div(F.log_softmax(s.logits.float(), -1), F.log_softmax(t_logits.float(), -1), log_target=True,
                         reduction="batchmean")
    if counts:
        logit = share(logit * s.logits.shape[0], s.logits.shape[0], counts["rows"])
    pairs = list(enumerate(layer_map if layer_map is not None else range(len(s.hidden_states) - 1)))
    att = torch.zeros((), device=s.logits.device)
    if want_scores:
        for j, k in pairs:
            att = att + _masked_mse(scap.store["scores"][j].float(), t_scores[k].float(), pair_mask,
                                    counts.get("scores"))
    hid = _masked_mse(s.hidden_states[0].float(), t_hidden[0].float(), mask, counts.get("hidden"))  # embeddings
    for j, k in pairs:
        hid = hid + _masked_mse(s.hidden_states[j + 1].float(), t_hidden[k + 1].float(), mask, counts.get("hidden"))
    total = w_logit * logit + w_att * att + w_hid * hid
    return total, {"logit": float(logit.detach()), "attention": float(att.detach()), "hidden": float(hid.detach())}
