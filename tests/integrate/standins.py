"""Stand-ins for a loaded cubin (``kforge.runtime.cubin.KernelModule``) in integration tests: the
same ``launch``, ``has_kernel`` and ``param_widths``, with Python functions for kernels."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any


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
