"""The conformance checks behind `lmlab models --architectures`: every causal-LM type transformers registers, a tiny
random instance of it, and each of lmlab's interventions against a computation written here.

The references share no code with lmlab's attention function: the architecture's own eager attention from its
modeling file (its scaling, soft-capping, sinks and masks as transformers wrote them) with blocked pairs written
into its mask; the heads' slice of the output projection's input edited by a plain forward pre-hook; the residual
stream from `output_hidden_states`; the pattern from `output_attentions`; greedy tokens from `generate`.

`lmlab models --architectures --write` runs every type (a few minutes on 2 cores) and writes the table the package
ships (lmlab/models/architectures.json) and, given `--doc`, the one in a Markdown page between its
`<!-- architectures:begin -->` and `<!-- architectures:end -->` marks; `lmlab models --architectures --check TYPE`
checks one type without writing. The tests check each row again, so the table cannot claim what the checks do not
show.
"""

from __future__ import annotations

import inspect
import json
import signal
import sys
import time
import warnings
from contextlib import contextmanager
from pathlib import Path

import torch

TABLE = Path(__file__).resolve().parent / "models" / "architectures.json"
BUILD_SECONDS = 20  # a type whose tiny instance takes longer to build and run is recorded as not checked
MAX_PARAMS = 50_000_000  # nor one whose config keeps a part at full size (a vision or audio tower): minutes to check

# Generic sizes, set wherever a config class takes the key (its attribute map followed); the rest keep defaults.
SIZES = dict(hidden_size=32, num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=2,
             intermediate_size=64, head_dim=8, max_position_embeddings=512, pad_token_id=1, bos_token_id=0,
             eos_token_id=0, rotary_dim=8, partial_rotary_factor=1.0, num_experts=4, num_local_experts=4,
             num_experts_per_tok=2, moe_intermediate_size=32, shared_expert_intermediate_size=32,
             n_routed_experts=4, n_shared_experts=1, first_k_dense_replace=1, q_lora_rank=16, kv_lora_rank=16,
             qk_rope_head_dim=4, qk_nope_head_dim=4, v_head_dim=8, qk_head_dim=8, n_group=1, topk_group=1,
             image_size=32, patch_size=8, sliding_window=64, ffn_hidden_size=64, hidden_size_per_layer_input=8,
             num_kv_shared_layers=0,
             # a hybrid's other mixers at tiny widths (their defaults keep full-size state spaces and delta-rule heads,
             # whose reference kernels take seconds a call on a CPU)
             linear_key_head_dim=8, linear_value_head_dim=8, linear_num_key_heads=2, linear_num_value_heads=4,
             mamba_num_heads=8, mamba_head_dim=8, ssm_state_size=16)
# what the generic sizes cannot say, per type: a field validated against the layer count (gpt_neo's attention types),
# DBRX's attention sub-config, whose defaults lack the rope_theta and clip_qkv its attention reads (DBRX's
# checkpoints carry both), and the others below, each with its reason
# the sparse attention of Qwen4's experimental model: its indexer's sizes, which its config requires and has no default
QSA = dict(indexer_n_heads=2, indexer_kv_heads=1, indexer_head_dim=8, indexer_budget=4, indexer_compress_ratio=2)
TYPE_SIZES = {"gpt_neo": dict(attention_types=[[["global", "local"], 1]]),
              "dbrx": dict(attn_config=dict(rope_theta=500_000.0, clip_qkv=8.0)),
              "xmod": dict(default_language="en_XX"),  # (X-MOD runs only where its config names a language)
              "zaya": dict(num_experts_per_tok=1),  # (its config supports one expert a token only)
              # per-layer-type rotary parameters, as its checkpoints give them (the default has none for its layers)
              "cohere_compass_text": dict(rope_parameters={"full_attention": dict(rope_type="default",
                                                                                  rope_theta=10_000.0)}),
              # a causal LM only as a decoder, with axial position embeddings that sum to the hidden size
              "reformer": dict(is_decoder=True, axial_pos_embds_dim=[16, 16], axial_pos_shape=[16, 32]),
              "longcat_flash": dict(head_dim=4),  # its rotary width is head_dim, the query's rope part's
              # hybrids whose attention layers their config places by period or index (none among 4 by default), and
              # state-space heads that must tile the expanded width (2 x 32 = 8 heads of 8)
              "jamba": dict(attn_layer_period=2, attn_layer_offset=1, expert_layer_period=2, expert_layer_offset=1),
              "bamba": dict(attn_layer_indices=[1, 3], mamba_n_heads=8, mamba_d_head=8),
              "mamba2": dict(num_heads=8, head_dim=8),
              # and mixers whose defaults stay at full width (seconds each on a CPU instead of a minute)
              "falcon_h1": dict(mamba_d_ssm=64, mamba_n_heads=8, mamba_d_head=8, mamba_d_state=16, mamba_chunk_size=16),
              "kimi_linear": dict(linear_head_dim=8, linear_num_heads=4),
              "nemotron_h": dict(chunk_size=16),
              "lfm2": dict(layer_types=["conv", "full_attention"] * 2),
              "lfm2_moe": dict(layer_types=["conv", "full_attention"] * 2, num_dense_layers=1),
              "zamba": dict(attn_layer_period=2, attn_layer_offset=1),
              "granitemoehybrid": dict(mamba_n_heads=8, mamba_d_head=8, layer_types=["mamba", "attention"] * 2),
              "qwen4_exp_text": QSA,
              "qwen4_exp": dict(text_config=QSA),
              # sub-configs validated against their sizes: the text model's K/V heads, the vision tower's per-layer
              # table (for its default 42 layers), the adapters' widths (the towers' and the text model's hidden sizes)
              "dots3_note": dict(text_config=dict(num_key_value_heads=SIZES["num_attention_heads"]),
                                 vision_config=dict(per_layer_config={}, adapter_in_dim=SIZES["hidden_size"],
                                                    adapter_out_dim=SIZES["hidden_size"]),
                                 audio_config=dict(adapter_input_size=SIZES["hidden_size"],
                                                   adapter_out_dim=SIZES["hidden_size"])),
              # Gemma 4's drafting assistants: every layer shares the keys and values of another (their target's)
              **{t: dict(text_config=dict(hidden_size_per_layer_input=0, vocab_size_per_layer_input=0,
                                          num_kv_shared_layers=SIZES["num_hidden_layers"]), backbone_hidden_size=32)
                 for t in ("gemma4_assistant", "gemma4_unified_assistant")}}
