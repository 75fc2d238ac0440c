"""Load a cubin on one GPU with cuda.core and launch its kernels on PyTorch's current stream.

The lowest GPU layer: the evaluator and integration both launch through it, and ``kforge export``
copies it into every artifact.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

# Dynamic shared memory a kernel may use without opting in to more.
DEFAULT_SHARED_LIMIT = 48 * 1024


def device_arch(device: torch.device | int) -> str:
    """The NVRTC architecture of a CUDA device: ``sm_90`` on an H200, ``sm_121`` on a GB10."""
    major, minor = torch.cuda.get_device_capability(device)
    return f"sm_{major}{minor}"



class KernelModule:
    """A cubin loaded on one GPU. ``module.NAME(grid, block, *params, shared_mem=0)`` (or
    ``module["NAME"](...)``) launches kernel NAME on PyTorch's current stream of that GPU:
    tensors go in as their data pointers, numpy scalars by value."""

    def __init__(self, cubin: bytes, device: torch.device | int) -> None:
        from cuda.core import Device, ObjectCode

        self.device_index = device if isinstance(device, int) else _cuda_index(device)
        with torch.cuda.device(self.device_index):  # the caller's current device is restored
            Device(self.device_index).set_current()
            self._object = ObjectCode.from_cubin(cubin)
        self._kernels: dict[str, Any] = {}
        self._streams: dict[int, Any] = {}
        self._configs: dict[tuple, Any] = {}
        self._shared_allowed: dict[str, int] = {}
        self._launchers: dict[str, Callable[..., None]] = {}

    def kernel(self, name: str) -> Any:
        """The cuda.core Kernel NAME; KeyError when the cubin has none."""
        found = self._kernels.get(name)
        if found is None:
            try:
                found = self._object.get_kernel(name)
            except Exception:  # cuda.core raises its CUDAError for an unknown symbol
                raise KeyError(name) from None
            self._kernels[name] = found
        return found

    def stream(self) -> Any:
        """PyTorch's current stream of this GPU, as cuda.core sees it (the capturing stream
        while a CUDA graph is captured)."""
        handle = torch.cuda.current_stream(self.device_index).cuda_stream
        stream = self._streams.get(handle)
        if stream is None:
            from cuda.core import Stream

            try:
                stream = Stream.from_handle(handle)
            except AttributeError:  # a cuda.core without from_handle takes the stream protocol
                stream = ForeignStream(handle)
            self._streams[handle] = stream
        return stream

    def allow_shared(self, name: str, nbytes: int) -> None:
        """Opt kernel NAME into ``nbytes`` of dynamic shared memory (beyond 48 KiB);
        RuntimeError when the GPU cannot give that much."""
        if self._shared_allowed.get(name, DEFAULT_SHARED_LIMIT) >= nbytes:
            return
        from cuda.bindings import driver

        handle = self.kernel(name).handle
        attribute = driver.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
        try:
            (err,) = driver.cuKernelSetAttribute(attribute, nbytes, handle, self.device_index)
        except TypeError:  # a CUfunction handle rather than a CUkernel
            (err,) = driver.cuFuncSetAttribute(handle, attribute, nbytes)
        if err != driver.CUresult.CUDA_SUCCESS:
            raise RuntimeError(f"{name} cannot use {nbytes} bytes of dynamic shared memory on "
                               f"this GPU ({err.name})")
        self._shared_allowed[name] = nbytes

    def launch(self, name: str, grid: int | tuple[int, ...], block: int | tuple[int, ...],
               values: Sequence[Any], shared_mem: int = 0) -> None:
        """Launch NAME with parameter values already converted (pointers as ints)."""
        from cuda.core import LaunchConfig, launch

        kernel = self.kernel(name)
        if shared_mem > DEFAULT_SHARED_LIMIT:
            self.allow_shared(name, shared_mem)
        shape = (grid, block, shared_mem)
        config = self._configs.get(shape)
        if config is None:
            config = self._configs[shape] = LaunchConfig(grid=grid, block=block,
                                                         shmem_size=shared_mem)
        launch(self.stream(), config, kernel, *values)

    def __getattr__(self, name: str) -> Callable[..., None]:
        if name.startswith("_"):
            raise AttributeError(name)
        return self[name]

    def __getitem__(self, name: str) -> Callable[..., None]:
        launcher = self._launchers.get(name)
        if launcher is None:
            def launcher(grid: Any, block: Any, *params: Any, shared_mem: int = 0) -> None:
                values = [p.data_ptr() if isinstance(p, torch.Tensor) else p for p in params]
                self.launch(name, grid, block, values, shared_mem)

            self._launchers[name] = launcher
        return launcher


class ForeignStream:
    """A stream handle in the ``__cuda_stream__`` protocol."""

    def __init__(self, handle: int) -> None:
        self.handle = handle

    def __cuda_stream__(self) -> tuple[int, int]:
        return (0, self.handle)


def _cuda_index(device: torch.device) -> int:
    return device.index if device.index is not None else torch.cuda.current_device()
