"""Where each model family keeps its layers, attention, heads and MLP.

`layout_of(model)` finds them in the module tree and the config (`discover`): the block list (the module
list as long as the config's layers whose blocks hold an attention), each block's attention (the module
whose forward calls transformers' attention interface, which lmlab's attention function replaces), its
output projection (the linear layer fed by the concatenated heads), the MLP and its activation, the word
embeddings. `FAMILIES` keeps the families whose paths were spelled out before discovery (the embedded
models' among them, so their layouts stay as they were) and the encoders. `architectures.json` records,
for each architecture transformers registers, whether the conformance checks of lmlab.conformance
passed on a tiny random instance of it; a refused architecture is refused here with its reason.
Studies and interventions ask the layout, never `if family == ...` chains.

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
    # each block's mixer (`block_kind`), found by discovery; empty: every block holds softmax attention
    kinds: tuple[str, ...] = ()


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


def family_of(model_type: str, encoder: bool = False) -> str:
    """The family a `config.model_type` belongs to: a spelled-out one of FAMILIES, else the type itself (its
    layout is discovered); an architecture the conformance checks refused (as a decoder, or as an encoder where
    `encoder`) raises with their reason."""
    if model_type in MODEL_TYPES:
        return MODEL_TYPES[model_type]
    from lmlab.models.architectures import refusal

    why = refusal(model_type, encoder=encoder)
    if why:
        raise LmlabError(f"architecture '{model_type}' is not supported{' as an encoder' if encoder else ''}: {why}")
    return model_type


def is_encoder(config) -> bool:
    """Whether a config describes a bidirectional encoder: a type transformers registers for masked language
    modelling (BERT, RoBERTa, DeBERTa, ...) not configured as a decoder (`is_decoder`, which their causal-LM heads
    set). Decoder-only language models are registered for no masked-LM head."""
    model_type = getattr(config, "model_type", "")
    spec = FAMILIES.get(MODEL_TYPES.get(model_type, ""))
    if spec is not None:
        return not spec.causal
    from transformers.models.auto.modeling_auto import MODEL_FOR_MASKED_LM_MAPPING_NAMES

    return model_type in MODEL_FOR_MASKED_LM_MAPPING_NAMES and not getattr(config, "is_decoder", False)


def get_submodule(root: nn.Module, path: str) -> nn.Module:
    module = root
    for part in path.split("."):
        module = getattr(module, part)
    return module


def text_config(config):
    """Gemma-3 multimodal configs keep the decoder's numbers in `text_config`."""
    return getattr(config, "text_config", None) or config


ATTENTION = "attention"
# what mixes tokens in a block that holds no softmax attention (or holds one and more), by the class names of its
# modules, first match wins; a block with neither holds only an MLP ("mlp") or something lmlab does not name ("other")
_MIXER_KINDS = (("linear attention", ("deltanet", "deltaattention", "linearattention", "lightningattention")),
                ("state space", ("mamba", "ssm", "mixer")),
                ("recurrent", ("recurrent", "lstm", "rwkv", "rglru")),
                ("convolution", ("shortconv", "conv")))
_MLP_MARKERS = ("mlp", "moe", "expert", "feedforward", "ffn")