# state-space, recurrent and short-convolution mixers: a config that names one of these has layers that are not
# attention (a hybrid, built with HYBRID_LAYERS blocks so that its default layer pattern holds both kinds)
HYBRID_LAYERS = 4
RECURRENT_KEYS = ("ssm_state_size", "mamba_d_state", "state_size", "mamba_expand", "linear_attn_config", "conv_L_cache",
                  "lru_width", "conv_kernel", "linear_num_value_heads", "rwkv", "xlstm", "attn_layer_period")
# the same, named in a config's layer_types (Kimi-Linear, Bailing's hybrid: linear-attention layers), and a recurrent
# type whose config names neither (xLSTM: its blocks are all recurrent)
RECURRENT_LAYER_KINDS = {"linear_attention", "conv", "mamba"}
RECURRENT_TYPES = ("xlstm",)

# a check whose "unavailable" leaves the rest usable, and what it takes away (the study needing it refuses by name)
PARTIAL = {"knockout": "knockout (S1's study, `lmlab trace`) unavailable",
           "recurrent knockout": "knockout (S1's study, `lmlab trace`) unavailable",
           "mlp activation": "ARM (S3's intervention) unavailable",
           "sparse gate": "sparse attention (S4's post-training) unavailable",
           "quantized weights": "XTC quantization (S2) unavailable",
           "generation": "lmlab's generation (the knockout and filler studies' answers, lm-eval's generative tasks) unavailable"}


def causal_types() -> list[str]:
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    return sorted(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)


def _kwargs(cls) -> dict:
    fields = set(getattr(cls, "__dataclass_fields__", {})) | set(inspect.signature(cls.__init__).parameters)
    amap = getattr(cls, "attribute_map", {}) or {}
    out = {}
    for key, value in SIZES.items():
        if key in fields:
            out[key] = value
        elif amap.get(key) in fields:
            out[amap[key]] = value
    return out


def is_hybrid_type(model_type: str) -> bool:
    """Whether the type's default config names a mixer other than attention (`RECURRENT_KEYS`, its layer types)."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    try:
        config = CONFIG_MAPPING[model_type]()
    except Exception:  # noqa: BLE001
        return model_type in RECURRENT_TYPES
    text = getattr(config, "text_config", None) or config
    kinds = set(map(str, getattr(text, "layer_types", None) or []))
    return model_type in RECURRENT_TYPES or bool(kinds & RECURRENT_LAYER_KINDS) or any(
        getattr(text, k, None) not in (None, False) for k in RECURRENT_KEYS)


def _hybrid_layers(cls) -> dict:
    """A hybrid's config at HYBRID_LAYERS blocks: every per-layer list of its defaults cut to that many, and its layer
    types alternating its first other mixer and its first softmax attention (other, attention, other, attention), so
    that both kinds are built whatever period the defaults have."""
    out: dict = {"num_hidden_layers": HYBRID_LAYERS}
    try:
        defaults = cls()
    except Exception:  # noqa: BLE001
        return out
    fields = _fields(cls)
    n = defaults.num_hidden_layers
    for key, value in defaults.to_dict().items():
        if isinstance(value, list) and len(value) == n and key in fields:
            out[key] = value[:HYBRID_LAYERS]
    for key in ("layer_types", "layers_block_type"):
        kinds = list(map(str, getattr(defaults, key, None) or []))
        other = next((k for k in kinds if k in RECURRENT_LAYER_KINDS), None)
        softmax = next((k for k in kinds if ("attention" in k or k == "hybrid") and k not in RECURRENT_LAYER_KINDS),
                       None)
        if other and softmax and key in fields:
            out[key] = [other, softmax] * (HYBRID_LAYERS // 2)
    return out


def _fields(cls) -> set[str]:
    return set(getattr(cls, "__dataclass_fields__", {})) | set(inspect.signature(cls.__init__).parameters)


def tiny_config(model_type: str, vocab_size: int):
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    cls = CONFIG_MAPPING[model_type]
    kwargs = _kwargs(cls)
    if "num_hidden_layers" in kwargs and is_hybrid_type(model_type):
        kwargs.update(_hybrid_layers(cls))
    if "vocab_size" in kwargs or "vocab_size" in set(getattr(cls, "__dataclass_fields__", {})) | set(
            inspect.signature(cls.__init__).parameters):
        kwargs["vocab_size"] = vocab_size
    if "vocab_size_per_layer_input" in set(getattr(cls, "__dataclass_fields__", {})):  # per-layer embeddings (Gemma 4)
        kwargs["vocab_size_per_layer_input"] = vocab_size
    for name, sub in (getattr(cls, "sub_configs", None) or {}).items():
        default = (getattr(cls, "sub_configs_defaults", None) or {}).get(name)
        if sub.__name__ == "AutoConfig" and getattr(default, "model_type", None):  # (Gemma 4's assistants)
            sub = CONFIG_MAPPING[default.model_type]
        extra = TYPE_SIZES.get(model_type, {}).get(name)  # a type's own entries for this sub-config, validated with it
        hybrid = _hybrid_layers(sub) if "text" in name and is_hybrid_type(model_type) else {}
        try:
            kwargs[name] = sub(**{**_kwargs(sub), **({"vocab_size": vocab_size} if "text" in name else {}), **hybrid,
                                  **(extra if isinstance(extra, dict) else {})}).to_dict()
        except Exception:  # noqa: BLE001 - a sub-config that will not shrink keeps its defaults
            pass
    for key, value in TYPE_SIZES.get(model_type, {}).items():  # a sub-config's entries merge into its shrunk dict
        kwargs[key] = {**kwargs[key], **value} if isinstance(kwargs.get(key), dict) else value
    if "kv_lora_rank" in kwargs and "num_key_value_heads" in kwargs:  # latent attention shares no K/V heads
        kwargs["num_key_value_heads"] = kwargs.get("num_attention_heads", 4)
    return cls(**kwargs)


def tiny_model(model_type: str, seed: int = 0):
    """(model, tokenizer): a tiny random instance of `model_type` with lmlab's tiny BPE tokenizer."""
    from transformers import AutoModelForCausalLM

    from lmlab.models.tiny import tiny_tokenizer

    from lmlab.models.layout import calls_attention_interface

    tokenizer = tiny_tokenizer()
    config = tiny_config(model_type, len(tokenizer))
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config).eval()
        if any(calls_attention_interface(m) and getattr(m, "is_causal", True) is False for m in model.modules()):
            # an encoder's causal-LM head (RoBERTa, ELECTRA, ...) is bidirectional unless its config says
            # `is_decoder`, as a decoder checkpoint of it does: built as that checkpoint would be
            config.is_decoder = True
            torch.manual_seed(seed)
            model = AutoModelForCausalLM.from_config(config).eval()
    return model, tokenizer


