"""An accelerator emulated on the CPU, so that a CPU-only CI catches the device bugs a GPU run would.

torch's FakeTensorMode cannot stand in for a GPU on a CPU-only build: a fake `cuda:0` tensor crashes torch's own
indexing ("PyTorch is not linked with support for cuda devices"), and fake tensors hold no values, so no study gets
past its first `.item()`. This module instead registers torch's PrivateUse1 backend as a Python device named
`fakegpu` and gives it real values: a tensor on `fakegpu:0` wraps a CPU tensor, every operation on it runs on the CPU
and its result lives on `fakegpu:0` again. On the way it enforces what CUDA enforces and the CPU does not:

- every tensor of an operation on one device (a 0-dim CPU tensor aside, as CUDA allows a scalar); the exceptions are
  CUDA's own: a copy between devices, and indices on the host for `x[idx]` / `x[idx] = y`;
- a random draw on the device takes a generator of the device ("Expected a 'fakegpu' device type for generator but
  found 'cpu'", CUDA's message);
- a device tensor does not become a NumPy array without `.cpu()` (torch refuses any non-CPU tensor);

so a tensor made on the host and mixed into the model's maths (an index, a mask, an `arange` without a device, a
batch never moved) fails here as it fails on a GPU, with the numbers of a CPU run. What it does not see: numerics of
GPU kernels, bf16 autocast (`torch.autocast` does nothing on this device: the bf16 path is checked on the CPU with
`dtype="bfloat16"`), several GPUs, NCCL, and memory.

Use: `with emulated_gpu(): ...` makes `fakegpu:0` a device lmlab runs on: `load_model(..., device=DEVICE)`, and a
study's `--device auto` resolves to it (torch.cuda stays unavailable; accelerate's device is the emulated one).
"""

from __future__ import annotations

import contextlib

import torch
from torch.overrides import TorchFunctionMode

NAME = "fakegpu"
HOST = torch.device("cpu")
aten = torch.ops.aten

_state: dict = {}


class OnDevice(torch.Tensor):
    """A tensor on the emulated device: `inner` holds its values on the CPU."""

    inner: torch.Tensor

    @staticmethod
    def __new__(cls, inner: torch.Tensor):
        out = torch.Tensor._make_wrapper_subclass(cls, inner.size(), strides=inner.stride(),
                                                  storage_offset=inner.storage_offset(), dtype=inner.dtype,
                                                  layout=inner.layout, device=DEVICE,
                                                  requires_grad=inner.requires_grad)
        out.inner = inner
        return out

    def __repr__(self, **kwargs):  # noqa: D105
        return f"OnDevice({self.inner!r})"

    __torch_function__ = torch._C._disabled_torch_function_impl

    def untyped_storage(self):  # (safetensors and transformers' saving compare storages to find shared tensors)
        return self.inner.untyped_storage()

    def data_ptr(self):
        return self.inner.data_ptr()

    @property
    def data(self):
        return torch._C.TensorBase.data.__get__(self)

    @data.setter
    def data(self, value):  # `param.data = other` (transformers' resizing): the values follow the new shape
        torch._C.TensorBase.data.__set__(self, value)
        self.inner = value.inner if type(value) is OnDevice else value

    def __deepcopy__(self, memo):  # (a copied model: its parameters stay parameters, on the device)
        if id(self) in memo:
            return memo[id(self)]
        out = OnDevice(self.inner.detach().clone())
        if self.requires_grad:
            out.requires_grad_(True)
        if getattr(self, "_is_param", False):
            out._is_param = True
        memo[id(self)] = out
        return out

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        return _run(func, args, kwargs or {})


# operations that CUDA runs with tensors on two devices
_MIXED_OK = {aten.copy_.default, aten._to_copy.default, aten.index.Tensor, aten.index_put_.default,
             aten.index_put.default, aten._index_put_impl_.default, aten._has_compatible_shallow_copy_type.default,
             aten.lift_fresh.default, aten.set_.source_Tensor}