@dataclass
class Layout:
    """A resolved family spec: the actual modules of one loaded model, and its shape.

    A hybrid (Qwen3.5, Nemotron-H, Jamba, ...) holds softmax attention in some blocks only: `kinds` names each
    block's mixer ("attention", "linear attention", "state space", "recurrent", "convolution", "mlp", "other"; a
    block mixing with attention and another mixer side by side, Falcon-H1's, "attention + state space"), and
    `attention_layers` are the blocks whose heads lmlab reaches. Asking a block without attention for its attention
    raises with the block's kind."""

    family: str
    spec: FamilySpec
    n_layers: int
    n_heads: int
    n_kv_heads: int
    head_dims: tuple[int, ...]  # each layer's head size (what its output projection reads per head; 0: no attention)
    d_model: int
    d_mlp: int
    context_length: int | None
    blocks: list[nn.Module] = field(repr=False)
    kinds: tuple[str, ...] = ()

    def __post_init__(self):
        if not self.kinds:
            self.kinds = (ATTENTION,) * self.n_layers

    @property
    def causal(self) -> bool:
        return self.spec.causal

    @property
    def attention_layers(self) -> tuple[int, ...]:
        """The layers whose blocks hold softmax attention (every layer of a plain transformer)."""
        return tuple(i for i, kind in enumerate(self.kinds) if kind.startswith(ATTENTION))

    @property
    def mixing_layers(self) -> tuple[int, ...]:
        """The layers whose blocks move information between positions outside softmax attention (a hybrid's
        linear-attention, state-space, recurrent and convolution mixers)."""
        return tuple(i for i, kind in enumerate(self.kinds) if kind not in (ATTENTION, "mlp"))

    @property
    def hybrid(self) -> bool:
        return any(kind != ATTENTION for kind in self.kinds)

    @property
    def head_dim(self) -> int:
        """The head size of every attention layer; a model whose layers differ (Gemma 4's full-attention layers) has
        none, and code that needs one asks `head_dim_of(layer)`."""
        sizes = {self.head_dims[i] for i in self.attention_layers}
        if len(sizes) > 1:
            raise LmlabError(f"this {self.family} model's heads differ in size per layer "
                             f"({' and '.join(map(str, sorted(sizes)))}); ask one layer's")
        return sizes.pop()

    def head_dim_of(self, layer: int) -> int:
        self.check_attention(layer)
        return self.head_dims[layer]

    def check_attention(self, layer: int) -> None:
        """Raise where `layer` holds no softmax attention (a hybrid's other blocks), naming what it holds."""
        if not self.kinds[layer].startswith(ATTENTION):
            raise LmlabError(f"layer {layer} of this {self.family} model is a {self.kinds[layer]} block, with no "
                             f"softmax attention heads (its attention layers: {layer_ranges(self.attention_layers)})")

    def check_heads_everywhere(self, what: str) -> None:
        """Raise where some layer holds no softmax attention: `what` ranks or gates the heads of every layer."""
        others = [i for i in range(self.n_layers) if i not in self.attention_layers]
        if others:
            raise LmlabError(f"{what} reads the heads of every layer, and layers {layer_ranges(others)} of this "
                             f"{self.family} model hold no softmax attention ({layer_kinds_text(self.kinds)}); "
                             f"hybrids are not supported there yet")

    def block(self, layer: int) -> nn.Module:
        return self.blocks[layer]

    def mixer(self, layer: int) -> nn.Module:
        """A hybrid block's mixer other than softmax attention (its linear attention, state space, recurrence or short
        convolution module)."""
        path = mixer_path(self.blocks[layer], self.spec.attn) if layer in self.mixing_layers else None
        if path is None:
            raise LmlabError(f"layer {layer} of this {self.family} model mixes positions with softmax attention only")
        return get_submodule(self.blocks[layer], path)

    def attn(self, layer: int) -> nn.Module:
        self.check_attention(layer)
        return get_submodule(self.blocks[layer], self.spec.attn)

    def o_proj(self, layer: int) -> nn.Module:
        self.check_attention(layer)
        return get_submodule(self.blocks[layer], self.spec.o_proj)

    def mlp(self, layer: int) -> nn.Module:
        return get_submodule(self.blocks[layer], self._mlp_path(self.spec.mlp))

    def mlp_act(self, layer: int) -> nn.Module:
        if not self.spec.mlp_act:
            raise LmlabError(f"the MLP of this {self.family} model has no activation module of its own to hook")
        return get_submodule(self.blocks[layer], self.spec.mlp_act)

    def mlp_out(self, layer: int) -> nn.Module:
        return get_submodule(self.blocks[layer], self._mlp_path(self.spec.mlp_out))

    def _mlp_path(self, path: str) -> str:
        if not path:
            raise LmlabError(f"this {self.family} model's MLPs are not one sub-block of every block (a hybrid whose "
                             f"MLPs sit in blocks of their own), so there is no MLP per layer to read or edit")
        return path

    def describe(self) -> dict:
        sizes = sorted({self.head_dims[i] for i in self.attention_layers})
        out = dict(family=self.family, layers=self.n_layers, heads=self.n_heads,
                   kv_heads=self.n_kv_heads, head_dim=sizes[0] if len(sizes) == 1 else sizes, d_model=self.d_model)
        if self.hybrid:
            out["layer_kinds"] = layer_kinds_text(self.kinds)
        return out