@contextmanager
def _time_limit(seconds: int):
    """A TimeoutError after `seconds` in the main thread where the system has alarms (POSIX); no limit elsewhere
    (Windows, or a thread other than the main one)."""
    import threading

    if not hasattr(signal, "SIGALRM") or threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(*_):
        raise TimeoutError(f"over {seconds} s")

    old = signal.signal(signal.SIGALRM, stop)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


REF = "conformance_reference"


def _reference_attention(module, query, key, value, attention_mask, **kwargs):
    """The architecture's own eager attention, with the pairs the test blocks written into its mask."""
    eager = getattr(sys.modules[type(module).__module__], "eager_attention_forward", None)
    if eager is None:
        from transformers.models.llama.modeling_llama import eager_attention_forward as eager
    if module.__dict__.get("_conformance_gate"):
        attention_mask = _gated_mask(module, query, key, attention_mask, kwargs)
    block = module.__dict__.get("_conformance_block")
    if block is not None:
        q, k = query.shape[2], key.shape[2]
        base = attention_mask[..., :k] if attention_mask is not None else torch.zeros(1, 1, q, k, dtype=query.dtype)
        attention_mask = base.expand(query.shape[0], query.shape[1], q, k).masked_fill(
            block[..., :q, :k], torch.finfo(query.dtype).min)
    return eager(module, query, key, value, attention_mask, **kwargs)


def _bart_style_forward(self, hidden_states, key_value_states=None, cache=None, attention_mask=None, *rest, **kwargs):
    """A BART-style attention (XGLM, TrOCR): its own forward, the pairs masked in the mask it adds."""
    shape = (*hidden_states.shape[:2], -1, self.head_dim)
    query = (self.q_proj(hidden_states) * self.scaling).view(shape).transpose(1, 2)
    key = self.k_proj(hidden_states).view(shape).transpose(1, 2)
    if self.__dict__.get("_conformance_gate"):  # a mask per head, which its forward does not take: by hand
        value = self.v_proj(hidden_states).view(shape).transpose(1, 2)
        mask = _gated_mask(self, query, key, attention_mask, dict(scaling=1.0))
        weights = torch.softmax(query @ key.transpose(2, 3) + mask, dim=-1)
        return self.out_proj((weights @ value).transpose(1, 2).reshape(*hidden_states.shape[:2], -1)), weights
    if self.__dict__.get("_conformance_block") is not None:
        q = query.shape[2]
        attention_mask = attention_mask.expand(query.shape[0], 1, q, q).masked_fill(
            self._conformance_block[..., :q, :q], torch.finfo(query.dtype).min)
    return type(self).forward(self, hidden_states, key_value_states, cache, attention_mask, *rest, **kwargs)


@contextmanager
def _legacy_reference(module):
    """For a family whose attention computes in its own `_attn` (GPT-Neo, the OpenAI GPT) or forward (XGLM, TrOCR;
    lmlab adapts them): that method, with the blocked pairs (or the gate's dropped ones) added to the mask it adds to
    its scores."""
    from types import MethodType

    neo = "gpt_neo" in type(module).__module__

    def extra(query, key, attention_mask):
        q, n = query.shape[-2], key.shape[-2]
        causal = module.bias[:, :, n - q:n, :n].bool()
        base = torch.zeros(causal.shape, dtype=torch.float32).masked_fill(~causal, torch.finfo(torch.float32).min)
        if attention_mask is not None:
            base = (base + attention_mask).clamp_min(torch.finfo(torch.float32).min)
        if module.__dict__.get("_conformance_gate"):
            scaling = 1.0 if neo or not module.scale else query.shape[-1] ** -0.5
            return _gated_mask(module, query, key, base, dict(scaling=scaling))
        block = module.__dict__.get("_conformance_block")
        if block is not None:
            base = base.expand(query.shape[0], 1, q, n).masked_fill(block[..., :q, :n], torch.finfo(torch.float32).min)
        return base

    def reference(self, query, key, value, attention_mask=None, *rest):
        keys = key if neo else key.transpose(-1, -2)  # (the OpenAI GPT's key comes transposed)
        return type(self)._attn(self, query, key, value, extra(query, keys, attention_mask), *rest)

    name, function = ("forward", _bart_style_forward) if hasattr(module, "q_proj") and hasattr(module, "scaling") \
        else ("_attn", reference)
    had = module.__dict__.get(name)
    setattr(module, name, MethodType(function, module))
    try:
        yield
    finally:
        if had is None:
            delattr(module, name)
        else:
            setattr(module, name, had)


def _gated_mask(module, query, key, attention_mask, kwargs):
    """The deterministic sparse gate (Draye et al.) as a mask: a pair is kept where its score (scaled, soft-capped,
    with the model's additive mask) is above 0; a query that keeps nothing keeps its own position."""
    n_rep = query.shape[1] // key.shape[1]
    k = key.repeat_interleave(n_rep, dim=1)
    scaling = kwargs.get("scaling") or query.shape[-1] ** -0.5
    scores = (query.float() @ k.float().transpose(2, 3)) * scaling
    if kwargs.get("softcap") is not None:
        scores = torch.tanh(scores / kwargs["softcap"]) * kwargs["softcap"]
    q, n = query.shape[2], key.shape[2]
    base = attention_mask[..., :n] if attention_mask is not None else torch.zeros(1, 1, q, n, dtype=query.dtype)
    if base.dtype == torch.bool:
        base = torch.zeros(base.shape, dtype=query.dtype).masked_fill(~base, torch.finfo(query.dtype).min)
    if attention_mask is None and getattr(module, "is_causal", False):  # a causal attention without a mask
        base = base.masked_fill(torch.ones(q, n, dtype=torch.bool).triu(n - q + 1), torch.finfo(query.dtype).min)
    allowed = base > torch.finfo(base.dtype).min / 2
    kept = ((scores + base.float()) > 0) & allowed
    own = torch.zeros(q, n, dtype=torch.bool)
    own[torch.arange(q), torch.arange(n - q, n)] = True
    kept = kept | (~kept.any(-1, keepdim=True) & own)
    return base.expand(kept.shape).masked_fill(~kept, torch.finfo(query.dtype).min)


def _ternary(w: torch.Tensor) -> torch.Tensor:
    """XTC's 2-bit weights over one group (Wu et al.): delta = 0.7 mean|w|, alpha = mean |w| above delta."""
    a = w.abs()
    keep = a > 0.7 * a.mean()
    return a[keep].mean() * torch.sign(w) * keep