class _Generator(torch.Generator):
    """`torch.Generator(device="fakegpu:0")`: a host generator marked as the device's (torch's own needs a C++ hook
    for a device of a Python backend); a draw on the device takes only these, as CUDA takes only CUDA's."""

    def __new__(cls, device="cpu"):
        generator = super().__new__(cls, device=HOST)
        generator.on_device = torch.device(device).type == NAME
        return generator

    def __init__(self, device="cpu"):  # (built in __new__)
        pass


def _generator_device(generator) -> str:
    """A draw reaches `_run` with a fresh Python wrapper of the generator: a device generator is known there by the
    flag `_Factories` set when the call passed one (`_state["device_generator"]`)."""
    if getattr(generator, "on_device", False) or _state.get("device_generator"):
        return NAME
    return generator.device.type


def _wants_device(kwargs: dict) -> bool:
    device = kwargs.get("device")
    return device is not None and torch.device(device).type == NAME


def _tensors(obj, out: list) -> list:
    """The tensors in an operation's arguments (tensors, lists and tuples of them, scalars), in order."""
    if isinstance(obj, torch.Tensor):
        out.append(obj)
    elif isinstance(obj, (list, tuple)):
        for item in obj:
            _tensors(item, out)
    elif isinstance(obj, dict):
        for item in obj.values():
            _tensors(item, out)
    return out


def _map(fn, obj):
    """`fn` on every tensor of a (nested) argument, the rest as it is (torch's pytree, without its cost per op)."""
    if isinstance(obj, torch.Tensor):
        return fn(obj)
    if isinstance(obj, (list, tuple)) and not hasattr(obj, "_fields"):
        return type(obj)(_map(fn, item) for item in obj)
    if isinstance(obj, dict):
        return {k: _map(fn, v) for k, v in obj.items()}
    return obj


def _run(func, args, kwargs):
    tensors = _tensors(kwargs, _tensors(args, []))
    on_device = [t for t in tensors if type(t) is OnDevice]
    factory = _wants_device(kwargs)
    if on_device and func not in _MIXED_OK:
        host = [t for t in tensors if type(t) is not OnDevice and t.dim() > 0]
        if host:
            raise RuntimeError(f"Expected all tensors to be on the same device, but found at least two devices, "
                               f"{DEVICE} and {host[0].device}! ({func})")
    generator = kwargs.get("generator")
    if generator is not None and (on_device or factory) and _generator_device(generator) != NAME:
        raise RuntimeError(f"Expected a '{NAME}' device type for generator but found '{generator.device.type}'")
    if func is aten._to_copy.default:
        return _to_copy(args[0], kwargs)
    if func is aten.copy_.default:  # between devices: the values move, the destination stays where it is
        dst, src = args[0], args[1]
        _inner(dst).copy_(_inner(src), *args[2:])
        return dst
    inner_kwargs = dict(kwargs, device=HOST) if factory else kwargs
    out = func(*_map(_inner, args), **_map(_inner, inner_kwargs)) if on_device else func(*args, **inner_kwargs)
    if not (on_device or factory):
        return out
    for t in on_device:
        if t.inner.shape != t.shape:
            raise RuntimeError(f"emulated GPU: {func} resized a tensor in place (its wrapper cannot follow)")
    by_inner = {id(t.inner): t for t in on_device}  # an in-place op returns its own argument
    return _map(lambda t: _wrap(t, by_inner), out)


def _wrap(t, by_inner: dict):
    if type(t) is OnDevice:
        return t
    same = by_inner.get(id(t))
    return same if same is not None else OnDevice(t)


def _inner(t):
    return t.inner if type(t) is OnDevice else t


def _to_copy(x, kwargs):
    target = kwargs.get("device")
    target = torch.device(target) if target is not None else x.device
    moved = aten._to_copy.default(_inner(x), **dict(kwargs, device=HOST))
    return OnDevice(moved) if target.type == NAME else moved


