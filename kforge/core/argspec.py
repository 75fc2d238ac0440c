"""The arg-spec format: how one aten call's arguments are named (the format documented in
``kforge.core.opcard``), and the operator they are passed to.

Encoding runs on every op call while a model is profiled, and the integration guard reuses it at
dispatch time, so it is written for speed: a type check per value, a dict lookup per dtype.
"""

from __future__ import annotations

from functools import cache
from typing import Any

import torch

from kforge.errors import KforgeError

# Keyed by the dtype object, so aliases (torch.half) map to the canonical name ("float16").
_DTYPE_NAMES: dict[torch.dtype, str] = {
    value: str(value).removeprefix("torch.") for value in vars(torch).values()
    if isinstance(value, torch.dtype)
}


def dtype_name(dtype: torch.dtype) -> str:
    """``torch.bfloat16`` -> ``"bfloat16"``."""
    return _DTYPE_NAMES.get(dtype) or str(dtype).removeprefix("torch.")


def tensor_spec(t: torch.Tensor) -> dict:
    return {"t": "tensor", "shape": list(t.shape), "stride": list(t.stride()),
            "dtype": dtype_name(t.dtype), "offset": t.storage_offset()}


def encode_value(value: Any) -> Any:
    """The arg spec of one argument value."""
    if isinstance(value, torch.Tensor):
        if value.layout is not torch.strided:  # sparse and other layouts have no strides
            return {"t": "tensor", "shape": list(value.shape), "dtype": dtype_name(value.dtype),
                    "layout": str(value.layout).removeprefix("torch.")}
        return tensor_spec(value)
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (list, tuple)):
        return {"t": "list", "items": [encode_value(item) for item in value]}
    if isinstance(value, torch.dtype):
        return {"t": "dtype", "v": dtype_name(value)}
    if isinstance(value, torch.device):
        return {"t": "device", "v": str(value)}
    if isinstance(value, torch.layout):
        return {"t": "layout", "v": str(value).removeprefix("torch.")}
    if isinstance(value, torch.memory_format):
        return {"t": "memory_format", "v": str(value).removeprefix("torch.")}
    if isinstance(value, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        return {"t": "sym", "v": str(value)}
    return {"t": "other", "v": type(value).__name__}


def encode_call(func: Any, args: tuple | list, kwargs: dict) -> tuple[list, dict]:
    """``(args_spec, kwargs_spec)`` for one call of ``func`` (an OpOverload; not encoded here)."""
    return [encode_value(a) for a in args], {k: encode_value(v) for k, v in kwargs.items()}


@cache
def resolve_op(name: str) -> torch._ops.OpOverload:
    """``"aten._softmax.default"`` -> ``torch.ops.aten._softmax.default``."""
    parts = name.split(".")
    if len(parts) != 3:
        raise KforgeError(f"{name!r} is not an operator name of the form namespace.op.overload")
    namespace, op_name, overload = parts
    try:
        packet = getattr(getattr(torch.ops, namespace), op_name)
        return getattr(packet, overload)
    except (AttributeError, RuntimeError):
        raise KforgeError(f"PyTorch {torch.__version__} has no operator {name!r}") from None


def storage_span(shape: tuple[int, ...] | list[int], stride: tuple[int, ...] | list[int]) -> int:
    """Elements between a tensor's first and last element, inclusive (0 for an empty tensor)."""
    if any(size == 0 for size in shape):
        return 0
    return 1 + sum((size - 1) * abs(step) for size, step in zip(shape, stride))


_TENSOR_KEYS = frozenset({"t", "shape", "stride", "dtype", "offset"})


def freeze(spec: Any) -> Any:
    """An arg spec as a hashable value, equal exactly when the specs' canonical JSON is equal:
    dict keys in any order, lists and tuples alike, but ``1``, ``1.0`` and ``True`` apart. (A
    strided tensor's shape and strides, always integers, are compared as integer tuples: the
    fast path, since this runs on every call of a patched op.)"""
    kind = type(spec)
    if kind is dict:
        if spec.keys() == _TENSOR_KEYS and spec["t"] == "tensor":
            return ("tensor", tuple(spec["shape"]), tuple(spec["stride"]), spec["dtype"],
                    spec["offset"])
        return (dict, tuple(sorted((key, freeze(value)) for key, value in spec.items())))
    if kind is list or kind is tuple:
        return (list, tuple([freeze(value) for value in spec]))
    if kind is float:
        return (float, repr(spec))  # repr: NaN equals NaN, -0.0 differs from 0.0
    if kind is bool or kind is int:
        return (kind, spec)
    return spec