def _quantize_targets(blocks, config) -> tuple[dict, dict]:
    """What S2 must quantize, with the weights before it does: {(block, name): weight} of every linear layer of the
    blocks but a router (one output per expert), and {(block, name): tensor} of experts stacked in 3-D tensors."""
    from torch import nn
    from transformers.pytorch_utils import Conv1D

    from lmlab.models.layout import fused_experts, get_submodule

    experts = {getattr(config, k, None) for k in ("num_experts", "num_local_experts", "n_routed_experts",
                                                  "moe_num_experts")} - {None}
    stacked = {(i, n): get_submodule(b, n).detach().clone() for i, b in enumerate(blocks) for n in fused_experts(b)}
    expected = {(i, n): m.weight.detach().clone() for i, b in enumerate(blocks) for n, m in b.named_modules()
                if isinstance(m, (nn.Linear, Conv1D)) and not _router(n, m, experts)}
    return expected, stacked


def _not_quantized(blocks, expected: dict, stacked: dict) -> str:
    """Where the quantized layers are not exactly the ones expected (`_quantize_targets`), in words; "" if they are."""
    from torch.nn.utils import parametrize

    from lmlab.models.layout import get_submodule

    got = {(i, n) for i, b in enumerate(blocks) for n, m in b.named_modules()
           if parametrize.is_parametrized(m, "weight")}
    if got != set(expected):
        wrong = sorted(got ^ set(expected))[:3]
        return f"the quantized layers are not the blocks' linear layers (differ at {wrong})"
    for i, name in stacked:
        path, _, param = name.rpartition(".")
        if not parametrize.is_parametrized(get_submodule(blocks[i], path), param):
            return f"left experts stacked in 3-D tensors unquantized ({name} of layer {i})"
    return ""


def _worst_ternary(blocks, expected: dict, stacked: dict) -> float:
    """The largest relative difference between a quantized layer's weight (each stacked expert's matrix alone) and
    the ternary values computed here from its weight before quantizing."""
    from lmlab.models.layout import get_submodule

    return max([_close(dict(b.named_modules())[n].weight, _ternary(w)) for (i, n), w in expected.items()
                for b in [blocks[i]]]
               + [_close(get_submodule(blocks[i], n)[e], _ternary(w[e]), scale=float(w[e].abs().max()))
                  for (i, n), w in stacked.items() for e in range(w.shape[0])])


def _check_quantized(model, ids) -> str:
    """S2's weights on a copy of the model: exactly the linear layers of every block are quantized (a router, with
    one output per expert, aside), each to the ternary values computed here; experts stacked in 3-D tensors each
    expert's matrix to its own ternary values, and lmlab's experts forward (where the 8-bit quantizers sit) computing
    what the family's own does on those weights; the word embeddings row by row; a forward with 8-bit inputs runs.
    "unavailable: ..." where lmlab refuses the blocks' experts."""
    import copy

    from lmlab.errors import LmlabError
    from lmlab.interventions.quant import quantize_model
    from lmlab.models.layout import get_submodule, layout_of

    copied = copy.deepcopy(model)
    config = getattr(copied.config, "text_config", None) or copied.config
    blocks = layout_of(copied).blocks
    expected, stacked = _quantize_targets(blocks, config)
    embedding = copied.get_input_embeddings()
    with torch.no_grad():
        rows = embedding(ids).clone()  # the rows as the embedding module gives them (Gemma's scale included)
    try:
        quantize_model(copied, bits=2)
    except LmlabError as exc:
        if stacked:
            return f"unavailable: {exc}"
        return f"refused a model whose blocks are linear layers ({exc})"
    missed = _not_quantized(blocks, expected, stacked)
    if missed:
        return missed
    with torch.no_grad():
        worst = _worst_ternary(blocks, expected, stacked)
        looked_up = embedding(ids)
        rows_worst = _close(looked_up, torch.stack([torch.stack([_ternary(r) for r in row]) for row in rows]))
        out = copied(input_ids=ids, attention_mask=torch.ones_like(ids)).logits
    if max(worst, rows_worst) > TOL:
        return f"quantized weights differ from XTC's ternary values (max relative difference {max(worst, rows_worst):.1e})"
    if not torch.isfinite(out).all():
        return "the quantized model's forward gives non-finite logits"
    if stacked:
        i, name = next(iter(stacked))
        return _check_experts_forward(get_submodule(blocks[i], name.rpartition(".")[0]), config.hidden_size)
    return ""


def _router(name: str, module, experts: set) -> bool:
    """One output per expert, named as a router is (a linear attention's per-head b_proj is not)."""
    from torch import nn

    return isinstance(module, nn.Linear) and module.weight.shape[0] in experts and name.rsplit(".", 1)[-1] in (
        "gate", "router", "router_proj", "wg", "classifier")


def _check_experts_forward(module, hidden: int) -> str:
    """lmlab's experts forward (where the 8-bit quantizers sit) against the family's own on random hidden states and
    routing, on the quantized weights, its activation quantizer off."""
    from lmlab.interventions.quant import xtc_experts_forward

    gen = torch.Generator(device="cpu").manual_seed(0)
    tokens = 7
    h = torch.randn(tokens, hidden, generator=gen, device="cpu")  # (the experts read the block's hidden states)
    k = min(2, module.num_experts)
    index = torch.stack([torch.randperm(module.num_experts, generator=gen, device="cpu")[:k] for _ in range(tokens)])
    weights = torch.rand(tokens, k, generator=gen, device="cpu")
    device = next(module.parameters()).device  # (drawn on the CPU, so the same numbers on any device)
    h, index, weights = h.to(device), index.to(device), weights.to(device)
    with torch.no_grad():
        own = type(module).forward(module, h, index, weights)
        bits, module._lmlab_act_bits = module._lmlab_act_bits, None
        mine = xtc_experts_forward(module, h, index, weights)
        module._lmlab_act_bits = bits
    diff = _close(mine, own, scale=max(float(own.abs().max()), 1e-12))
    if diff > TOL:
        return f"lmlab's experts forward differs from the family's own (max relative difference {diff:.1e})"
    return ""


