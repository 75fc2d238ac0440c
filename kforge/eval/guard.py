"""The run-time guard around a launcher call: a TorchDispatchMode that lets through allocations
and views only, and poisons every fresh allocation so that elements a kernel never writes fail.

Any other aten op (softmax, matmul through cuBLAS, a copy) is refused and recorded, even when
the launcher catches the exception. Layout copies (``.contiguous()``, ``copy_``) are recorded as a
fixable launcher error; real compute as a cheat.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from kforge.eval.sandbox import Violation

aten = torch.ops.aten

ALLOCATIONS = frozenset({
    aten.empty.memory_format, aten.empty_strided.default, aten.empty_like.default,
    aten.new_empty.default, aten.new_empty_strided.default,
})
ZERO_FILLED = frozenset({
    aten.zeros.default, aten.zeros_like.default, aten.new_zeros.default, aten.zero_.default,
})
# Metadata-only ops that the schema does not mark as views.
METADATA = frozenset({aten._unsafe_view.default, aten.lift_fresh.default})
COPIES = frozenset({
    aten.clone.default, aten.copy_.default, aten._to_copy.default, aten.fill_.Scalar,
    aten.fill_.Tensor,
})


def is_view_op(func: torch._ops.OpOverload) -> bool:
    """An op that returns aliases of its inputs and writes nothing (view, t, slice, expand...)."""
    schema = func._schema
    if any(a.alias_info is not None and a.alias_info.is_write for a in schema.arguments):
        return False
    return bool(schema.returns) and all(r.alias_info is not None for r in schema.returns)


@dataclass(frozen=True)
class Poison:
    """The value fresh allocations are filled with. Two calls use two different poisons, so an
    element no kernel wrote differs between them even where eager's value equals one poison."""

    floating: float
    integer: int
    boolean: bool

    def value_for(self, dtype: torch.dtype) -> float | int | bool:
        if dtype == torch.bool:
            return self.boolean
        if dtype.is_floating_point or dtype.is_complex:
            return self.floating
        info = torch.iinfo(dtype)
        return max(info.min, min(info.max, self.integer))

    def fill(self, t: torch.Tensor) -> None:
        if t.numel() and t.device.type != "meta":
            t.fill_(self.value_for(t.dtype))


POISON_A = Poison(floating=math.nan, integer=0x5A5A5A5A, boolean=True)
POISON_B = Poison(floating=-12345.0, integer=-0x5A5A5A5B, boolean=False)


class LauncherGuard(TorchDispatchMode):
    """Active while a launcher runs. ``violations`` lists what it refused."""

    def __init__(self, poison: Poison | None = None) -> None:
        super().__init__()
        self.poison = poison
        self.violations: list[Violation] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (),
                           kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        if func in ALLOCATIONS:
            out = func(*args, **kwargs)
            if self.poison is not None:
                self.poison.fill(out)
            return out
        if func in ZERO_FILLED or func in METADATA or is_view_op(func):
            return func(*args, **kwargs)
        if func in COPIES:
            violation = Violation(f"launcher copied data with {func} (a .contiguous(), .to() or "
                                  "copy_): launchers may only allocate and make views; let a "
                                  "kernel read the strides instead", kind="copy")
        elif func is aten._local_scalar_dense.default:
            violation = Violation("launcher read a tensor value on the host (.item(), bool(), "
                                  "int()): launch parameters may depend on shapes only")
        else:
            violation = Violation(f"launcher called {func}: PyTorch compute and vendor libraries "
                                  "are not allowed in a launcher, kernels must do the work")
        self.violations.append(violation)
        raise violation
