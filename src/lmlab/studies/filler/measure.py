"""S3 measurements that drive the model: prompts assembled from token ids, generation and scoring of one
condition (resumable), attention profiles and the layer-0 MLP mechanism check.

The placebo (its `Treatment`) keeps every inserted token in the prompt, at its position, and hides it: its column
of the attention mask is 0, as padding's is, so no query reads its key, in any layer or head, the prompt's later
tokens and the generated ones alike, while every token keeps the position it has with the insertion. The model's own
attention mask does this for every family, and in generation it travels with the cache as rows join and leave the
running batch (`greedy_answers(masked=...)`), which a knockout built for fixed columns of a fixed batch cannot
follow. A hidden token's own query reads the tokens before it (or nothing, as a left pad does: its output is never
read)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from lmlab import parallel
from lmlab.data.math import MathItem
from lmlab.data.scoring import last_boxed, last_number, math_equal
from lmlab.errors import LmlabError
from lmlab.generation import greedy_answers
from lmlab.interventions import Capture, intervene
from lmlab.interventions.arm import ActivationRedistribution
from lmlab.models import LoadedModel
from lmlab.studies.filler.config import Treatment

INSTRUCTION = "Please reason step by step, and put your final answer within \\boxed{}."
FILLERS = {"Mless": " /", "Mful": " he"}
NEAR_ZERO = 0.01  # |a| below this counts as a near-zero MLP activation


def build_ids(lm: LoadedModel, question: str, filler: str | None = None, count: int = 55,
              position: str = "between") -> tuple[list[int], list[int]]:
    """Prompt token ids and the positions of the inserted tokens (token-level assembly)."""
    if position not in ("before", "between", "after"):
        raise LmlabError(f"insertion position must be before, between or after, not '{position}'")
    tok = lm.tokenizer
    if tok.chat_template:
        rendered = tok.apply_chat_template([{"role": "user", "content": "\x00"}], tokenize=False,
                                           add_generation_prompt=True)
        head, tail = rendered.split("\x00")
    else:
        head, tail = "", "\nAnswer:"
    fill = tok(filler, add_special_tokens=False)["input_ids"] * count if filler and count else []
    parts = [head, "FILL" if position == "before" else None, INSTRUCTION, "FILL" if position == "between" else None,
             "\n" + question, "FILL" if position == "after" else None, tail]
    ids: list[int] = [] if tok.chat_template else tok("", add_special_tokens=True)["input_ids"]
    inserted: list[int] = []
    for part in parts:
        if part == "FILL":
            inserted = list(range(len(ids), len(ids) + len(fill)))
            ids += fill
        elif part:
            ids += tok(part, add_special_tokens=False)["input_ids"]
    return ids, inserted


SCORINGS = ("boxed", "boxed_or_last_number")


def score(text: str, answer: str, scoring: str = "boxed") -> tuple[int, str | None, str]:
    """(correct, prediction, what was read): the paper reads the last \\boxed{} only; the fallback to the
    last number of the text is an option (and the row says which one scored it)."""
    if scoring not in SCORINGS:
        raise LmlabError(f"unknown scoring '{scoring}'; use one of {', '.join(SCORINGS)}")
    pred, source = last_boxed(text), "boxed"
    if pred is None and scoring == "boxed_or_last_number":
        pred, source = last_number(text), "last_number"
    if pred is None:
        source = "none"
    return int(math_equal(pred, answer)), pred, source


@dataclass(frozen=True)
class Job:
    """One condition on a list of problems: what `evaluate` generates and scores."""
    items: Sequence[MathItem]
    condition: str
    filler: str | None = None
    count: int = 0
    position: str = "between"
    split: str = "test"
    sweep: str = ""


CHUNK = 64  # problems per resumable record


def evaluate(lm, run_dir, items, condition, config, treatment: Treatment, filler=None, count=0, position="between",
             arm=None, split="test", sweep="") -> list[dict]:
    """Generate and score one condition (see `evaluate_many`)."""
    return evaluate_many(lm, run_dir, [Job(items, condition, filler, count, position, split, sweep)], config,
                         treatment, arm)[0]


def evaluate_many(lm, run_dir, jobs: Sequence[Job], config, treatment: Treatment,
                  arm: dict | None = None) -> list[list[dict]]:
    """Generate and score several conditions, resumable in chunks of 64 problems; greedy when the profile draws
    one sample, else `samples` temperature-sampled runs (seeded), each row carrying its `sample`. Under the
    placebo's `treatment` every inserted token is masked from every query.

    The conditions' prompts share generation calls of up to four batches: a call's rows of every length
    keep its batch full (`greedy_answers` lets waiting prompts join as rows end), so only the call's last
    answers decode in a thin batch. A chunk is recorded once its call ends. Under ARM (`arm` = its c
    and p1) the rows run whole, as its random draws are per position."""
    n_samples = config.size("samples")
    budget = config.size("max_new_tokens")
    done = run_dir.done("answers")
    for sample in range(n_samples):
        sampling = dict(temperature=config.temperature, top_p=config.top_p, seed=config.seed + 7919 * sample) \
            if n_samples > 1 else {}
        entries = [(_key(job, start, sample, n_samples), job, job.items[start:start + CHUNK])
                   for job in jobs for start in range(0, len(job.items), CHUNK)]
        # the calls are made of the chunks still to do; under a launch (lmlab.parallel) of every chunk, so that
        # each process forms the same calls whatever the others have recorded, and takes every N-th of them
        todo = entries if parallel.is_distributed() else [e for e in entries if e[0] not in done]
        calls: list[list] = []
        for entry in todo:
            if not calls or sum(len(e[2]) for e in calls[-1]) + len(entry[2]) > 4 * config.size("batch_size"):
                calls.append([])
            calls[-1].append(entry)
        calls = [[e for e in call if e[0] not in done] for n, call in enumerate(calls) if parallel.mine(n)]
        calls = [call for call in calls if call]
        for n_call, call in enumerate(calls):
            desc = (f"{'ARM ' if arm else ''}generating {sum(len(chunk) for *_, chunk in call)} answers, "
                    f"call {n_call + 1}/{len(calls)}" + (f", sample {sample + 1}/{n_samples}" if n_samples > 1 else ""))
            outs = iter(_generate(lm, call, config, treatment, arm, sample, sampling, desc))
            for key, job, chunk in call:
                new = [_answer_row(lm, job, item, next(outs), sample, budget, config.size("scoring")) for item in chunk]
                run_dir.record("answers", key, new)
                done[key] = new
    if parallel.is_distributed():
        parallel.sync()
        done = run_dir.done("answers")
    return [[row for sample in range(n_samples) for start in range(0, len(job.items), CHUNK)
             for row in done[_key(job, start, sample, n_samples)]] for job in jobs]


def _generate(lm, call, config, treatment: Treatment, arm: dict | None, sample: int, sampling: dict,
              desc: str) -> list[list[int]]:
    """One shared generation call over its chunks' prompts, in order (under ARM, its rows whole)."""
    built = [build_ids(lm, item.question, job.filler, job.count, job.position)
             for _, job, chunk in call for item in chunk]
    prompts = [ids for ids, _ in built]
    budget, batch = config.size("max_new_tokens"), config.size("batch_size")
    if arm is None:
        return greedy_answers(lm, prompts, budget, batch, stop_at_newline=False, description=desc,
                              masked=treatment.hidden(built), **sampling)
    with intervene(lm, ActivationRedistribution(layers=[config.arm_layer], seed=config.seed + sample,
                                                scope=config.arm_scope, p_min=config.arm_p_min, **arm)):
        return greedy_answers(lm, prompts, budget, batch, stop_at_newline=False, description=desc,
                              share_prefix=False, masked=treatment.hidden(built), **sampling)