def _mixer_by_position(keys):
    """A forward hook for a mixer: its output recomputed row by row and position by position after each row's key,
    the family's own mixer on that row alone up to the position with the key deleted from its input (`keys`: the
    key's position per row, as a mask)."""

    def by_position(module, args, kwargs, out):
        hidden = args[0] if args else next(v for v in kwargs.values() if isinstance(v, torch.Tensor) and v.dim() == 3)
        first = (out[0] if isinstance(out, tuple) else out).clone()
        rest = {k: (None if k in ("cache", "cache_params", "past_key_values", "past_key_value", "layer_past",
                                  "cache_position") else v) for k, v in kwargs.items()}
        seq = hidden.shape[1]

        def part(value, row, kept):  # one row's per-position inputs at the kept positions
            if isinstance(value, torch.Tensor) and value.dim() >= 2 and value.shape[1] == seq:
                return value[row if value.shape[0] > 1 else 0][kept][None]
            return value

        for row in range(hidden.shape[0]):
            key = int(keys[row].nonzero()[0])
            for t in range(key + 1, seq):
                kept = [p for p in range(t + 1) if p != key]
                again = module.forward(*[part(a, row, kept) for a in args],
                                       **{k: part(v, row, kept) for k, v in rest.items()})
                first[row, t] = (again[0] if isinstance(again, tuple) else again)[0, -1]
        return (first, *out[1:]) if isinstance(out, tuple) else first

    return by_position


def _check_recurrent_knockout(lm, enc, keys, plain, block) -> str:
    """A knockout in a hybrid's last non-attention block against the mixer run here position by position: for each
    row and each position after the key, the family's own mixer on that row alone, up to that position, with the key
    deleted from its input (nothing of the key written into the state or a later convolution); the key's own output
    and every earlier one as they were. A block with attention beside the mixer (Falcon-H1) has its attention's pairs
    `block` masked in the reference attention too. "" or why."""
    from lmlab.errors import LmlabError
    from lmlab.interventions import Knockout, intervene

    layer = lm.layout.mixing_layers[-1]
    both = layer in lm.layout.attention_layers
    mixer = lm.layout.mixer(layer)
    try:
        with intervene(lm, Knockout(keys, layers=[layer])):
            with torch.no_grad():
                got = lm.model(**enc).logits
    except LmlabError as exc:
        return f"unavailable: {exc}"

    handle = mixer.register_forward_hook(_mixer_by_position(keys), with_kwargs=True)
    if both:
        lm.layout.attn(layer)._conformance_block = block
    try:
        with torch.no_grad(), using(lm.model, REF if both else lm.model.config._attn_implementation):
            expected = lm.model(**enc).logits
    finally:
        handle.remove()
        lm.layout.attn(layer).__dict__.pop("_conformance_block", None) if both else None
    diff, changed = _close(got, expected), _close(expected, plain)
    if diff > TOL:
        return f"differs from the independent computation (max relative difference {diff:.1e})"
    return "" if changed >= 1e-6 else "changed nothing where the reference changed the output"


def _register_reference():
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, eager_mask

    AttentionInterface.register(REF, _reference_attention)
    AttentionMaskInterface.register(REF, eager_mask)


def _close(a, b, scale=None) -> float:
    """max |a - b| relative to the scale of b (1 at least)."""
    scale = max(float(b.abs().max()), 1.0) if scale is None else scale
    return float((a.float() - b.float()).abs().max()) / scale


TOL = 1e-4


@contextmanager
def using(model, impl):
    """The model under another attention implementation for the block, its own afterwards."""
    old = model.config._attn_implementation
    model.set_attn_implementation(impl)
    try:
        yield
    finally:
        model.set_attn_implementation(old)


@contextmanager
def _ignoring_the_table():
    """Checks judge the architecture itself, not what the shipped table said about it last time."""
    import lmlab.models.architectures as shipped

    old = shipped.refusal
    shipped.refusal = lambda model_type, encoder=False: None
    try:
        yield
    finally:
        shipped.refusal = old


def run_checks(model, tokenizer) -> dict[str, str]:
    """{check: "" (passed) or why it failed}."""
    with _ignoring_the_table():
        return _run_checks(model, tokenizer)


class _Bench:
    """One tiny model's inputs, its plain logits and the checks' outcomes (name -> "" where it passed, else why)."""

    def __init__(self, model, tokenizer):
        from lmlab.models.layout import LEGACY_ATTENTION, layout_of
        from lmlab.models.load import LoadedModel

        self.model, self.tokenizer = model, tokenizer
        self.layout = layout = layout_of(model)
        self.lm = LoadedModel(model=model, tokenizer=tokenizer, layout=layout, name=model.config.model_type,
                              source="tiny")
        self.ids = torch.tensor([tokenizer("When Mary and John went to the store, John gave")["input_ids"][:10],
                                 tokenizer("The war lasted from the year 1732 to the year")["input_ids"][:10]])
        self.enc = dict(input_ids=self.ids, attention_mask=torch.ones_like(self.ids))
        # the head edits act on the last attention layer (a hybrid's other blocks have no heads)
        self.last, self.head = layout.attention_layers[-1], min(1, layout.n_heads - 1)
        self.d = layout.head_dim_of(self.last)
        self.attn = layout.attn(self.last)
        self.legacy = f"{type(self.attn).__module__}.{type(self.attn).__qualname__}" in LEGACY_ATTENTION
        self.out: dict[str, str] = {}
        self.plain = self.clean = None

    def logits(self, **kw):
        with torch.no_grad():
            return self.model(**self.enc, **kw).logits

    def record(self, name, diff, changed=None):
        if diff > TOL:
            self.out[name] = f"differs from the independent computation (max relative difference {diff:.1e})"
        elif changed is not None and changed < 1e-6:
            self.out[name] = "changed nothing where the reference changed the output"
        else:
            self.out[name] = ""

    def reference(self, mark, value):
        """The logits under the reference attention, the last layer's attention marked for it."""
        setattr(self.attn, mark, value)
        try:
            with (_legacy_reference(self.attn) if self.legacy else using(self.model, REF)):
                return self.logits()
        finally:
            delattr(self.attn, mark)

    def by_hand(self, edit):
        """The logits with the last layer's output projection's input edited by a plain pre-hook (eager)."""
        handle = self.layout.o_proj(self.last).register_forward_pre_hook(lambda m, a: (edit(a[0].clone()),))
        try:
            with using(self.model, "eager"):
                return self.logits()
        finally:
            handle.remove()

    def head_slice(self, x, value):
        x[..., self.head * self.d:(self.head + 1) * self.d] = value
        return x


def _run_checks(model, tokenizer) -> dict[str, str]:
    _register_reference()
    b = _Bench(model, tokenizer)
    _check_forward(b)
    _check_knockout(b)
    _check_heads(b)
    _check_residual_and_pattern(b)
    _check_sparse_gate(b)
    b.out["quantized weights"] = _check_quantized(model, b.ids)
    _check_mlp_activation(b)
    b.out["generation"] = _check_generation(b)
    return b.out


