"""The same activation-patching job in lmlab, TransformerLens (its TransformerBridge) and nnsight, in one process.

The job: every head of the model patched in turn with its output (z, the output projection's input slice) on the
corrupted IOI prompts, the mean logit difference at the last position recorded for each; the same prompt pairs,
the same left-padded batch (input ids, attention mask, positions) for every tool, the corrupted run and the clean
baseline counted in each time. Each peer runs the recipes its own documentation gives:

- TransformerLens: `run_with_hooks` on `blocks.{l}.attn.hook_z`, one forward per head (raw Hugging Face weights
  booted into the bridge, which forces eager attention).
- nnsight, one trace per head: a trace that writes the head's slice of the output projection's input and saves
  the last position's logits.
- nnsight, batched (its guide's way for many comparisons): one session; the corrupted run's projection inputs
  saved once; then traces whose invokes each patch one head on the clean prompts, as many heads in one forward as
  lmlab puts in one (at most 256 rows), each invoke saving only its metric.

lmlab's earlier way (one full forward per head) runs beside its own. The module an edit goes through is the output
projection lmlab's layout finds, addressed in nnsight by its name, so one recipe serves every architecture.

The job runs on the given model and on two more architectures that both peers support, built with random weights
at a published model's sizes (GPT-2 small, Pythia-160M) and the given model's tokenizer: the scores of random
weights mean nothing, but the time of the job does not depend on them. Each tool gets its own copy of a model.
The cases alternate repeat by repeat (the order rotating) and the best time of each is kept; the agreement of each
peer's scores with lmlab's is printed (Spearman over heads, the largest difference as a share of the clean
metric's scale).

Needs the `peers` extra (`pip install 'lmlab[peers]'`); without it the benchmark prints the one line that says so.
"""

from __future__ import annotations

import tempfile
from functools import reduce

import numpy as np

from lmlab.benchmarks.registry import alternate, benchmark

INSTALL = "the peers benchmark needs TransformerLens and nnsight: pip install 'lmlab[peers]'"

# random weights at these published sizes (timing only); the vocabulary is the tokenizer's
ARCHITECTURES = {
    "gpt2 (GPT-2 small's sizes)": ("gpt2", dict(n_embd=768, n_layer=12, n_head=12, n_inner=3072, n_positions=1024)),
    "gpt_neox (Pythia-160M's sizes)": ("gpt_neox", dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
                                                        intermediate_size=3072, rotary_pct=0.25,
                                                        max_position_embeddings=2048)),
}
MAX_ROWS = 256  # rows in one forward, for lmlab and nnsight's batched recipe alike
PEER_RECIPES = ("TransformerLens bridge", "nnsight, one trace per head", "nnsight, batched invokes in one session")


def _installed() -> bool:
    try:
        import nnsight  # noqa: F401
        import transformer_lens  # noqa: F401
    except ImportError:
        return False
    return True


def _logit_diff(logits, answer, distractor):
    return (logits.gather(1, answer[:, None])[:, 0] - logits.gather(1, distractor[:, None])[:, 0]).double()


def _transformer_lens(folder, clean, corrupted, answer, distractor, n_layers, n_heads):
    import torch
    from transformer_lens.model_bridge import TransformerBridge

    bridge = TransformerBridge.boot_transformers(folder, device="cpu")
    kw = lambda batch: dict(attention_mask=batch["attention_mask"], position_ids=batch["position_ids"])  # noqa: E731

    def run():
        with torch.no_grad():
            _, cache = bridge.run_with_cache(corrupted["input_ids"], **kw(corrupted),
                                             names_filter=lambda name: name.endswith("attn.hook_z"))
            base = _logit_diff(bridge(clean["input_ids"], **kw(clean))[:, -1], answer, distractor).mean()
            scores = np.zeros((n_layers, n_heads))
            for layer in range(n_layers):
                ref = cache[f"blocks.{layer}.attn.hook_z"]
                for head in range(n_heads):
                    def patch(z, hook, h=head, r=ref):
                        z[:, :, h] = r[:, :, h]
                        return z
                    logits = bridge.run_with_hooks(clean["input_ids"], **kw(clean),
                                                   fwd_hooks=[(f"blocks.{layer}.attn.hook_z", patch)])
                    scores[layer, head] = float(_logit_diff(logits[:, -1], answer, distractor).mean() - base)
        return scores
    return run