def layer_kinds_text(kinds: tuple[str, ...]) -> str:
    """Each kind of block with the layers holding it, e.g. "attention 3, 7; linear attention 0-2, 4-6"."""
    by_kind: dict[str, list[int]] = {}
    for i, kind in enumerate(kinds):
        by_kind.setdefault(kind, []).append(i)
    return "; ".join(f"{kind} {layer_ranges(layers)}" for kind, layers in by_kind.items())


def layer_ranges(layers) -> str:
    """0, 1, 2, 5 -> "0-2, 5"."""
    parts: list[list[int]] = []
    for layer in layers:
        if parts and layer == parts[-1][-1] + 1:
            parts[-1].append(layer)
        else:
            parts.append([layer])
    return ", ".join(f"{p[0]}-{p[-1]}" if len(p) > 2 else ", ".join(map(str, p)) for p in parts) or "none"


# --- discovery: where an architecture not spelled out in FAMILIES keeps its parts
_LAYER_PATHS = ("model.layers", "layers", "model.language_model.layers", "transformer.h", "h", "gpt_neox.layers",
                "model.decoder.layers", "transformer.blocks", "transformer.layers", "model.transformer.h",
                "backbone.layers", "backbone.blocks")
_O_NAMES = ("o_proj", "out_proj", "dense", "c_proj", "wo", "Wo", "o", "proj", "out", "out_lin", "o_b_proj")
_MLP_NAMES = ("mlp", "feed_forward", "ffn", "block_sparse_moe", "moe", "mlp_block", "ff")
_ACT_NAMES = ("act_fn", "act", "activation_fn", "activation", "act_layer", "activation_function", "act_func")
_FLAT_MLP = (("fc1", "fc2"), ("fc_in", "fc_out"), ("dense_h_to_4h", "dense_4h_to_h"))
_GATE_NAMES = ("gate_proj", "w1", "gate_up_proj", "fc1_g", "wi_0")
_ATTN_MARKERS = ("ALL_ATTENTION_FUNCTIONS", "attention_interface")
# attentions that compute in a method of their own, which lmlab's interventions replace with an adapter calling its
# attention function (lmlab.interventions.legacy)
LEGACY_ATTENTION = ("transformers.models.gpt_neo.modeling_gpt_neo.GPTNeoSelfAttention",
                    "transformers.models.openai.modeling_openai.Attention",
                    "transformers.models.xglm.modeling_xglm.XGLMAttention",
                    "transformers.models.trocr.modeling_trocr.TrOCRAttention")
_calls_cache: dict[type, bool] = {}


def calls_attention_interface(module) -> bool:
    """Whether the module's forward dispatches through transformers' attention interface (the function lmlab's
    attention replaces): its source names the interface, or lmlab adapts its own method (`LEGACY_ATTENTION`)."""
    cls = type(module)
    if f"{cls.__module__}.{cls.__qualname__}" in LEGACY_ATTENTION:
        return True
    if cls not in _calls_cache:
        import inspect

        try:
            source = inspect.getsource(cls.forward)
        except (OSError, TypeError):
            source = ""
        _calls_cache[cls] = any(marker in source for marker in _ATTN_MARKERS)
    return _calls_cache[cls]


def _is_linear(module) -> bool:
    from torch import nn
    from transformers.pytorch_utils import Conv1D

    return isinstance(module, (nn.Linear, Conv1D))


def _in_features(module) -> int:
    weight = module.weight
    return weight.shape[0] if type(module).__name__ == "Conv1D" else weight.shape[1]


def _is_activation(module) -> bool:
    import transformers.activations as acts
    from torch import nn

    kinds = tuple(c for c in vars(acts).values() if isinstance(c, type) and issubclass(c, nn.Module))
    return isinstance(module, kinds) or type(module).__module__.startswith("torch.nn.modules.activation")


def _find_blocks(model, n_layers: int):
    """(path, ModuleList): a known path first, else the first module list of n_layers blocks some of which hold an
    attention."""
    from torch import nn

    for path in _LAYER_PATHS:
        try:
            found = get_submodule(model, path)
        except AttributeError:
            continue
        if isinstance(found, nn.ModuleList) and len(found) == n_layers:
            return path, found
    for path, found in model.named_modules():
        if isinstance(found, nn.ModuleList) and len(found) == n_layers and len(found) and any(
                calls_attention_interface(m) for block in found for m in block.modules()):
            return path, found
    return None, None


