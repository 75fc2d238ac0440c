"""Encode one aten call's arguments as arg specs (the format documented in ``kforge.core.opcard``).

This runs on every op call while a model is profiled, and the integration guard reuses it at
dispatch time, so it is written for speed: a type check per value, a dict lookup per dtype.
"""

from __future__ import annotations

from typing import Any

import torch

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
