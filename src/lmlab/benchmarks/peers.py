"""The same activation-patching job in lmlab, TransformerLens (its TransformerBridge) and nnsight, in one process.

The job: every head of the model patched in turn with its output (z, o_proj's input slice) on the corrupted IOI
prompts, the mean logit difference at the last position recorded for each; the same prompt pairs, the same
left-padded batch (input ids, attention mask, positions) for all three, the corrupted run and the clean baseline
counted in each time. The peers are used as their documentation shows: TransformerLens through
`run_with_hooks` on `blocks.{l}.attn.hook_z`, one forward per head (raw Hugging Face weights, eager attention,
which the bridge forces); nnsight through a trace per head that writes the head's slice of o_proj's input and
saves the last position's logits; and lmlab's earlier way (one full forward per head) beside its own. Each tool gets its own copy of the model. The cases alternate repeat by repeat
(the order rotating) and the best time of each is kept; the agreement of each peer's scores with lmlab's is
printed (Spearman over heads, the largest difference as a share of the clean metric).

Needs the `peers` extra (`pip install 'lmlab[peers]'`); without it the benchmark prints the one line that says so.
"""

from __future__ import annotations

import numpy as np

from lmlab.benchmarks.registry import alternate, benchmark

INSTALL = "the peers benchmark needs TransformerLens and nnsight: pip install 'lmlab[peers]'"


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


def _nnsight(hf_model, tokenizer, clean, corrupted, answer, distractor, n_layers, n_heads, head_dim):
    import warnings

    import torch
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from nnsight import LanguageModel

        model = LanguageModel(hf_model, tokenizer=tokenizer)
    layers = model.model.layers

    def run():
        with torch.no_grad():
            saved = []
            with model.trace(dict(corrupted)):
                for layer in range(n_layers):
                    saved.append(layers[layer].self_attn.o_proj.input.save())
            with model.trace(dict(clean)):
                base_logits = model.lm_head.output[:, -1].save()
            base = _logit_diff(base_logits, answer, distractor).mean()
            scores = np.zeros((n_layers, n_heads))
            for layer in range(n_layers):
                for head in range(n_heads):
                    cols = slice(head * head_dim, (head + 1) * head_dim)
                    with model.trace(dict(clean)):
                        layers[layer].self_attn.o_proj.input[:, :, cols] = saved[layer][:, :, cols]
                        logits = model.lm_head.output[:, -1].save()
                    scores[layer, head] = float(_logit_diff(logits, answer, distractor).mean() - base)
        return scores
    return run


@benchmark("peers")
def peers_bench(model: str = "smollm2-135m", prompts: int = 8, repeats: int = 2, **_) -> list[dict]:
    if not _installed():
        print(INSTALL)
        return [dict(benchmark="peers", case="TransformerLens and nnsight not installed", value=None, unit="",
                     ratio=None, target=None, note="pip install 'lmlab[peers]'", setup=INSTALL)]
    import torch
    from scipy.stats import spearmanr

    from lmlab.data.generated.circuits import make_task
    from lmlab.evaluation import encode_pairs
    from lmlab.models import load_model
    from lmlab.models.embedded import cached_model_dir
    from lmlab.studies.sparse_circuits import circuits

    lm = load_model(model)
    folder = str(cached_model_dir(model))
    task = make_task("ioi", lm.tokenizer, prompts, seed=0)
    if task.metric != "logit_diff":
        raise AssertionError("the peers job reads the IOI logit difference")
    clean, corrupted = encode_pairs(lm, task.prompts, False), encode_pairs(lm, task.prompts, True)
    answer = torch.tensor([p.answer for p in task.prompts])
    distractor = torch.tensor([p.distractor for p in task.prompts])
    layout = lm.layout
    other = load_model(model).model
    other.set_attn_implementation("sdpa")
    cases = {
        "lmlab": lambda: circuits.activation_scores(lm, task, prompts),
        "lmlab, one full forward per head (its earlier way)": lambda: circuits.activation_scores_naive(lm, task,
                                                                                                     prompts),
        "TransformerLens bridge": _transformer_lens(folder, clean, corrupted, answer, distractor, layout.n_layers,
                                                    layout.n_heads),
        "nnsight": _nnsight(other, lm.tokenizer, clean, corrupted, answer, distractor, layout.n_layers,
                            layout.n_heads, layout.head_dim),
    }
    names = list(cases)
    times, scores = alternate(cases, repeats)
    clean_metric = float(abs(circuits.metric_values(lm, task, prompts).mean()))
    ours = times["lmlab"]
    rows = []
    for name in names:
        t = times[name]
        rho = float(spearmanr(scores["lmlab"].ravel(), scores[name].ravel())[0])
        worst = float(np.abs(scores["lmlab"] - scores[name]).max()) / clean_metric
        rows.append(dict(benchmark="peers", case=f"{name}: every head patched", value=round(t, 2), unit="s",
                         ratio=round(t / ours, 2), target=None,
                         note=None if name == "lmlab" else "lmlab's speed-up (aim: >= 2.5x TransformerLens, "
                                                           ">= 2x its earlier way)",
                         setup=f"{model}, IOI, {prompts} prompt pairs, {scores[name].size} heads, best of {repeats}; "
                               f"vs lmlab's scores: Spearman {rho:.6f}, largest difference {worst:.1e} of the "
                               f"clean metric"))
    return rows