def _mixers(block, attn: str) -> list[tuple[str, str]]:
    """(child name, kind) of each child of `block` that mixes positions besides (or instead of) its softmax attention,
    read off class names (`_MIXER_KINDS`; norms, MLPs and the attention itself aside)."""
    has_attention = _has(block, attn) and calls_attention_interface(get_submodule(block, attn))
    found = []
    for name, child in block.named_children():
        label = _own_name(type(child).__name__, type(block).__name__).lower()
        if (has_attention and (name == attn.split(".")[0] or calls_attention_interface(child))) or "norm" in label \
                or any(m in label for m in _MLP_MARKERS):
            continue
        kind = next((k for k, marks in _MIXER_KINDS if any(m in label for m in marks)), None)
        if kind:
            found.append((name, kind))
    return found


def mixer_path(block, attn: str) -> str | None:
    """The child of `block` that mixes positions besides (or instead of) its softmax attention; None where none."""
    return next((name for name, _ in _mixers(block, attn)), None)


def block_kind(block, attn: str) -> str:
    """What mixes positions in `block`: "attention" where its module at `attn` calls transformers' attention
    interface, else (or besides, joined with " + ") the kinds of its other mixers (`_mixers`)."""
    has_attention = _has(block, attn) and calls_attention_interface(get_submodule(block, attn))
    others = list(dict.fromkeys(kind for _, kind in _mixers(block, attn)))
    if has_attention:
        return " + ".join([ATTENTION, *others])
    if others:
        return others[0]
    names = " ".join(f"{_own_name(type(c).__name__, type(block).__name__)} {n}".lower() for n, c in block.named_children())
    return "mlp" if any(m in names for m in _MLP_MARKERS) else "other"


def _own_name(name: str, block_name: str) -> str:
    """A module's class name without the family's words it shares with its block's ("Qwen3_5MoeGatedDeltaNet" in a
    "Qwen3_5MoeDecoderLayer": "GatedDeltaNet"; a family's name can say MoE or Recurrent of every module)."""
    import re

    words, block_words = re.findall(r"[A-Z]?[^A-Z]*", name), re.findall(r"[A-Z]?[^A-Z]*", block_name)
    shared = next((i for i, (a, b) in enumerate(zip(words, block_words)) if a != b), min(len(words), len(block_words)))
    return "".join(words[shared:]) or name


def _output_projection(model_type: str, attention: list, attn: str, n_heads: int) -> str:
    """The path (in a block) of the linear layer the heads feed, in the attention blocks `attention` whose attention
    sits at `attn`; LmlabError where there is none, or where its input is no whole number of heads."""
    block = attention[0]
    attn_module = get_submodule(block, attn)
    o_proj = next((f"{attn}.{n}" for n in _O_NAMES if _has(attn_module, n) and _is_linear(getattr(attn_module, n))
                   and _in_features(getattr(attn_module, n)) % n_heads == 0), None)
    parent = attn.rpartition(".")[0]
    if o_proj is None and parent and _has(block, f"{parent}.output.dense"):  # BERT's layout: attention.output.dense
        o_proj = f"{parent}.output.dense"
    if o_proj is None:
        raise LmlabError(f"architecture '{model_type}': its attention has no output projection fed by the heads "
                         f"(looked for {', '.join(_O_NAMES)})")
    widths = sorted({_in_features(get_submodule(b, o_proj)) for b in attention})
    if any(w % n_heads for w in widths):
        raise LmlabError(f"architecture '{model_type}': its output projections read {' or '.join(map(str, widths))} "
                         f"features, not a whole number of heads of {n_heads}")
    return o_proj


