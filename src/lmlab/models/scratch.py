"""Models trained from scratch in a run (the latent study's base model, the sparse-circuits study's addition toy): a
Llama block stack built from a config, no download. `load_model("scratch", scratch=ScratchSpec(...))` returns one as
a `LoadedModel`, so every study gets its model through `load_model`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class ScratchSpec:
    vocab_size: int
    d_model: int = 128
    n_layers: int = 3
    n_heads: int = 4
    max_positions: int = 256
    bos: int = 0
    eos: int = 0
    pad: int = 0
    tie_embeddings: bool = True
    seed: int = 0


def build_scratch(spec: ScratchSpec):
    """A Llama-architecture causal LM with weights drawn from `spec.seed` (sdpa attention, fp32)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=spec.vocab_size, hidden_size=spec.d_model, intermediate_size=4 * spec.d_model,
                         num_hidden_layers=spec.n_layers, num_attention_heads=spec.n_heads,
                         num_key_value_heads=spec.n_heads, max_position_embeddings=spec.max_positions,
                         bos_token_id=spec.bos, eos_token_id=spec.eos, pad_token_id=spec.pad,
                         tie_word_embeddings=spec.tie_embeddings, attn_implementation="sdpa")
    torch.manual_seed(spec.seed)
    return LlamaForCausalLM(config).float()
