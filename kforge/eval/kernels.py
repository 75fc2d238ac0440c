"""The ``kernels`` object a launcher receives, and the cuda.core module behind it on a GPU.

``kernels.NAME(grid, block, *params, shared_mem=0)`` (or ``kernels["NAME"](...)``) checks its
arguments, refuses a launch on any stream but the evaluation's, counts launches (a candidate must
run at least one of its own kernels) and hands the launch to a backend: ``CudaModule`` checks the
kernel's parameters and launches through the integration runtime's ``KernelModule`` (the NVRTC
cubin loaded with cuda.core, launched on PyTorch's current stream), the same code that runs the
winners in the model.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any, Protocol

import numpy as np
import torch

from kforge.eval.sandbox import Violation
from kforge.runtime.cubin import DEFAULT_SHARED_LIMIT, KernelModule

SCALAR_TYPES = (np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64,
                np.float16, np.float32, np.float64, np.bool_)
_SCALAR_SET = frozenset(SCALAR_TYPES)


class LaunchRefused(Exception):
    """A launch with bad arguments (a fixable launcher error)."""


def launch_dims(value: Any, what: str) -> tuple[int, ...]:
    """``grid`` or ``block`` as a tuple of 1 to 3 positive ints."""
    if type(value) is int and value >= 1:  # the common case, checked first: launches are hot
        return (value,)
    items = value if isinstance(value, (tuple, list)) else (value,)
    if not 1 <= len(items) <= 3:
        raise LaunchRefused(f"{what} must be an int or a tuple of 1 to 3 ints, got {value!r}")
    dims = []
    for item in items:
        if isinstance(item, bool) or not isinstance(item, (int, np.integer)):
            raise LaunchRefused(f"{what} must hold ints, got {value!r}")
        if int(item) < 1:
            raise LaunchRefused(f"{what} dimensions must be at least 1, got {value!r}")
        dims.append(int(item))
    return tuple(dims)


def check_params(name: str, params: Sequence[Any], device: torch.device) -> None:
    """Refuse parameters whose width the kernel could not agree on, and tensors elsewhere."""
    for i, p in enumerate(params):
        kind = type(p)
        if kind in _SCALAR_SET:
            continue
        if kind is torch.Tensor:
            if p.device != device:
                raise LaunchRefused(f"parameter {i} of {name} is a tensor on {p.device}, the "
                                    f"kernel runs on {device}: allocate outputs with "
                                    "device=x.device")
        elif isinstance(p, torch.Tensor):
            raise LaunchRefused(f"parameter {i} of {name} is a {kind.__name__}, not a plain tensor")
        elif isinstance(p, (bool, int, float)):
            raise LaunchRefused(f"parameter {i} of {name} is a bare Python {kind.__name__}: "
                                "pass a numpy scalar of the kernel's width (np.int32(n), "
                                "np.int64(n), np.float32(x))")
        else:
            raise LaunchRefused(f"parameter {i} of {name} is a {kind.__name__}: pass tensors "
                                "and numpy scalars only")


class Backend(Protocol):
    def launch(self, name: str, grid: tuple[int, ...], block: tuple[int, ...], shared_mem: int,
               params: Sequence[Any]) -> None: ...


class Kernels:
    """What a launcher calls its kernels through. Immutable from the launcher's side."""

    __slots__ = ("_backend", "_check_stream", "_count", "_device", "_violations")

    def __init__(self, backend: Backend, device: torch.device,
                 check_stream: Callable[[], str | None]) -> None:
        object.__setattr__(self, "_backend", backend)
        object.__setattr__(self, "_device", device)
        object.__setattr__(self, "_check_stream", check_stream)
        object.__setattr__(self, "_count", [0])
        object.__setattr__(self, "_violations", [])

    def __getattr__(self, name: str) -> Callable[..., None]:
        if name.startswith("__"):
            raise AttributeError(name)

        def launch(grid: Any, block: Any, *params: Any, shared_mem: Any = 0) -> None:
            self._launch(name, grid, block, params, shared_mem)

        return launch

    def __getitem__(self, name: str) -> Callable[..., None]:
        return self.__getattr__(name)

    def __setattr__(self, name: str, value: Any) -> None:
        raise self._violation(f"launcher set kernels.{name}: the kernels object is read-only")

    def _violation(self, message: str) -> Violation:
        violation = Violation(message)
        object.__getattribute__(self, "_violations").append(violation)
        return violation

    def _launch(self, name: str, grid: Any, block: Any, params: Sequence[Any],
                shared_mem: Any) -> None:
        if (problem := self._check_stream()) is not None:
            raise self._violation(f"launcher launched {name} on {problem}: work the timer does "
                                  "not wait for is not allowed")
        if shared_mem != 0 and (isinstance(shared_mem, bool) or not isinstance(
                shared_mem, (int, np.integer)) or shared_mem < 0):
            raise LaunchRefused(f"shared_mem must be a non-negative int, got {shared_mem!r}")
        grid_dims, block_dims = launch_dims(grid, "grid"), launch_dims(block, "block")
        check_params(name, params, self._device)
        self._backend.launch(name, grid_dims, block_dims, int(shared_mem), params)
        self._count[0] += 1

    # Read by the evaluator (the launcher cannot reach underscore names).
    def _launches(self) -> int:
        return self._count[0]

    def _reset(self) -> None:
        self._count[0] = 0

    def _recorded_violations(self) -> list[Violation]:
        return list(self._violations)