def _key(job: Job, start: int, sample: int, n_samples: int) -> str:
    return f"{job.split}|{job.condition}|{job.sweep}|{start}" + (f"|s{sample}" if n_samples > 1 else "")


def _answer_row(lm, job: Job, item: MathItem, out: list[int], sample: int, budget: int, scoring: str) -> dict:
    text = lm.tokenizer.decode(out, skip_special_tokens=True)
    correct, pred, source = score(text, item.answer, scoring)
    return dict(kind="answer", split=job.split, condition=job.condition, sweep=job.sweep, id=item.id, sample=sample,
                level=item.level, correct=correct, pred=pred, scored_by=source, gold=item.answer,
                new_tokens=len(out), hit_budget=int(len(out) >= budget))


def model_inputs(lm, ids: list[int], inserted: Sequence[int] = (), hide: bool = False) -> dict:
    """One prompt's forward inputs, every token at its own position; with `hide`, the inserted tokens' keys are
    masked from every query (their attention-mask columns 0), their positions kept (the placebo)."""
    enc = torch.tensor([ids], device=lm.device)
    mask = torch.ones_like(enc)
    if hide and len(inserted):
        mask[0, list(inserted)] = 0
    return dict(input_ids=enc, attention_mask=mask, position_ids=torch.arange(len(ids), device=lm.device)[None])