def discover(model: nn.Module) -> FamilySpec:
    """A FamilySpec read off `model`'s module tree and config; LmlabError with one sentence where a part the
    studies need is not there. A hybrid's attention is found in the blocks that hold one; `kinds` names each
    block's mixer."""
    config = text_config(model.config)
    model_type = getattr(model.config, "model_type", "?")
    n_layers = getattr(config, "num_hidden_layers", None)
    path, blocks = _find_blocks(model, n_layers)
    if blocks is None:
        raise LmlabError(f"architecture '{model_type}': no list of {n_layers} blocks holding an attention that "
                         f"calls transformers' attention interface was found")
    found = [[name for name, m in b.named_modules() if name and calls_attention_interface(m)] for b in blocks]
    if not any(found):
        _refuse_without_attention(model_type, blocks)
    attn = min((name for names in found for name in names), key=lambda n: (len(n), n))
    kinds = tuple(block_kind(b, attn) for b in blocks)
    attention = [b for b, kind in zip(blocks, kinds) if kind.startswith(ATTENTION)]
    if any(names and not kind.startswith(ATTENTION) for names, kind in zip(found, kinds)):
        raise LmlabError(f"architecture '{model_type}': its blocks keep their attention at different paths "
                         f"({', '.join(sorted({n for names in found for n in names}))})")
    modules = [get_submodule(b, attn) for b in attention]
    shared = [i for i, kind in enumerate(kinds) if kind.startswith(ATTENTION)] if len(set(map(id, modules))) < len(
        modules) else []
    if shared:
        raise LmlabError(f"architecture '{model_type}': one attention module serves several layers "
                         f"({layer_ranges(shared)}; a shared block called at each depth), so an edit of one layer's "
                         f"heads would act at every layer that shares it")
    block = attention[0]
    o_proj = _output_projection(model_type, attention, attn, config.num_attention_heads)
    hybrid = any(kind != ATTENTION for kind in kinds)
    try:
        mlp, mlp_act, gate, mlp_out = _find_mlp(model_type, blocks)
    except LmlabError:
        if not hybrid:
            raise
        mlp, mlp_act, gate, mlp_out = "", None, None, ""  # MLPs in blocks of their own (Nemotron-H)
    linears = block_linears(block, config)
    return FamilySpec(model_type, (path,), attn=attn, o_proj=o_proj, mlp=mlp, mlp_act=mlp_act or "",
                      gate_proj=gate, mlp_out=mlp_out, gated_mlp=gate is not None, quant_linears=linears,
                      word_embeddings=_embedding_path(model), causal=not is_encoder(model.config),
                      kinds=kinds if hybrid else ())


def _refuse_without_attention(model_type: str, blocks) -> None:
    """Why no block holds an attention lmlab reaches: none holds softmax attention at all (Mamba, xLSTM), or the
    family's attention computes in a forward of its own."""
    mixers = {block_kind(b, "") for b in blocks} - {"mlp", "other"}
    if mixers:
        raise LmlabError(f"architecture '{model_type}': no block holds softmax attention (its blocks mix with "
                         f"{' and '.join(sorted(mixers))}), and lmlab's studies read attention heads")
    own = next((type(m).__name__ for b in blocks for m in b.modules() if "attention" in type(m).__name__.lower()), "")
    raise LmlabError(f"architecture '{model_type}': its attention{f' ({own})' if own else ''} computes in a "
                     f"forward of its own, not through transformers' attention interface, and lmlab has no "
                     f"adapter for it, so lmlab cannot reach its heads")


def _find_mlp(model_type: str, blocks) -> tuple[str, str | None, str | None, str]:
    """(the MLP, its activation, its gate projection, the module whose output is its contribution), as paths in a
    block: a sub-block every block has, BERT's intermediate/output pair, or an MLP whose layers sit in the block
    itself (OPT, XGLM). The activation and the gate only where every block has them (dense blocks before mixture-
    of-experts ones share neither)."""
    block = blocks[0]
    mlp = next((n for n in _MLP_NAMES if all(_has(b, n) for b in blocks)), None)
    if mlp is None and _has(block, "intermediate.dense") and _has(block, "output.dense"):
        act = next((n for n in ("intermediate_act_fn", *_ACT_NAMES) if _has(block, f"intermediate.{n}")), None)
        return "intermediate", f"intermediate.{act}" if act else None, None, "output.dense"
    flat = next(((i, o) for i, o in _FLAT_MLP if _has(block, i) and _has(block, o)), None)
    if mlp is None and flat is not None:
        return flat[1], next((n for n in _ACT_NAMES if _has(block, n)), None), None, flat[1]
    if mlp is None:
        raise LmlabError(f"architecture '{model_type}': no MLP sub-block (looked for {', '.join(_MLP_NAMES)})")
    module = get_submodule(block, mlp)
    act = next((n for n in _ACT_NAMES if _has(module, n) and hasattr(getattr(module, n), "register_forward_hook")),
               None)
    if act is None:  # an activation module found by its class, one level down
        act = next((n for n, m in module.named_children() if _is_activation(m)), None)
    if act and not all(_has(b, f"{mlp}.{act}") for b in blocks):
        act = None
    gate = next((n for n in _GATE_NAMES if all(_has(b, f"{mlp}.{n}") for b in blocks)), None)
    return mlp, f"{mlp}.{act}" if act else None, f"{mlp}.{gate}" if gate else None, mlp


