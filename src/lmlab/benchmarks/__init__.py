"""Benchmarks: ratios measured side by side in one run, never pass/fail on time.

Each benchmark is a function returning rows (dicts with at least `benchmark`, `case`, `value`,
`unit`); `lmlab bench` runs the registered ones and prints/writes one table. A module here registers each of its
benchmarks with `@benchmark("name")` (lmlab.benchmarks.registry) and names it in CATALOG.
"""

from __future__ import annotations

from typing import Callable

from lmlab.benchmarks.registry import BENCHMARKS

# what `lmlab bench --only` takes, a line each (read by `--help` without importing torch; a test checks it names
# exactly the registered benchmarks)
CATALOG = {
    "peers": "one activation-patching job in lmlab, TransformerLens and nnsight (needs the peers extra)",
    "interventions": "the intervention layer's cost on a forward pass, per intervention, vs plain sdpa",
    "load": "the embedded model's load times (GGUF de-quantized vs the cached safetensors)",
    "generation": "lmlab's greedy decoding (shared prefix, rows leaving) vs transformers' generate (takes --device)",
    "generation-cache": "lmlab's decoding with its cache written in place vs copied each step (takes --device)",
    "knockout-sweep": "the knockout study's batched sweep vs one forward pass per sample and layer cut-off",
    "packed-size": "the quantize study's packed checkpoints on disk vs the same matrices in float32",
    "kd-step": ("the quantize study's distillation step with the teacher's outputs cached vs recomputed, and under "
                "bf16 autocast"),
    "filler-generation": "the filler study's generation throughput, and ARM's cost on it",
    "attribution-patching": ("the sparse-circuits study's attribution patching vs activation patching (time and "
                             "rank agreement)"),
    "patching": "the sparse-circuits study's batched activation patching and effect curve vs one run per head",
    "latent-vs-cot": "the latent study's latent model vs CoT at inference: wall time and tokens per problem",
    "latent-codes": "the latent study's chain codes encoded in batches vs one problem a call (takes --device)",
    "replicates": "k = 3 replicates trained as one stacked module vs one after the other (takes --device)",
    "bad-input": "how fast each input error that needs no model fails, as a whole command",
}


def load_all() -> dict[str, Callable[..., list[dict]]]:
    from lmlab.benchmarks import (circuits, filler, generation, inputs, interventions, knockout,  # noqa: F401
                                  latent, peers, quantize, replicates)  # (they register themselves)

    return BENCHMARKS
