"""Modelled device time of the emulated NPU: FLOPs and bytes of a task, without computing it.

`DeviceModel` (rates, compute mode, accelerator patch) lives in the torch-free
`residency.devicemodel`; this module runs a task's torch operators shape-only.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves, tree_map_only

from residency.devicemodel import (
    ACCELERATOR_PATCHES,
    COMPUTE_MODES,
    DEFAULT_BYTES_PER_S,
    DEFAULT_FLOPS_PER_S,
    ENV_VAR,
    DeviceModel,
    add_model_arguments,
    model_changed,
    model_from_args,
)


@dataclass(frozen=True)
class Cost:
    """FLOPs and bytes of one device task, and its roofline time at a model's rates."""

    flops: int
    bytes: int
    written_bytes: int
    roofline_s: float
    operators: int


class ShapeOnlyMode(TorchDispatchMode):
    """Runs torch operators for their shapes only, adding up FLOPs and bytes.

    Views run for real (no data is touched); in-place and `out=` operators return their
    target unchanged; other operators return uninitialised tensors of the right shape
    (derived on the meta device). FLOPs of matmuls/convolutions come from
    `torch.utils.flop_counter`; every other operator counts one FLOP per output element.
    Bytes are the sizes of every tensor read plus every tensor written.
    """

    def __init__(self, flops_per_s: float = DEFAULT_FLOPS_PER_S,
                 bytes_per_s: float = DEFAULT_BYTES_PER_S) -> None:
        super().__init__()
        from torch.utils.flop_counter import flop_registry

        self._registry = flop_registry
        self._flops_per_s, self._bytes_per_s = flops_per_s, bytes_per_s
        self.flops = self.bytes = self.written_bytes = self.operators = 0
        self.roofline_s = 0.0

    def cost(self) -> Cost:
        """What the operators seen so far add up to."""
        return Cost(self.flops, self.bytes, self.written_bytes, self.roofline_s,
                    self.operators)

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (),
                           kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if func.is_view or func.overloadpacket in _METADATA_OPS:
            return func(*args, **kwargs)
        meta_args, meta_kwargs = tree_map_only(torch.Tensor, _to_meta, (args, kwargs))
        try:
            meta_out = func(*meta_args, **meta_kwargs)
        except (NotImplementedError, RuntimeError):  # no meta kernel: compute it for real
            return func(*args, **kwargs)
        written = _written_args(func, args, kwargs)
        out_leaves = [t for t in tree_leaves(meta_out) if isinstance(t, torch.Tensor)]
        read_bytes = sum(_nbytes(t) for t in tree_leaves((args, kwargs))
                         if isinstance(t, torch.Tensor) and not any(t is w for w in written))
        write_bytes = sum(_nbytes(t) for t in out_leaves)
        packet = func.overloadpacket
        if packet in self._registry:
            flops = int(self._registry[packet](*args, **kwargs, out_val=meta_out))
        else:
            flops = sum(t.numel() for t in out_leaves)
        self.operators += 1
        self.flops += flops
        self.bytes += read_bytes + write_bytes
        self.written_bytes += write_bytes
        self.roofline_s += max(flops / self._flops_per_s,
                               (read_bytes + write_bytes) / self._bytes_per_s)
        if written:
            return _rebuild(meta_out, written)
        return tree_map_only(torch.Tensor, _host_like, meta_out)


_METADATA_OPS = {torch.ops.aten.detach, torch.ops.aten.sym_size, torch.ops.aten.sym_stride,
                 torch.ops.aten.sym_numel, torch.ops.aten.sym_storage_offset}


def _to_meta(t: torch.Tensor) -> torch.Tensor:
    return torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device="meta")


def _host_like(t: torch.Tensor) -> torch.Tensor:
    return torch.empty_strided(t.shape, t.stride(), dtype=t.dtype)


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def _written_args(func: Any, args: Any, kwargs: Any) -> list[torch.Tensor]:
    """The argument tensors the operator writes (in-place self, `out=`), in schema order."""
    out: list[torch.Tensor] = []
    for i, arg in enumerate(func._schema.arguments):
        info = arg.alias_info
        if info is None or not info.is_write:
            continue
        value = args[i] if i < len(args) and not arg.kwarg_only else kwargs.get(arg.name)
        if isinstance(value, torch.Tensor):
            out.append(value)
        elif isinstance(value, (list, tuple)):
            out.extend(v for v in value if isinstance(v, torch.Tensor))
    return out


def _rebuild(meta_out: Any, written: list[torch.Tensor]) -> Any:
    """Outputs of a mutating operator: its written arguments in order, then new tensors."""
    pending = list(written)

    def take(t: torch.Tensor) -> torch.Tensor:
        return pending.pop(0) if pending else _host_like(t)
    return tree_map_only(torch.Tensor, take, meta_out)


_UNCACHEABLE = object()
_COST_CACHE: dict[Any, Cost] = {}
_COST_CACHE_MAX = 4096


def _describe(value: Any, depth: int = 0) -> Any:
    """What the cost of a task can depend on, for one captured value: a tensor's shape,
    strides and dtype; scalars themselves; sequences element-wise; anything else (or too
    deep) makes the task uncacheable."""
    if isinstance(value, torch.Tensor):
        return ("tensor", tuple(value.shape), tuple(value.stride()), value.dtype)
    if value is None or isinstance(value, (bool, int, float, str, torch.dtype)):
        return value
    if isinstance(value, (list, tuple)) and depth < 2 and len(value) <= 256:
        parts = tuple(_describe(v, depth + 1) for v in value)
        return _UNCACHEABLE if any(p is _UNCACHEABLE for p in parts) else (type(value), parts)
    return _UNCACHEABLE


def cost_key(fn: Callable[[], Any]) -> Any:
    """A key under which `fn`'s cost can be reused: its code and the shapes of everything
    its closure captured; None when a captured value is not a tensor, scalar or sequence of
    them (the task is traced every time)."""
    code = getattr(fn, "__code__", None)
    if code is None or getattr(fn, "__defaults__", None) or getattr(fn, "__kwdefaults__", None):
        return None
    parts = []
    for cell in getattr(fn, "__closure__", None) or ():
        try:
            part = _describe(cell.cell_contents)
        except ValueError:  # an empty cell
            return None
        if part is _UNCACHEABLE:
            return None
        parts.append(part)
    return code, tuple(parts)


def modelled_cost(fn: Callable[[], Any], model: DeviceModel) -> Cost:
    """Run `fn` with its torch operators shape-only; the FLOPs and bytes they add up to.

    A task whose code and captured shapes were traced before (e.g. the same denoising step
    every step) reuses that cost instead of tracing again: tracing is the emulator's own host
    work, which a real device does not cost the host.
    """
    key = cost_key(fn)
    if key is not None:
        key = (key, model.flops_per_s, model.bytes_per_s)
        cached = _COST_CACHE.get(key)
        if cached is not None:
            return cached
    mode = ShapeOnlyMode(model.flops_per_s, model.bytes_per_s)
    with mode:
        fn()
    cost = mode.cost()
    if key is not None:
        if len(_COST_CACHE) >= _COST_CACHE_MAX:
            _COST_CACHE.clear()
        _COST_CACHE[key] = cost
    return cost


__all__ = ["ACCELERATOR_PATCHES", "COMPUTE_MODES", "ENV_VAR", "Cost", "DeviceModel",
           "ShapeOnlyMode", "add_model_arguments", "cost_key", "model_changed",
           "model_from_args", "modelled_cost"]