def _embedding_path(model) -> tuple[str, ...]:
    embeddings = model.get_input_embeddings()
    path = next((n for n, m in model.named_modules() if m is embeddings), None)
    return (path,) if path else ()


def _has(module, path: str) -> bool:
    try:
        return get_submodule(module, path) is not None  # (a hybrid's block may set its absent mixer to None)
    except AttributeError:
        return False


def block_linears(block, config) -> tuple[str, ...]:
    """Paths of the linear layers of one block that XTC quantizes: every linear (or GPT-2 Conv1D) in it but a
    mixture of experts' router."""
    return tuple(n for n, m in block.named_modules() if n and _is_linear(m) and not _is_router(n, m, config))


def fused_experts(block) -> list[str]:
    """Parameters of a block that stack one matrix per expert in a 3-D tensor (transformers' fused experts), named
    as the module's attributes (a parametrized one too: `experts.gate_up_proj`, not its `.parametrizations.
    gate_up_proj.original`)."""
    import re

    return [re.sub(r"\.parametrizations\.(\w+)\.original$", r".\1", n) for n, p in block.named_parameters()
            if p.dim() == 3 and "expert" in n]


def _is_router(name: str, module, config) -> bool:
    """A mixture of experts' router: a linear layer with one output per expert (not quantized by XTC)."""
    experts = [getattr(config, k, None) for k in ("num_experts", "num_local_experts", "n_routed_experts",
                                                   "moe_num_experts")]
    width = module.weight.shape[0] if _is_linear(module) and type(module).__name__ != "Conv1D" else None
    return any(e and width == e for e in experts) and name.rsplit(".", 1)[-1] in ("gate", "router", "router_proj",
                                                                                 "wg", "classifier")


def _config_value(config, name: str):
    """A config value, or None where it is missing or varies per layer (the config then refuses a global read)."""
    try:
        return getattr(config, name, None)
    except Exception:  # noqa: BLE001 - transformers raises its own error for per-layer attributes
        return None


def spec_of(model: nn.Module) -> FamilySpec:
    model_type = getattr(model.config, "model_type", "?")
    family = family_of(model_type, encoder=is_encoder(model.config))
    if family in FAMILIES:
        return FAMILIES[family]
    found = model.__dict__.get("_lmlab_spec")
    if found is None:  # found once per model: its module tree does not change under lmlab's edits
        found = model.__dict__["_lmlab_spec"] = discover(model)
    return found


def layout_of(model: nn.Module) -> Layout:
    """Resolve the family's parts against `model`; a clear error for unsupported architectures."""
    config = text_config(model.config)
    spec = spec_of(model)
    family = spec.family
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
    head_dims = (_config_value(config, "head_dim") or d_model // n_heads,) * len(blocks)
    kinds = tuple(block_kind(b, spec.attn) for b in blocks) if spec.kinds else ()  # (blocks a model kept)
    if family not in FAMILIES:  # z's head size is what each layer's output projection reads per head
        head_dims = tuple(_in_features(get_submodule(b, spec.o_proj)) // n_heads
                          if not kinds or kinds[i].startswith(ATTENTION) else 0 for i, b in enumerate(blocks))
    n_kv = _config_value(config, "num_key_value_heads") or n_heads
    d_mlp = _config_value(config, "intermediate_size") or _config_value(config, "n_inner") or 4 * d_model
    ctx = getattr(config, "max_position_embeddings", None) or getattr(config, "n_positions", None)
    return Layout(family=family, spec=spec, n_layers=len(blocks), n_heads=n_heads, n_kv_heads=n_kv,
                  head_dims=head_dims, d_model=d_model, d_mlp=d_mlp, context_length=ctx, blocks=list(blocks),
                  kinds=kinds)
