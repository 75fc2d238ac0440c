"""Reading an op card as the kernel library needs it: tensor layouts, scalar arguments, and the
outputs eager PyTorch would return (found by running the op on meta tensors, which shares eager's
shape, dtype and stride rules without touching a GPU)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from kforge.core.argspec import (
    ArgSpecError,
    bind,
    decode,
    dtype_name,
    resolve_op,
)
from kforge.core.meta import meta_call
from kforge.core.opcard import DTYPE_BYTES, OpCard

# Storage types the library computes with (always accumulating in float).
FLOAT_CTYPES = {"float32": "float", "float16": "__half", "bfloat16": "__nv_bfloat16"}
INDEX_CTYPES = {"int64": "int64_t", "int32": "int32_t"}
_SHORT = {"float32": "f32", "float16": "f16", "bfloat16": "bf16", "int64": "i64", "int32": "i32"}


class Declined(Exception):
    """The library has no kernel for this card; the message says why, in one line."""


@dataclass(frozen=True)
class TensorArg:
    """A tensor argument as the card describes it (no data)."""

    shape: tuple[int, ...]
    stride: tuple[int, ...]
    dtype: str
    offset: int = 0

    @classmethod
    def from_spec(cls, spec: dict) -> TensorArg:
        if "stride" not in spec:
            raise Declined(f"a tensor with layout {spec.get('layout', '?')} has no strides")
        return cls(tuple(spec["shape"]), tuple(spec["stride"]), spec["dtype"], spec.get("offset", 0))

    @classmethod
    def from_tensor(cls, t: torch.Tensor) -> TensorArg:
        return cls(tuple(t.shape), tuple(t.stride()), dtype_name(t.dtype), t.storage_offset())

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def itemsize(self) -> int:
        return DTYPE_BYTES[self.dtype]

    @property
    def is_contiguous(self) -> bool:
        return all(size == 1 or step == want
                   for size, step, want in zip(self.shape, self.stride, contiguous_strides(self.shape)))

    @property
    def ctype(self) -> str:
        """The CUDA storage type; declines dtypes the library has no kernels for."""
        require_float(self)
        return FLOAT_CTYPES[self.dtype]

    def describe(self) -> str:
        dims = ",".join(str(d) for d in self.shape)
        return f"{_SHORT.get(self.dtype, self.dtype)}[{dims}]"


def require_float(*tensors: TensorArg) -> None:
    """Decline unless every tensor has a dtype the library computes with."""
    for t in tensors:
        if t.dtype not in FLOAT_CTYPES:
            raise Declined(f"dtype {t.dtype} is not supported (float32, float16, bfloat16 are)")


def contiguous_strides(shape: tuple[int, ...] | list[int]) -> tuple[int, ...]:
    strides, step = [], 1
    for size in reversed(shape):
        strides.append(step)
        step *= max(size, 1)
    return tuple(reversed(strides))


@dataclass(frozen=True)
class Call:
    """One card's call, decoded: ``args`` and ``kwargs`` as passed, eager's outputs, and
    ``bound``, every argument by its schema name (defaults filled in)."""

    op: str
    args: list
    kwargs: dict
    outputs: tuple[TensorArg, ...]
    bound: dict[str, Any]

    def value(self, index: int) -> Any:
        """Argument ``index`` of the op's schema, passed by position or keyword, or its default."""
        return self.bound[self.arg_name(index)]

    def arg_name(self, index: int) -> str:
        """The schema name of argument ``index``: how a launch plan refers to it."""
        return resolve_op(self.op)._schema.arguments[index].name

    def tensor(self, index: int, what: str) -> TensorArg:
        value = self.value(index)
        if not isinstance(value, TensorArg):
            raise Declined(f"{what} is not a tensor")
        return value

    def float_tensor(self, index: int, what: str) -> TensorArg:
        """Argument ``index`` as the library computes on it: a non-empty float tensor."""
        value = self.tensor(index, what)
        require_float(value)
        if value.numel == 0:
            raise Declined(f"{what} is empty")
        return value


def read_call(card: OpCard) -> Call:
    """The card's call with tensors as ``TensorArg``, lists as lists, dtypes as ``torch.dtype``."""
    try:
        bound = {name: decode(spec, TensorArg.from_spec, make_list=list)
                 for name, spec in bind(card.op, card.args, card.kwargs).items()}
        args = list(bound.values())[:len(card.args)]
        kwargs = {name: bound[name] for name in card.kwargs}
        return Call(card.op, args, kwargs, eager_outputs(card), bound)
    except ArgSpecError as exc:
        raise Declined(str(exc)) from None


def eager_outputs(card: OpCard) -> tuple[TensorArg, ...]:
    """What eager returns for the card's call (shape, stride, dtype), by running it on meta
    tensors (``kforge.core.meta``): a factory too, whose tensor, of whatever size the card (data)
    says, would otherwise be made in this process's memory."""
    results = meta_call(card.op, card.args, card.kwargs).results
    if not all(isinstance(t, torch.Tensor) for t in results):
        raise Declined(f"{card.op} returns something other than tensors")
    return tuple(TensorArg.from_tensor(t) for t in results)