_FACTORIES = {getattr(torch, name) for name in (
    "tensor", "as_tensor", "asarray", "scalar_tensor", "arange", "range", "zeros", "ones", "full", "empty",
    "empty_strided", "rand", "randn", "randint", "randperm", "normal", "linspace", "logspace", "eye", "tril_indices",
    "triu_indices", "zeros_like", "ones_like", "full_like", "empty_like", "rand_like", "randn_like",
    "randint_like")}


class _Factories(TorchFunctionMode):
    """A tensor made on the device (`torch.tensor(data, device=...)`, `torch.arange(..., device=...)`) is made on
    the host and moved: torch's own paths for these onto a Python backend trip an internal assert or resize the
    result behind its wrapper. Also: list indices, `.tolist()` and `.numpy()` as CUDA has them."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in _FACTORIES and _wants_device(kwargs):
            generator = kwargs.get("generator")
            if generator is not None and _generator_device(generator) != NAME:
                raise RuntimeError(f"Expected a '{NAME}' device type for generator but found "
                                   f"'{generator.device.type}'")
            return func(*args, **dict(kwargs, device=HOST)).to(DEVICE)
        if getattr(kwargs.get("generator"), "on_device", False):
            _state["device_generator"] = True
            try:
                return func(*args, **kwargs)
            finally:
                _state["device_generator"] = False
        if func in (torch.Tensor.__getitem__, torch.Tensor.__setitem__) and isinstance(args[0], OnDevice):
            args = (args[0], _host_lists(args[1]), *args[2:])  # x[:, [1, 0]]: a list index becomes a host tensor
        if func is torch.Tensor.tolist and isinstance(args[0], OnDevice):  # as CUDA: copied to the host
            return args[0].inner.tolist()
        if func is torch.Tensor.numpy and isinstance(args[0], OnDevice):  # CUDA's refusal
            raise TypeError(f"can't convert {DEVICE} device type tensor to numpy. Use Tensor.cpu() to copy the "
                            f"tensor to host memory first.")
        return func(*args, **kwargs)


def _host_lists(index):
    """Python lists in an index as host tensors (CUDA takes host indices; torch would build them on the device, by
    a path that trips an internal assert on a Python backend)."""
    if isinstance(index, list):
        return torch.tensor(index, device=HOST)
    if isinstance(index, tuple):
        return tuple(_host_lists(i) for i in index)
    return index


def _setup() -> None:
    """Register the Python backend once per process (PrivateUse1 renamed `fakegpu`; factories on it run here)."""
    if _state.get("ready"):
        return
    from torch.utils.backend_registration import _setup_privateuseone_for_python_backend

    _setup_privateuseone_for_python_backend(NAME)
    lib = torch.library.Library("_", "IMPL")
    lib.fallback(lambda op, *args, **kwargs: _run(op, args, kwargs), "PrivateUse1")
    _state.update(ready=True, lib=lib)


_setup()
DEVICE = torch.device(f"{NAME}:0")


@contextlib.contextmanager
def emulated_gpu():
    """lmlab runs on `fakegpu:0` inside this block: `--device auto` resolves to it and accelerate trains on it
    (its ACCELERATE_TORCH_DEVICE, with its process state cleared on the way in and out)."""
    import os

    from accelerate.state import AcceleratorState

    from lmlab.studies import runtime

    real_resolve, env, real_generator = runtime.resolve_device, os.environ.get("ACCELERATE_TORCH_DEVICE"), torch.Generator
    torch.Generator = _Generator
    runtime.resolve_device = lambda spec: str(DEVICE) if spec == "auto" else real_resolve(spec)
    os.environ["ACCELERATE_TORCH_DEVICE"] = str(DEVICE)
    AcceleratorState._reset_state(reset_partial_state=True)
    try:
        with _Factories():
            yield DEVICE
    finally:
        runtime.resolve_device, torch.Generator = real_resolve, real_generator
        if env is None:
            os.environ.pop("ACCELERATE_TORCH_DEVICE", None)
        else:
            os.environ["ACCELERATE_TORCH_DEVICE"] = env
        AcceleratorState._reset_state(reset_partial_state=True)
