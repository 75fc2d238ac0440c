"""Stand-ins in integration tests: for a loaded cubin (``kforge.runtime.cubin.KernelModule``), the
same ``launch``, ``has_kernel`` and ``param_widths`` with Python functions for kernels; and for a
kernel table entry's runner, the op computed by PyTorch with its calls counted."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils import _pytree as pytree

from kforge.core.argspec import resolve_op


@dataclass(frozen=True)
class Launch:
    """One launch as a ``KernelModule`` would receive it."""

    kernel: str
    grid: tuple[int, ...]
    block: tuple[int, ...]
    shared_mem: int
    params: tuple[Any, ...]


class PyKernels:
    """Kernels by name, each a Python function called with the launch's parameters (tensors, and
    numpy scalars of the kernel's widths); every launch is recorded."""

    def __init__(self, widths: dict[str, list[int]] | None = None,
                 **kernels: Callable[..., None]) -> None:
        self.kernels = kernels
        self.widths = widths or {}
        self.launches: list[Launch] = []

    def has_kernel(self, name: str) -> bool:
        return name in self.kernels

    def param_widths(self, name: str) -> list[int] | None:
        if name not in self.kernels:
            raise KeyError(name)
        return self.widths.get(name)  # None: like a driver that cannot list parameters

    def launch(self, name: str, grid: tuple[int, ...], block: tuple[int, ...], shared_mem: int,
               params: Sequence[Any]) -> None:
        self.launches.append(Launch(name, tuple(grid), tuple(block), shared_mem, tuple(params)))
        self.kernels[name](*params)


class Counting:
    """A stand-in kernel: the op computed by PyTorch in float64 (another variant, so a guard in
    front of the op lets it through), with its calls counted."""

    def __init__(self, op: str, calls: Counter, fail: bool = False) -> None:
        self.func = resolve_op(op)
        self.op, self.calls, self.fail = op, calls, fail

    def __call__(self, args: tuple, kwargs: dict):
        self.calls[self.op] += 1
        if self.fail:
            raise RuntimeError("kernel launch failed")
        dtype = next(a.dtype for a in args if isinstance(a, torch.Tensor))
        result = self.func(*pytree.tree_map_only(torch.Tensor, torch.Tensor.double, args),
                           **kwargs)
        return pytree.tree_map_only(torch.Tensor, lambda t: t.to(dtype), result)