def _param_size(info: Any) -> int:
    size = getattr(info, "size", None)
    return int(size if size is not None else info[1])


class CudaModule:
    """A compiled cubin loaded on one GPU. Loading and launching on PyTorch's current stream are
    the integration runtime's (``KernelModule``, through cuda.core); this adds what a launch from
    a launcher under evaluation must pass: a known kernel, and parameters whose count and widths
    match the kernel's."""

    def __init__(self, cubin: bytes, device_index: int, names: Iterable[str]) -> None:
        self._module = KernelModule(cubin, device_index)
        self.names = sorted(names)
        self._sizes: dict[str, list[int] | None] = {}

    def _param_sizes(self, name: str) -> list[int] | None:
        """Byte widths of kernel NAME's parameters (None where the driver cannot list them)."""
        try:
            kernel = self._module.kernel(name)
        except KeyError:
            known = ", ".join(self.names) or "none"
            raise LaunchRefused(f"no kernel named {name!r} in the source (declare it "
                                f"extern \"C\" __global__); kernels found: {known}") from None
        if name not in self._sizes:
            try:
                self._sizes[name] = [_param_size(info) for info in kernel.arguments_info]
            except Exception:  # older drivers cannot list parameters: no size check then
                self._sizes[name] = None
        return self._sizes[name]

    def launch(self, name: str, grid: tuple[int, ...], block: tuple[int, ...], shared_mem: int,
               params: Sequence[Any]) -> None:
        sizes = self._param_sizes(name)
        if sizes is not None and len(sizes) != len(params):
            raise LaunchRefused(f"{name} takes {len(sizes)} parameters, the launcher passed "
                                f"{len(params)}")
        args = []
        for i, p in enumerate(params):
            value, width = (p.data_ptr(), 8) if isinstance(p, torch.Tensor) else (p, p.itemsize)
            if sizes is not None and sizes[i] != width:
                raise LaunchRefused(f"parameter {i} of {name} is {sizes[i]} bytes wide in the "
                                    f"kernel, the launcher passed {width} bytes "
                                    f"({type(p).__name__})")
            args.append(value)
        if shared_mem > DEFAULT_SHARED_LIMIT:
            try:
                self._module.allow_shared(name, shared_mem)
            except RuntimeError as exc:  # the GPU cannot give that much
                raise LaunchRefused(str(exc)) from None
        try:
            self._module.launch(name, grid, block, args, shared_mem)
        except Exception as exc:  # cuda.core's CUDAError: bad config, too many resources...
            raise LaunchRefused(f"launching {name} with grid {grid}, block {block}, "
                                f"shared_mem {shared_mem} failed: {exc}") from None