def _check_forward(b: _Bench) -> None:
    """The logits under the model's own attention (sdpa or eager), then routed through lmlab's with captures."""
    from lmlab.interventions import Capture, intervene

    model = b.model
    base = model.config._attn_implementation
    if base not in ("sdpa", "eager"):  # a model lmlab's function already runs: its own default back
        base = "sdpa" if getattr(model, "_supports_sdpa", False) else "eager"
    try:
        with using(model, base):
            pass
    except ValueError:  # a tower of a unified model without sdpa (Gemma 4's audio encoder): eager throughout
        base = "eager"
        model.set_attn_implementation(base)
    with using(model, base):
        b.plain = b.logits()
    with intervene(b.lm, Capture("resid_pre", "z", *(("mlp_out",) if b.layout.spec.mlp else ()))):
        routed = b.logits()
    b.record("forward", _close(routed, b.plain))


def _check_knockout(b: _Bench) -> None:
    """Attention from position 2 blocked at the last attention layer against the reference attention with those pairs
    masked (and a hybrid's recurrent blocks against the mixer run position by position)."""
    from lmlab.errors import LmlabError
    from lmlab.interventions import Knockout, intervene

    keys = torch.zeros_like(b.ids, dtype=torch.bool)
    keys[:, 2] = True
    try:
        with intervene(b.lm, Knockout(keys, layers=[b.last])):
            got = b.logits()
    except LmlabError as exc:  # a hybrid's other mixers carry the tokens on: refused by name
        got, b.out["knockout"] = None, f"unavailable: {exc}"
    if b.last in b.layout.mixing_layers:
        got = None  # (its other mixer is cut too: checked with both below)
    block = torch.zeros(2, 1, b.ids.shape[1], b.ids.shape[1], dtype=torch.bool)
    block[:, 0, 3:, 2] = True
    expected = b.reference("_conformance_block", block)
    with using(b.model, REF):  # (a legacy family: its own method, lmlab's adapter passing through)
        b.clean = b.logits()
    if got is not None:
        b.record("knockout", _close(got, expected), changed=_close(expected, b.clean))
    if b.layout.mixing_layers:
        b.out["recurrent knockout"] = _check_recurrent_knockout(b.lm, b.enc, keys, b.plain, block)
        if b.last in b.layout.mixing_layers and "knockout" in b.out:  # (attention and another mixer side by side:
            b.out["knockout"] = b.out["recurrent knockout"]  # the check above cuts and references both)


def _check_heads(b: _Bench) -> None:
    """A head zeroed, and a head patched from another prompt, against the output projection's input edited by hand."""
    from lmlab.interventions import AblateHeads, Capture, intervene

    model, last, head, d = b.model, b.last, b.head, b.d
    with intervene(b.lm, AblateHeads({last: [head]})):
        got = b.logits()
    b.record("head ablation", _close(got, b.by_hand(lambda x: b.head_slice(x, 0))), changed=_close(got, b.plain))
    other = b.ids.flip(1)
    seen = {}
    handle = b.layout.o_proj(last).register_forward_pre_hook(lambda m, a: seen.setdefault("x", a[0].detach().clone()))
    try:
        with torch.no_grad(), using(model, "eager"):
            model(input_ids=other, attention_mask=torch.ones_like(other))
    finally:
        handle.remove()
    with intervene(b.lm, Capture("z", layers=last)) as cap, torch.no_grad():
        model(input_ids=other, attention_mask=torch.ones_like(other))
    ref_z = cap["z", last]
    with intervene(b.lm, AblateHeads({last: [head]}, mode="patch", reference={last: ref_z})):
        got = b.logits()
    patched = b.by_hand(lambda x: b.head_slice(x, seen["x"][..., head * d:(head + 1) * d]))
    b.record("head patching", _close(got, patched), changed=_close(got, b.plain))


def _check_residual_and_pattern(b: _Bench) -> None:
    """The residual stream against `output_hidden_states`, the attention pattern against `output_attentions`."""
    from lmlab.interventions import Capture, intervene

    layout = b.layout
    with intervene(b.lm, Capture("resid_pre")) as cap, torch.no_grad():
        hidden = b.model(**b.enc, output_hidden_states=True).hidden_states
    b.record("residual", max(_close(cap["resid_pre", l], hidden[l]) for l in range(layout.n_layers)))
    with intervene(b.lm, Capture("pattern")) as cap:
        b.logits()
    with using(b.model, "eager"), torch.no_grad():
        attentions = b.model(**b.enc, output_attentions=True).attentions
    layers = layout.attention_layers  # (a hybrid gives None, a linear attention's own weights, or nothing, for the
    if len(attentions) == layout.n_layers:  # blocks without softmax attention)
        attentions = [attentions[l] for l in layers]
    attentions = [a for a in attentions if a is not None]
    if len(attentions) != len(layers):
        b.out["pattern"] = f"output_attentions gives {len(attentions)} patterns for {len(layers)} attention layers"
    else:
        b.record("pattern", max(_close(cap["pattern", l], a, 1.0) for l, a in zip(layers, attentions)))


def _check_sparse_gate(b: _Bench) -> None:
    """The deterministic sparse gate (S4's edit at evaluation) on the last layer against the eager attention whose
    mask keeps only the pairs with a positive score."""
    from lmlab.errors import LmlabError
    from lmlab.interventions import intervene
    from lmlab.interventions.edits import SparseAttention

    try:
        with intervene(b.lm, SparseAttention(layers=[b.last], sample=False)):
            got = b.logits()
    except LmlabError as exc:
        b.out["sparse gate"] = f"unavailable: {exc}"
    else:
        b.record("sparse gate", _close(got, b.reference("_conformance_gate", True)), changed=_close(got, b.clean))


def _check_mlp_activation(b: _Bench) -> None:
    """The MLP activation (ARM's edit, S3): zeroed at the last layer, that layer's MLP output no longer depends on its
    input (only the output layer's bias is left), read by a plain hook on the MLP."""
    from lmlab.interventions import EditMLPAct, intervene

    layout = b.layout
    if not layout.spec.mlp_act:
        b.out["mlp activation"] = ("unavailable: its MLPs sit in blocks of their own, not one in every block"
                                   if not layout.spec.mlp else
                                   "unavailable: the MLP has no activation module of its own (ARM, S3, needs one)")
        return
    last, seen = layout.n_layers - 1, {}
    handle = layout.mlp_out(last).register_forward_hook(
        lambda m, a, o: seen.setdefault("y", (o[0] if isinstance(o, tuple) else o).detach()))
    try:
        with intervene(b.lm, EditMLPAct(lambda a, layer: a * 0, layers=last)):
            got = b.logits()
    finally:
        handle.remove()
    spread = float((seen["y"] - seen["y"][:, :1]).abs().max())
    b.out["mlp activation"] = "" if spread < 1e-6 and _close(got, b.plain) > 1e-6 else (
        "zeroing the activation found in the MLP left that MLP's output depending on its input")