def attention_profile(pattern: torch.Tensor, keep: list[int], renormalise: bool = False) -> torch.Tensor:
    """pattern (heads, T, T) -> (heads, len(keep) - 1): for each kept key j (sink = keep[0] excluded), the
    mean over kept queries i > j of A[i, j]. With `renormalise`, each query's attention is first divided by its
    sum over the kept keys (the sink included), so the share other keys (the inserted tokens) take from a query
    cannot by itself lower what the kept keys get."""
    idx = torch.tensor(keep, device=pattern.device)
    a = pattern[:, idx][:, :, idx]
    if renormalise:
        a = a / a.sum(-1, keepdim=True).clamp_min(torch.finfo(a.dtype).tiny)
    n = len(keep)
    later = torch.tril(torch.ones(n, n, dtype=torch.bool, device=pattern.device), diagonal=-1)  # query i > key j
    sums = (a * later).sum(1)
    counts = later.sum(0).clamp_min(1)
    return (sums / counts)[:, 1:]


@torch.no_grad()
def _layer_reads(lm, prompts, layer, hide: bool = False):
    """For each condition and prompt: (aligned profiles, aligned profiles renormalised over the original keys, long
    profiles, layer-0 activations at original tokens), every head; `hide`: the inserted tokens masked (placebo)."""
    out = {}
    for cond, items in prompts.items():
        reads = []
        for ids, inserted in items:
            with intervene(lm, Capture("pattern", layers=layer), Capture("mlp_act", layers=0)) as (pat, act):
                lm.model(**model_inputs(lm, ids, inserted, hide))
            pattern = pat["pattern", layer][0].float().cpu()
            original = [p for p in range(len(ids)) if p not in set(inserted)]
            reads.append((attention_profile(pattern, original), attention_profile(pattern, original, renormalise=True),
                          attention_profile(pattern, list(range(len(ids)))),
                          act["mlp_act", 0][0, original].float().cpu()))
        out[cond] = reads
    return out


def profile_and_mechanism_rows(lm, prompts: dict, layer: int, hide: bool = False) -> list[dict]:
    """Attention-profile rows of every head (the analysis chooses the head, on problems it does not judge) and
    layer-0 MLP near-zero rows, from the same forward passes; `hide`: the inserted tokens masked (placebo)."""
    reads = _layer_reads(lm, prompts, layer, hide)
    rows = []
    for cond, items in reads.items():
        for p, (aligned, renormalised, long, act) in enumerate(items):
            for head in range(aligned.shape[0]):
                rows += [dict(kind="profile", view="aligned", condition=cond, problem=p, position=j + 1, head=head,
                              layer=layer, attention=float(v), renormalised=float(r))
                         for j, (v, r) in enumerate(zip(aligned[head].tolist(), renormalised[head].tolist()))]
                if cond != "None":
                    rows += [dict(kind="profile", view="long", condition=cond, problem=p, position=j + 1, head=head,
                                  layer=layer, attention=float(v)) for j, v in enumerate(long[head].tolist())]
            rows.append(dict(kind="mlp", condition=cond, problem=p,
                             near_zero_share=float((act.abs() < NEAR_ZERO).float().mean()),
                             mean_abs=float(act.abs().mean())))
    return rows