def _wrap_nnsight(hf_model, tokenizer, layout, source):
    """nnsight's LanguageModel around `hf_model` (a copy of `source`, the model `layout` describes), its head
    module's envoy, and each layer's output projection's envoy (by the name the projection has in `source`)."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from nnsight import LanguageModel

        model = LanguageModel(hf_model, tokenizer=tokenizer)
    names = {id(m): n for n, m in source.named_modules()}

    def envoy(module):
        return reduce(lambda e, part: e[int(part)] if part.isdigit() else getattr(e, part),
                      names[id(module)].split("."), model)
    return (model, envoy(source.get_output_embeddings()),
            [envoy(layout.o_proj(l)) for l in range(layout.n_layers)])


def _nnsight_per_head(hf_model, tokenizer, layout, source, clean, corrupted, answer, distractor):
    import torch

    model, head_out, o_proj = _wrap_nnsight(hf_model, tokenizer, layout, source)
    n_layers, n_heads, d = layout.n_layers, layout.n_heads, layout.head_dim

    def run():
        with torch.no_grad():
            saved = []
            with model.trace(dict(corrupted)):
                for layer in range(n_layers):
                    saved.append(o_proj[layer].input.save())
            with model.trace(dict(clean)):
                base_logits = head_out.output[:, -1].save()
            base = _logit_diff(base_logits, answer, distractor).mean()
            scores = np.zeros((n_layers, n_heads))
            for layer in range(n_layers):
                for head in range(n_heads):
                    cols = slice(head * d, (head + 1) * d)
                    with model.trace(dict(clean)):
                        o_proj[layer].input[:, :, cols] = saved[layer][:, :, cols]
                        logits = head_out.output[:, -1].save()
                    scores[layer, head] = float(_logit_diff(logits, answer, distractor).mean() - base)
        return scores
    return run


def _nnsight_batched(hf_model, tokenizer, layout, source, clean, corrupted, answer, distractor):
    import torch

    model, head_out, o_proj = _wrap_nnsight(hf_model, tokenizer, layout, source)
    n_layers, n_heads, d = layout.n_layers, layout.n_heads, layout.head_dim
    heads = [(l, h) for l in range(n_layers) for h in range(n_heads)]
    per_trace = max(1, MAX_ROWS // clean["input_ids"].shape[0])

    def run():
        with torch.no_grad(), model.session():
            values = list().save()  # a session's body runs in a frame of its own: only what is saved leaves it
            with model.trace(dict(corrupted)):
                saved = [o_proj[layer].input for layer in range(n_layers)]
            with model.trace(dict(clean)):
                values.append(_logit_diff(head_out.output[:, -1], answer, distractor).mean())
            for start in range(0, len(heads), per_trace):
                with model.trace() as tracer:
                    for layer, head in heads[start:start + per_trace]:
                        with tracer.invoke(dict(clean)):
                            cols = slice(head * d, (head + 1) * d)
                            o_proj[layer].input[:, :, cols] = saved[layer][:, :, cols]
                            values.append(_logit_diff(head_out.output[:, -1], answer, distractor).mean())
        values = np.array([float(v) for v in values])
        return (values[1:] - values[0]).reshape(n_layers, n_heads)
    return run


def _random_folder(model_type: str, sizes: dict, tokenizer, root) -> str:
    """A Hugging Face folder with random weights at `sizes` and `tokenizer`."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.for_model(model_type, vocab_size=len(tokenizer), pad_token_id=tokenizer.pad_token_id,
                                  bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id, **sizes)
    torch.manual_seed(0)
    folder = f"{root}/{model_type}"
    AutoModelForCausalLM.from_config(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def _one_model(name: str, folder: str, prompts: int, repeats: int) -> list[dict]:
    import torch

    from lmlab.data.generated.circuits import make_task
    from lmlab.evaluation import encode_pairs
    from lmlab.models import load_model
    from lmlab import circuits

    lm = load_model(folder)
    task = make_task("ioi", lm.tokenizer, prompts, seed=0)
    if task.metric != "logit_diff":
        raise AssertionError("the peers job reads the IOI logit difference")
    clean, corrupted = encode_pairs(lm, task.prompts, False), encode_pairs(lm, task.prompts, True)
    answer = torch.tensor([p.answer for p in task.prompts])
    distractor = torch.tensor([p.distractor for p in task.prompts])
    layout = lm.layout
    pair = (clean, corrupted, answer, distractor)
    copies = [load_model(folder).model for _ in range(2)]
    for other in copies:
        other.set_attn_implementation("sdpa")
    cases = {
        "lmlab": lambda: circuits.activation_scores(lm, task, prompts, max_rows=MAX_ROWS),
        "lmlab, one full forward per head (its earlier way)": lambda: circuits.activation_scores_naive(lm, task,
                                                                                                     prompts),
        "TransformerLens bridge": _transformer_lens(folder, *pair, layout.n_layers, layout.n_heads),
        "nnsight, one trace per head": _nnsight_per_head(copies[0], lm.tokenizer, layout, lm.model, *pair),
        "nnsight, batched invokes in one session": _nnsight_batched(copies[1], lm.tokenizer, layout, lm.model, *pair),
    }
    times, scores = alternate(cases, repeats)
    return _peer_rows(name, times, scores, f"{name}, IOI, {prompts} prompt pairs, {scores['lmlab'].size} heads, best "
                                          f"of {repeats}")


def _peer_rows(name: str, times: dict, scores: dict, setup: str) -> list[dict]:
    """A row per case (its time, its ratio to lmlab's, its scores against lmlab's) and one for the fastest peer."""
    from scipy.stats import spearmanr

    scale = float(np.abs(scores["lmlab"]).max()) or 1.0
    ours = times["lmlab"]
    rows = []
    for case in times:
        rho = float(spearmanr(scores["lmlab"].ravel(), scores[case].ravel())[0])
        worst = float(np.abs(scores["lmlab"] - scores[case]).max()) / scale
        rows.append(dict(benchmark="peers", case=f"{name}: {case}", value=round(times[case], 2), unit="s",
                         ratio=round(times[case] / ours, 2), target=None, spearman=rho, largest_difference=worst,
                         note=None if case == "lmlab" else "lmlab's speed-up",
                         setup=f"{setup}; vs lmlab's scores: Spearman {rho:.6f}, largest difference {worst:.1e} of "
                               f"the largest score"))
    best = min(PEER_RECIPES, key=lambda c: times[c])
    rows.append(dict(benchmark="peers", case=f"{name}: the fastest peer recipe ({best})", value=round(times[best], 2),
                     unit="s", ratio=round(times[best] / ours, 2), target=None,
                     note="lmlab's speed-up over it (aim: >= 2.5x)", setup=setup))
    return rows


@benchmark("peers")
def peers_bench(model: str = "smollm2-135m", prompts: int = 8, repeats: int = 2, **_) -> list[dict]:
    if not _installed():
        print(INSTALL)
        return [dict(benchmark="peers", case="TransformerLens and nnsight not installed", value=None, unit="",
                     ratio=None, target=None, note="pip install 'lmlab[peers]'", setup=INSTALL)]
    from lmlab.models import load_model
    from lmlab.models.embedded import EMBEDDED, cached_model_dir

    folder = str(cached_model_dir(model)) if model in EMBEDDED else model
    rows = _one_model(model, folder, prompts, repeats)
    tokenizer = load_model(folder).tokenizer
    with tempfile.TemporaryDirectory() as root:
        for name, (model_type, sizes) in ARCHITECTURES.items():
            rows += _one_model(name, _random_folder(model_type, sizes, tokenizer, root), prompts, repeats)
    return rows