def _check_generation(b: _Bench) -> str:
    """lmlab's greedy answers against `generate`'s greedy tokens, cut at the end-of-sequence token."""
    from lmlab.errors import LmlabError
    from lmlab.generation import greedy_answers

    model, tokenizer = b.model, b.tokenizer
    prompts = [b.ids[0, :6].tolist(), b.ids[1, :6].tolist()]
    try:
        got = greedy_answers(b.lm, prompts, max_new_tokens=5, stop_at_newline=False, share_prefix=False)
    except LmlabError as exc:  # a model without a cache: refused by name
        return f"unavailable: {exc}"
    eos = model.generation_config.eos_token_id
    stop = {int(t) for t in ([eos] if isinstance(eos, int) else (eos or []))} | {tokenizer.eos_token_id}
    expected = []
    for p in prompts:
        with torch.no_grad():
            seq = model.generate(torch.tensor([p]), attention_mask=torch.ones(1, len(p), dtype=torch.long),
                                 max_new_tokens=5, do_sample=False, pad_token_id=tokenizer.pad_token_id)[0, len(p):]
        toks = []
        for t in seq.tolist():
            if t in stop:
                break
            toks.append(t)
        expected.append(toks)
    return "" if got == expected else f"greedy tokens {got} where generate gives {expected}"


def _run_or_refuse(run, model, tokenizer):
    """(the checks, None), or (None, a refused row) where running them raised: lmlab's one-sentence refusal, or
    any other error named."""
    from lmlab.errors import LmlabError

    try:
        return run(model, tokenizer), None
    except LmlabError as exc:
        return None, dict(status="refused", reason=str(exc).split(": ", 1)[-1])
    except Exception as exc:  # noqa: BLE001
        return None, dict(status="refused", reason=f"a conformance check raised {type(exc).__name__}: "
                                                   f"{str(exc).splitlines()[0][:120]}")


def _tiny_or_refused(model_type: str) -> tuple:
    """(model, tokenizer, None): a tiny random instance of `model_type` that runs a forward pass; or (None, None,
    the refusal) where it does not build or run here (within BUILD_SECONDS), or is a drafting assistant."""
    try:
        with _time_limit(BUILD_SECONDS), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model, tokenizer = tiny_model(model_type)
            built = getattr(model.config, "text_config", None) or model.config
            if (getattr(built, "num_kv_shared_layers", 0) or 0) >= getattr(built, "num_hidden_layers", 1):
                return None, None, dict(
                    status="refused", reason="a drafting assistant: every layer reads the keys and values its target "
                                             "model computed (and its target's hidden states), so it runs only inside "
                                             "that model's generation, with no attention of its own to study")
            with torch.no_grad():
                model(input_ids=torch.tensor([[5, 6, 7, 8]]))
    except Exception as exc:  # noqa: BLE001 - any failure to build is a refusal with its reason
        return None, None, dict(status="refused", reason=f"not checked: a tiny random instance from its config does "
                                                         f"not build or run here ({type(exc).__name__})")
    return model, tokenizer, None


def classify(model_type: str) -> dict:
    """One row of the table: {status, reason, checks: {name: "" or why}}."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    cls = CONFIG_MAPPING[model_type]
    t0 = time.time()
    from lmlab.models.layout import FAMILIES, MODEL_TYPES

    if model_type in MODEL_TYPES and not FAMILIES[MODEL_TYPES[model_type]].causal:
        return dict(status="supported", reason="", note="an encoder, for S2's classifiers: its interventions are "
                                                        "checked in tests/test_interventions.py and test_quant.py")
    try:
        config_defaults = cls()
    except Exception:  # noqa: BLE001
        config_defaults = None
    if config_defaults is not None and getattr(config_defaults, "is_encoder_decoder", False):
        return dict(status="refused", reason="an encoder-decoder model: lmlab's decoder studies take decoder-only "
                                             "language models (its decoder reads an encoder through cross-attention)")
    model, tokenizer, refused = _tiny_or_refused(model_type)
    if refused:
        return refused
    n_params = sum(p.numel() for p in model.parameters())
    if n_params > MAX_PARAMS:
        if model_type in MODEL_TYPES:
            return dict(status="supported", reason="", note=f"spelled out in FAMILIES; {n_params / 1e6:.0f} M "
                        "parameters at tiny sizes, so checked on its embedded model instead")
        return dict(status="refused", reason=f"not checked: its config does not shrink to a tiny instance here "
                                             f"({n_params / 1e6:.0f} M parameters at lmlab's tiny sizes)")
    checks, refused = _run_or_refuse(run_checks, model, tokenizer)
    if refused:
        return refused
    failed = {k: v for k, v in checks.items() if v and not (k in PARTIAL and v.startswith("unavailable"))}
    partial = [f"{PARTIAL[k]}: {v.partition(': ')[2]}" for k, v in checks.items() if k in PARTIAL and v
               and k not in failed]
    seconds = round(time.time() - t0, 2)
    if failed:
        name = next(iter(failed))
        return dict(status="refused", reason=f"{name}: {failed[name]}", checks=checks, seconds=seconds)
    return dict(status="supported", reason="partly: " + "; ".join(partial) if partial else "", checks=checks,
                seconds=seconds, **_blocks(model))


def _blocks(model) -> dict:
    """A hybrid's kinds of block ({"blocks": "attention, linear attention"}; Falcon-H1's one kind "attention + state
    space": both in every block), as the layout reads its tiny instance; {} for a model whose every block holds
    softmax attention alone."""
    from lmlab.models.layout import layout_of

    with _ignoring_the_table():
        kinds = set(layout_of(model).kinds)
    if kinds == {"attention"}:
        return {}
    return {"blocks": ", ".join(sorted(kinds, key=lambda k: (not k.startswith("attention"), k)))}


# --- encoders: what S2 (XTC's distillation of sequence classifiers) uses of them
ENCODERS = ("bert", "roberta", "distilbert", "electra", "deberta-v2", "modernbert")


def tiny_encoder(model_type: str, seed: int = 0):
    """(model, tokenizer): a tiny random sequence classifier of `model_type` with lmlab's tiny BPE tokenizer."""
    from transformers import AutoModelForSequenceClassification

    from lmlab.models.tiny import tiny_tokenizer

    tokenizer = tiny_tokenizer()
    config = tiny_config(model_type, len(tokenizer))
    config.num_labels = 2
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForSequenceClassification.from_config(config).eval()
    return model, tokenizer


