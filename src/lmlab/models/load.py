"""`load_model(spec)`: one entry point for every place weights come from.

`spec` is an embedded name (`smollm2-135m`, `minilm-l6`), a tiny test model (`tiny-llama`,
`tiny-gpt2`, `tiny-bert`), a `.gguf` file, a local Hugging Face folder, or a hub id. The model
comes back in eval mode, fp32 on CPU (bf16 on GPU unless a dtype is given), with its tokenizer and
its `Layout`. Remote code is never run unless `trust_remote_code=True` is asked for.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import inspect
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch
from safetensors import SafetensorError
from transformers import (AutoConfig, AutoModel, AutoModelForCausalLM, AutoModelForSequenceClassification,
                          AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase)
from transformers.utils import logging as hf_logging

from lmlab.errors import LmlabError
from lmlab.files import atomic_write
from lmlab.hub import hub_reachable
from lmlab.models import embedded, gguf_once, quantized, tiny
from lmlab.models.catalog import (check_hub_model, check_model_spec,  # noqa: F401  (lmlab.models exports
                                  known_names)  # known_names)
from lmlab.models.batch import module_device, pad_sequences
from lmlab.models.placement import Placement, dispatch
from lmlab.models.scratch import ScratchSpec, build_scratch
from lmlab.models.layout import Layout, family_of, is_encoder, layout_of


@functools.lru_cache(maxsize=None)
def _takes_logits_to_keep(model_class) -> bool:
    return "logits_to_keep" in inspect.signature(model_class.forward).parameters


@dataclass
class LoadedModel:
    model: PreTrainedModel
    tokenizer: PreTrainedTokenizerBase
    layout: Layout
    name: str
    source: str
    load_seconds: float = 0.0
    meta: dict = field(default_factory=dict)

    @property
    def device(self) -> torch.device:
        return module_device(self.model)

    @property
    def family(self) -> str:
        return self.layout.family

    def encode(self, texts: str | list[str], padding_side: str = "left", add_special_tokens: bool = True,
               position_ids: bool = True):
        """Tokenize a batch (left-padded by default, as generation wants) and check it fits the context.

        Left-padded decoder batches get `position_ids` counted from each prompt's first real token, so
        absolute-position models (GPT-2) see the same positions as unpadded; pass `position_ids=False`
        for `generate`, which derives them itself.
        """
        batch = [texts] if isinstance(texts, str) else list(texts)
        if not batch:
            raise LmlabError("no prompts were given")
        self.tokenizer.padding_side = padding_side
        with torch.device("cpu"):  # tokenized on the host, then moved to the model's device
            enc = self.tokenizer(batch, return_tensors="pt", padding=True, add_special_tokens=add_special_tokens)
        check_context(self, enc["input_ids"].shape[1])
        if position_ids and padding_side == "left" and self.layout.causal:
            enc["position_ids"] = (enc["attention_mask"].cumsum(-1) - 1).clamp_min(0)
        return enc.to(self.device)

    def last_logits(self, batch: dict) -> torch.Tensor:
        """(B, vocab) logits at the last position of a left-padded batch. Models whose forward takes
        `logits_to_keep` project only that position through the unembedding (a fifth of a small model's pass)."""
        return self.forward_last(batch).logits[:, -1]

    def forward_last(self, batch: dict):
        """The model's output for `batch`, its logits computed at least at the last position (only there
        where the forward takes `logits_to_keep`); the rest of the output (the cache) as usual."""
        if _takes_logits_to_keep(type(self.model)):
            return self.model(**batch, logits_to_keep=1)
        return self.model(**batch)

    def pad_batch(self, sequences: list[list[int]], padding_side: str = "left") -> dict[str, torch.Tensor]:
        """Pad token-id lists into a batch on the model's device (with position_ids counted from each row's
        first real token for causal models); checked against the context length."""
        if sequences:
            check_context(self, max(len(s) for s in sequences))
        pad = getattr(self.tokenizer, "pad_token_id", None)  # a scratch model may have no tokenizer: its config's
        pad = pad if pad is not None else (getattr(self.model.config, "pad_token_id", None) or 0)
        return pad_sequences(sequences, pad, padding_side, self.device, position_ids=self.layout.causal)


def check_context(loaded: LoadedModel, n_tokens: int) -> None:
    limit = loaded.layout.context_length
    if limit is not None and n_tokens > limit:
        raise LmlabError(f"a prompt of {n_tokens} tokens is longer than {loaded.name}'s context of {limit} "
                         f"tokens; shorten the prompt or use a model with a longer context")


def _default_dtype(device: torch.device, dtype: torch.dtype | str | None) -> torch.dtype:
    if isinstance(dtype, str):
        try:
            return getattr(torch, dtype)
        except AttributeError:
            raise LmlabError(f"unknown dtype '{dtype}'; use float32, bfloat16 or float16") from None
    if dtype is not None:
        return dtype
    return torch.float32 if device.type == "cpu" else torch.bfloat16


def _auto_class(config, head: str | None):
    encoder = is_encoder(config)
    family_of(config.model_type, encoder=encoder)  # a refused architecture stops here, before any weights load
    if head == "classifier":
        return AutoModelForSequenceClassification
    if head == "base" or (head is None and encoder):
        return AutoModel
    return AutoModelForCausalLM


def _from_pretrained(path_or_id: str, *, gguf_file=None, **options):
    """The model and its tokenizer through transformers' auto classes; a GGUF file's header read once for all of
    them (gguf_once)."""
    with gguf_once.read_once() if gguf_file else contextlib.nullcontext():
        return _auto_from_pretrained(path_or_id, gguf_file=gguf_file, **options)


def _auto_from_pretrained(path_or_id: str, *, head, num_labels, dtype, trust_remote_code, gguf_file=None,
                          local_files_only=False, placement: Placement | None = None):
    kwargs = dict(trust_remote_code=trust_remote_code, **({"local_files_only": True} if local_files_only else {}))
    if gguf_file:
        kwargs["gguf_file"] = gguf_file
    config = AutoConfig.from_pretrained(path_or_id, **kwargs)
    cls = _auto_class(config, head)
    extra = {"num_labels": num_labels} if (head == "classifier" and num_labels) else {}
    extra.update(quantized.load_options(config))  # a library's checkpoint (GPTQ, AWQ, NF4...): read de-quantized
    verbosity, bars = hf_logging.get_verbosity(), hf_logging.is_progress_bar_enabled()
    hf_logging.set_verbosity_error()  # keep GGUF/weight-loading chatter out of the user's terminal
    hf_logging.disable_progress_bar()
    try:
        if placement is not None:  # the weights stream to their devices (accelerate's big-model loading)
            if "device_map" in extra:
                raise LmlabError("a bitsandbytes checkpoint is read de-quantized on the host first; load it without "
                                 "--device-map")
            extra.update(placement.from_pretrained_kwargs())
        with warnings.catch_warnings():  # (that the folder's quantization_config is used, with lmlab's de-quantize)
            warnings.filterwarnings("ignore", message="You passed `quantization_config`")
            model = cls.from_pretrained(path_or_id, dtype=dtype, **kwargs, **extra)
        model._lmlab_quantized = quantized.to_plain(model, config)
        tokenizer = AutoTokenizer.from_pretrained(path_or_id, **kwargs)
    finally:
        hf_logging.set_verbosity(verbosity)
        if bars:
            hf_logging.enable_progress_bar()
    return model, tokenizer


def _finish(model, tokenizer, name, source, device, dtype, t0, placement: Placement | None = None,
            **meta) -> LoadedModel:
    if placement is None:
        model = model.to(device=device, dtype=dtype).eval()
    elif getattr(model, "hf_device_map", None):  # loaded onto its devices already
        model = model.eval()
        placement.check_resolved(model.hf_device_map)
    else:  # built or loaded in memory: dispatched now
        model = dispatch(model.to(dtype=dtype), placement, dtype).eval()
    if getattr(model, "_lmlab_quantized", None):
        meta["quantized"] = model._lmlab_quantized
    if placement is not None:
        # as a --device-map file says it (a GPU's index stays a number, so the recorded map loads the same way)
        meta["device_map"] = {k: v if isinstance(v, int) else str(v) for k, v in model.hf_device_map.items()}
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token or tokenizer.unk_token
    return LoadedModel(model=model, tokenizer=tokenizer, layout=layout_of(model), name=name, source=source,
                       load_seconds=time.perf_counter() - t0, meta=meta)


def _load_embedded(entry: embedded.EmbeddedModel, *, head, num_labels, dtype, device, t0,
                   placement: Placement | None = None) -> LoadedModel:
    kw = dict(head=head, num_labels=num_labels, dtype=torch.float32, trust_remote_code=False)
    if entry.gguf_file is None:  # an ordinary HF folder inside a package
        model, tok = _from_pretrained(str(entry.package_dir()), **kw)
        return _finish(model, tok, entry.name, f"package {entry.pip}", device, dtype, t0, placement, cached=True)
    cached = embedded.is_cached(entry)
    if not cached:
        _require_gguf()
        folder, file = entry.gguf_location()
        model, tok = _from_pretrained(str(folder), gguf_file=file, **kw)
        embedded.write_cache(entry, model, tok)
        if entry.parts:  # the assembled GGUF has served; the de-quantized cache replaces it
            (folder / file).unlink(missing_ok=True)
    cache_dir = embedded.cached_model_dir(entry.name)
    if cached or head is not None:
        embedded.serve_tokenizer_from_file(cache_dir)
        model, tok = _from_pretrained(str(cache_dir), **kw)
    else:  # the model just de-quantized serves; the tokenizer is the cache's, as every later load's is
        tok = AutoTokenizer.from_pretrained(str(cache_dir), trust_remote_code=False)
    return _finish(model, tok, entry.name, f"package {entry.pip} (GGUF de-quantized, cached)", device, dtype, t0,
                   placement, cached=cached)


def _require_gguf() -> None:
    try:
        import gguf  # noqa: F401
    except ImportError:
        raise LmlabError("loading a .gguf file needs the `gguf` package: pip install gguf") from None


def load_model(spec: str, *, dtype: torch.dtype | str | None = None, device: str | torch.device | None = None,
               head: str | None = None, num_labels: int | None = None, trust_remote_code: bool = False,
               seed: int = 0, scratch: ScratchSpec | None = None, tokenizer: Any = None,
               device_map: str | dict | None = None, max_memory: str | dict | None = None,
               offload: str | Path | None = None) -> LoadedModel:
    """Load `spec` (see module doc). `head`: None (the family's natural head), 'base' or 'classifier'.
    `spec="scratch"` builds a from-scratch Llama stack from `scratch` (a `ScratchSpec`), with `tokenizer`
    (any object with the ids the caller needs, e.g. a word-level vocabulary) attached as is.
    `device_map` (auto, balanced, balanced_low_0, sequential, a {module: device} dict or a JSON file of one),
    `max_memory` and `offload` spread a model over devices and disk (models/placement.py); `device` is then
    unused."""
    placement = Placement.parse(device_map, max_memory, offload)
    # weights are built (or read) on the CPU, whatever the default device, then moved; what a load draws (a new
    # classifier head on a pretrained model) comes from `seed`, and the caller's random stream is left as it was
    with torch.device("cpu"), torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return _load_model(spec, dtype=dtype, device=device, head=head, num_labels=num_labels,
                           trust_remote_code=trust_remote_code, seed=seed, scratch=scratch, tokenizer=tokenizer,
                           placement=placement)


def _load_model(spec: str, *, dtype, device, head, num_labels, trust_remote_code, seed, scratch, tokenizer,
                placement=None):
    t0 = time.perf_counter()
    device = torch.device(device) if device is not None else torch.device("cuda" if torch.cuda.is_available()
                                                                          else "cpu")
    dtype = _default_dtype(torch.device("cpu") if placement is not None and placement.host_only() else device, dtype)
    kw = dict(head=head, num_labels=num_labels, dtype=dtype, trust_remote_code=trust_remote_code)

    kind = check_model_spec(spec, scratch_ok=scratch is not None)  # a path that is not a model: one sentence
    if kind == "scratch":
        if placement is not None:
            raise LmlabError("a from-scratch model is trained: --device-map is for loading a model to study")
        model = build_scratch(scratch).to(device=device, dtype=dtype).eval()
        return LoadedModel(model=model, tokenizer=tokenizer, layout=layout_of(model), name="scratch",
                           source=f"random init, seed {scratch.seed}", load_seconds=time.perf_counter() - t0)
    if kind == "tiny":
        model, tok = tiny.build_tiny(spec, seed=seed, head=head, num_labels=num_labels)
        return _finish(model, tok, spec, f"random init, seed {seed}", device, dtype, t0, placement)
    if kind == "embedded":
        return _load_embedded(embedded.EMBEDDED[spec], head=head, num_labels=num_labels, dtype=dtype,
                              device=device, t0=t0, placement=placement)
    kw["placement"] = placement

    path = Path(spec).expanduser()
    if kind == "gguf":
        _require_gguf()
        model, tok = _wrap_load_errors(spec, lambda: _from_pretrained(str(path.parent), gguf_file=path.name, **kw))
        return _finish(model, tok, path.stem, f"GGUF file {path}", device, dtype, t0, placement)
    if kind == "folder":
        model, tok = _wrap_load_errors(spec, lambda: _from_pretrained(str(path), **kw))
        loaded = _finish(model, tok, path.name, f"directory {path}", device, dtype, t0, placement)
        _apply_lmlab_extras(loaded, path)
        return loaded
    # kind == "hub"
    if not hub_reachable():  # once, fast: never minutes of retries on a machine without a hub
        check_hub_model(spec)
        kw["local_files_only"] = True
    model, tok = _wrap_load_errors(spec, lambda: _from_pretrained(spec, **kw))
    return _finish(model, tok, spec.split("/")[1], f"hub {spec}", device, dtype, t0, placement)


LMLAB_FILE = "lmlab.json"  # what lmlab adds to a saved HF folder (e.g. the sparse attention gate)


def resize_vocabulary(model: PreTrainedModel, size: int) -> None:
    """Grow (or shrink) a model's token embeddings (and a tied output head) to `size` rows; new rows are
    drawn from a normal with the old rows' mean and covariance, so no new token starts out preferred."""
    if size < 1:
        raise LmlabError(f"a vocabulary of {size} tokens is not possible")
    model.resize_token_embeddings(size, mean_resizing=True)


def save_model(loaded: LoadedModel, path: str | Path, sparse_attention: bool = False) -> Path:
    """Save as an ordinary HF folder (safetensors + tokenizer) that `load_model` reads back.

    `sparse_attention=True` records that the model runs with the deterministic edge gate of
    `SparseAttention` (keep s_ij > 0) on every layer; `load_model` installs it again, so every later
    analysis sees the sparse model.
    """
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    loaded.model.save_pretrained(path, safe_serialization=True)
    loaded.tokenizer.save_pretrained(path)
    atomic_write(path / LMLAB_FILE, json.dumps({"sparse_attention": bool(sparse_attention)}, indent=1))
    return path


# What a saved folder's lmlab.json may ask for, and who restores it. The interventions layer registers
# "sparse_attention" on import (models never import interventions: the layers point one way).
EXTRA_HANDLERS: dict[str, Callable[[LoadedModel], None]] = {}


def _apply_lmlab_extras(loaded: LoadedModel, path: Path) -> None:
    extras_file = path / LMLAB_FILE
    if not extras_file.is_file():
        return
    try:
        extras = json.loads(extras_file.read_text())
    except ValueError as exc:
        raise LmlabError(f"{extras_file} is not valid JSON ({exc})") from None
    for key, wanted in extras.items():
        if not wanted:
            continue
        if key not in EXTRA_HANDLERS:
            raise LmlabError(f"{path} was saved with {key}; import lmlab.interventions (or use lmlab.load_model) "
                             f"to load it with that restored")
        EXTRA_HANDLERS[key](loaded)
        loaded.meta[key] = True


def _wrap_load_errors(spec: str, fn):
    try:
        return fn()
    except LmlabError:
        raise
    except (OSError, ValueError, KeyError, SafetensorError) as exc:  # a file damaged past its header, say
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise LmlabError(f"could not load '{spec}': {first}") from exc




def classifier_from(loaded: LoadedModel, num_labels: int, seed: int = 0):
    """A sequence-classification model whose encoder carries `loaded`'s weights (the head is new, drawn from
    `seed`), for studies that fine-tune a classifier on a model passed in rather than named."""
    import copy

    config = copy.deepcopy(loaded.model.config)
    config.num_labels = num_labels
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForSequenceClassification.from_config(config)
    model.base_model.load_state_dict(loaded.model.base_model.state_dict())
    return model.to(device=loaded.device, dtype=next(loaded.model.parameters()).dtype).eval()


def weights_fingerprint(loaded: LoadedModel) -> str:
    """A short hash of every parameter and buffer: a model edited in memory gets its own run folder."""
    digest = hashlib.blake2b(digest_size=8)
    state = loaded.model.state_dict()
    if any(t.device.type == "meta" for t in state.values()):  # offloaded layers: read back from their store
        from accelerate.utils.modeling import get_state_dict_offloaded_model

        state = get_state_dict_offloaded_model(loaded.model)
    for name, tensor in sorted(state.items()):
        digest.update(name.encode())
        digest.update(tensor.detach().to("cpu").contiguous().view(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()
