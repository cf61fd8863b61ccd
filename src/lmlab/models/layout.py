"""Where each model family keeps its layers, attention, heads and MLP.

One table (`FAMILIES`) describes every supported family; `layout_of(model)` resolves it against a
loaded model. Studies and interventions ask the layout, never `if family == ...` chains.

Vocabulary follows TransformerLens: `resid_pre`/`resid_post` are a block's input/output, `z` is the
input of the attention output projection split into heads, `pattern` is the post-softmax attention,
`mlp_act` is act(gate_proj(x)) in gated MLPs (act(fc_in(x)) in plain ones), `attn_out`/`mlp_out`
are the two sub-blocks' outputs before they are added to the residual stream.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING


from lmlab.errors import LmlabError

if TYPE_CHECKING:  # torch loads with the model, not with this table
    from torch import nn


@dataclass(frozen=True)
class FamilySpec:
    """Module paths of one family, relative to the model root (`layers`) or to a block (others)."""

    family: str
    layers: tuple[str, ...]  # candidate paths to the ModuleList of blocks, first that exists wins
    attn: str  # the attention module that calls the AttentionInterface
    o_proj: str  # its output projection; input = concatenated head outputs z
    mlp: str  # the MLP sub-block
    mlp_act: str  # the activation module inside the MLP
    gate_proj: str | None  # gated MLPs only
    mlp_out: str  # the module whose output is the MLP's contribution
    causal: bool = True
    gated_mlp: bool = True
    # what XTC quantizes: Q, K, V, attention output, FFN in and out (per block), and the word embeddings
    quant_linears: tuple[str, ...] = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
                                      "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")
    word_embeddings: tuple[str, ...] = ("model.embed_tokens", "embed_tokens", "model.language_model.embed_tokens")


_DECODER = dict(attn="self_attn", o_proj="self_attn.o_proj", mlp="mlp", mlp_act="mlp.act_fn",
                gate_proj="mlp.gate_proj", mlp_out="mlp")
_DECODER_LAYERS = ("model.layers", "layers", "model.language_model.layers")

FAMILIES: dict[str, FamilySpec] = {
    "llama": FamilySpec("llama", _DECODER_LAYERS, **_DECODER),
    "qwen2": FamilySpec("qwen2", _DECODER_LAYERS, **_DECODER),
    "olmo": FamilySpec("olmo", _DECODER_LAYERS, **_DECODER),
    "olmo2": FamilySpec("olmo2", _DECODER_LAYERS, **_DECODER),
    "gemma3": FamilySpec("gemma3", _DECODER_LAYERS, **_DECODER),
    "gpt2": FamilySpec("gpt2", ("transformer.h", "h"), attn="attn", o_proj="attn.c_proj", mlp="mlp",
                       mlp_act="mlp.act", gate_proj=None, mlp_out="mlp", gated_mlp=False,
                       quant_linears=("attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj"),
                       word_embeddings=("transformer.wte", "wte")),
    "bert": FamilySpec("bert", ("bert.encoder.layer", "encoder.layer"), attn="attention.self",
                       o_proj="attention.output.dense", mlp="intermediate",
                       mlp_act="intermediate.intermediate_act_fn", gate_proj=None,
                       mlp_out="output.dense", causal=False, gated_mlp=False,
                       quant_linears=("attention.self.query", "attention.self.key", "attention.self.value",
                                      "attention.output.dense", "intermediate.dense", "output.dense"),
                       word_embeddings=("bert.embeddings.word_embeddings", "embeddings.word_embeddings")),
}

# Hugging Face `config.model_type` -> family. Mistral and Qwen3 share Llama's module names.
MODEL_TYPES: dict[str, str] = {
    "llama": "llama", "mistral": "llama", "qwen2": "qwen2", "qwen3": "qwen2", "olmo": "olmo",
    "olmo2": "olmo2", "gemma3": "gemma3", "gemma3_text": "gemma3", "gpt2": "gpt2", "bert": "bert",
}


def supported_families() -> str:
    return ", ".join(sorted(FAMILIES))


def family_of(model_type: str) -> str:
    try:
        return MODEL_TYPES[model_type]
    except KeyError:
        raise LmlabError(
            f"architecture '{model_type}' is not supported; supported families: {supported_families()}"
        ) from None


def get_submodule(root: nn.Module, path: str) -> nn.Module:
    module = root
    for part in path.split("."):
        module = getattr(module, part)
    return module


def _text_config(config):
    """Gemma-3 multimodal configs keep the decoder's numbers in `text_config`."""
    return getattr(config, "text_config", None) or config


@dataclass
class Layout:
    """A resolved family spec: the actual modules of one loaded model, and its shape."""

    family: str
    spec: FamilySpec
    n_layers: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    d_model: int
    d_mlp: int
    context_length: int | None
    blocks: list[nn.Module] = field(repr=False)

    @property
    def causal(self) -> bool:
        return self.spec.causal

    def block(self, layer: int) -> nn.Module:
        return self.blocks[layer]

    def attn(self, layer: int) -> nn.Module:
        return get_submodule(self.blocks[layer], self.spec.attn)

    def o_proj(self, layer: int) -> nn.Module:
        return get_submodule(self.blocks[layer], self.spec.o_proj)

    def mlp(self, layer: int) -> nn.Module:
        return get_submodule(self.blocks[layer], self.spec.mlp)

    def mlp_act(self, layer: int) -> nn.Module:
        return get_submodule(self.blocks[layer], self.spec.mlp_act)

    def mlp_out(self, layer: int) -> nn.Module:
        return get_submodule(self.blocks[layer], self.spec.mlp_out)

    def describe(self) -> dict:
        return dict(family=self.family, layers=self.n_layers, heads=self.n_heads,
                    kv_heads=self.n_kv_heads, head_dim=self.head_dim, d_model=self.d_model)


def layout_of(model: nn.Module) -> Layout:
    """Resolve the family table against `model`; a clear error for unsupported architectures."""
    config = _text_config(model.config)
    family = family_of(getattr(model.config, "model_type", "?"))
    spec = FAMILIES[family]
    blocks = None
    for path in spec.layers:
        try:
            blocks = get_submodule(model, path)
            break
        except AttributeError:
            continue
    if blocks is None:
        raise LmlabError(f"could not find the layers of this {family} model (looked for {', '.join(spec.layers)})")
    n_heads = config.num_attention_heads
    d_model = config.hidden_size
    head_dim = getattr(config, "head_dim", None) or d_model // n_heads
    n_kv = getattr(config, "num_key_value_heads", None) or n_heads
    d_mlp = getattr(config, "intermediate_size", None) or getattr(config, "n_inner", None) or 4 * d_model
    ctx = getattr(config, "max_position_embeddings", None) or getattr(config, "n_positions", None)
    return Layout(family=family, spec=spec, n_layers=len(blocks), n_heads=n_heads, n_kv_heads=n_kv,
                  head_dim=head_dim, d_model=d_model, d_mlp=d_mlp, context_length=ctx, blocks=list(blocks))