def run_encoder_checks(model, tokenizer) -> dict[str, str]:
    """{check: "" (passed) or why it failed} for an encoder: read as one (bidirectional), the forward with lmlab's
    captures equal to the plain one, the residual stream, the pattern and the pre-softmax scores (S2's KD terms)
    against `output_hidden_states` and `output_attentions`, a head's ablation against its slice of the output
    projection's input zeroed by hand, and S2's quantized weights; a padded row in the batch."""
    with _ignoring_the_table():
        return _run_encoder_checks(model, tokenizer)


def _encoder_batch(tokenizer) -> dict:
    """Two sentences of 10 tokens, the second right-padded after 7 (as S2's batches have it)."""
    ids = torch.tensor([tokenizer("When Mary and John went to the store, John gave")["input_ids"][:10],
                        tokenizer("The war lasted from the year 1732 to the year")["input_ids"][:10]])
    mask = torch.ones_like(ids)
    mask[1, 7:] = 0
    return dict(input_ids=ids, attention_mask=mask)


def _said(diff: float, changed: float | None = None) -> str:
    """A check's outcome: "" (within tolerance of the independent computation and, where `changed` is given, an
    edit that changed the output) or why not."""
    if diff > TOL:
        return f"differs from the independent computation (max relative difference {diff:.1e})"
    return "" if changed is None or changed >= 1e-6 else "changed nothing where the reference changed the output"


def _run_encoder_checks(model, tokenizer) -> dict[str, str]:
    from lmlab.interventions import AblateHeads, Capture, intervene
    from lmlab.models.layout import layout_of
    from lmlab.models.load import LoadedModel

    layout = layout_of(model)
    if layout.causal:
        return {"encoder": "read as a causal decoder"}
    lm = LoadedModel(model=model, tokenizer=tokenizer, layout=layout, name=model.config.model_type, source="tiny")
    enc = _encoder_batch(tokenizer)
    ids, mask = enc["input_ids"], enc["attention_mask"]
    last, head, d = layout.n_layers - 1, min(1, layout.n_heads - 1), layout.head_dim
    out: dict[str, str] = {}

    def logits(**kw):
        with torch.no_grad():
            return model(**enc, **kw)

    base = model.config._attn_implementation
    base = base if base in ("sdpa", "eager") else "eager"
    with using(model, base):
        plain = logits().logits
    with intervene(lm, Capture("resid_pre", "z")):
        out["forward"] = _said(_close(logits().logits, plain))
    with intervene(lm, Capture("resid_pre", "pattern", "scores")) as cap:
        logits()
    with using(model, "eager"):
        ref = logits(output_hidden_states=True, output_attentions=True)
    out["residual"] = _said(max(_close(cap["resid_pre", l], ref.hidden_states[l]) for l in range(layout.n_layers)))
    attentions = [a for a in ref.attentions if a is not None]
    if len(attentions) != layout.n_layers:
        out["pattern"] = f"output_attentions gives {len(attentions)} patterns for {layout.n_layers} layers"
    else:
        keys = mask.bool()[:, None, None, :]
        out["pattern"] = _said(max(_close(cap["pattern", l], attentions[l], 1.0) for l in range(layout.n_layers)))
        out["scores"] = _said(max(_close(cap["scores", l].masked_fill(~keys, float("-inf")).softmax(-1),
                                         attentions[l], 1.0) for l in range(layout.n_layers)))

    with intervene(lm, AblateHeads({last: [head]})):
        got = logits().logits
    out["head ablation"] = _said(_close(got, _zeroed_head(model, layout, last, head, d, logits)),
                                 changed=_close(got, plain))
    out["quantized weights"] = _check_quantized(model, ids)
    return out


def _zeroed_head(model, layout, last: int, head: int, d: int, logits) -> torch.Tensor:
    """The logits with one head's slice of the last layer's output projection input zeroed by a plain pre-hook."""
    def zero(module, args):
        x = args[0].clone()
        x[..., head * d:(head + 1) * d] = 0
        return (x,)

    handle = layout.o_proj(last).register_forward_pre_hook(zero)
    try:
        with using(model, "eager"):
            return logits().logits
    finally:
        handle.remove()


def classify_encoder(model_type: str) -> dict:
    """One row of the encoders' table: {status, reason, checks}."""
    try:
        with _time_limit(BUILD_SECONDS), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model, tokenizer = tiny_encoder(model_type)
    except Exception as exc:  # noqa: BLE001
        return dict(status="refused", reason=f"not checked: a tiny random instance from its config does not build "
                                             f"here ({type(exc).__name__})")
    checks, refused = _run_or_refuse(run_encoder_checks, model, tokenizer)
    if refused:
        return refused
    failed = {k: v for k, v in checks.items() if v}
    if failed:
        name = next(iter(failed))
        return dict(status="refused", reason=f"{name}: {failed[name]}", checks=checks)
    return dict(status="supported", reason="", checks=checks)


def write(doc: Path | None = None, echo=print) -> None:
    """Every type checked, the table the package ships rewritten, and `doc`'s table between its marks."""
    import transformers

    torch.set_num_threads(1)
    rows = {}
    for model_type in causal_types():
        rows[model_type] = classify(model_type)
        echo(f"{model_type}: {rows[model_type]['status']} {rows[model_type]['reason']}")
    encoders = {}
    for model_type in ENCODERS:
        encoders[model_type] = classify_encoder(model_type)
        echo(f"{model_type} (encoder): {encoders[model_type]['status']} {encoders[model_type]['reason']}")
    table = {"transformers": transformers.__version__,
             "types": {k: {"status": v["status"], "reason": v["reason"], **({"blocks": v["blocks"]} if "blocks" in v
                                                                             else {})} for k, v in rows.items()},
             "encoders": {k: {"status": v["status"], "reason": v["reason"]} for k, v in encoders.items()}}
    TABLE.write_text(json.dumps(table, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    from lmlab.models.architectures import table as shipped

    shipped.cache_clear()  # the checks above read the table as it was; the page shows the one just written
    if doc is not None:
        write_doc(doc)


def write_doc(doc: Path) -> None:
    """The shipped table as Markdown between `doc`'s `<!-- architectures:begin -->` and `<!-- architectures:end -->`."""
    from lmlab.files import atomic_write, splice
    from lmlab.models.architectures import markdown

    atomic_write(doc, splice(doc.read_text(encoding="utf-8"), "architectures", markdown()))


def check(model_type: str) -> dict:
    """One type's checks, without writing: {"causal": ..., "encoder": ...} as far as the type is either."""
    return {"causal": classify(model_type), **({"encoder": classify_encoder(model_type)}
                                               if model_type in ENCODERS else {})}
