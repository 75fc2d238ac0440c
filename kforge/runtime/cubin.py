"""Load a cubin on one GPU with cuda.core and launch its kernels on PyTorch's current stream.

The lowest GPU layer: the evaluator and integration both launch through it, and ``kforge export``
copies it into every artifact.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable, Sequence
from functools import cache
from typing import Any

import numpy as np
import torch

# Dynamic shared memory a kernel may use without opting in to more.
DEFAULT_SHARED_LIMIT = 48 * 1024


def device_arch(device: torch.device | int) -> str:
    """The NVRTC architecture of a CUDA device: ``sm_90`` on an H200, ``sm_121`` on a GB10."""
    major, minor = torch.cuda.get_device_capability(device)
    return f"sm_{major}{minor}"



class KernelModule:
    """A cubin loaded on one GPU; ``launch`` runs one of its kernels on PyTorch's current stream
    of that GPU."""

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
        self._widths: dict[str, list[int] | None] = {}

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

    def has_kernel(self, name: str) -> bool:
        try:
            self.kernel(name)
        except KeyError:
            return False
        return True

    def param_widths(self, name: str) -> list[int] | None:
        """Byte widths of kernel NAME's parameters, or None where the driver cannot list them;
        KeyError when the cubin has no such kernel."""
        if name not in self._widths:
            kernel = self.kernel(name)
            try:
                self._widths[name] = [_width(info) for info in kernel.arguments_info]
            except Exception:  # older drivers cannot list parameters
                self._widths[name] = None
        return self._widths[name]

    def launch(self, name: str, grid: tuple[int, ...], block: tuple[int, ...], shared_mem: int,
               params: Sequence[Any]) -> None:
        """Launch NAME on PyTorch's current stream: tensors go in as their data pointers, numpy
        scalars by value."""
        from cuda.core import LaunchConfig, launch

        kernel = self.kernel(name)
        if shared_mem > DEFAULT_SHARED_LIMIT:
            self.allow_shared(name, shared_mem)
        shape = (grid, block, shared_mem)
        config = self._configs.get(shape)
        if config is None:
            config = self._configs[shape] = LaunchConfig(grid=grid, block=block,
                                                         shmem_size=shared_mem)
        launch(self.stream(), config, kernel,
               *[p.data_ptr() if isinstance(p, torch.Tensor) else p for p in params])


    def prepare(self, name: str, grid: tuple[int, ...], block: tuple[int, ...],
                shared_mem: int, template: Sequence[Any]) -> PreparedLaunch | None:
        """Kernel NAME with its geometry fixed and its parameters packed once (``template``: numpy
        scalars, and None where a pointer goes), launched straight through the driver; None where
        that path is not available here (``launch`` then serves)."""
        launch = _driver_launch()
        address = self.function_address(name, shared_mem)
        if launch is None or address is None:
            return None
        return PreparedLaunch(launch, address, self.device_index, grid, block, shared_mem,
                              template)

    def function_address(self, name: str, shared_mem: int = 0) -> int | None:
        """The driver's handle of kernel NAME as an address for ``cuLaunchKernel``, allowed
        ``shared_mem`` bytes of dynamic shared memory; None where cuda.core gives a handle of
        another kind."""
        from cuda.bindings import driver

        handle = self.kernel(name).handle
        try:
            address = int(handle)  # cuLaunchKernel takes a CUkernel as well as a CUfunction
            if isinstance(handle, driver.CUkernel):
                # A CUkernel's function is per context: the one of this module's GPU, whichever
                # device the caller has current (a launch on another device's context would be
                # refused, or run the kernel on the wrong GPU).
                with torch.cuda.device(self.device_index):
                    err, function = driver.cuKernelGetFunction(handle)
                if err == driver.CUresult.CUDA_SUCCESS:
                    address = int(function)
        except (TypeError, ValueError, AttributeError):  # a handle of another kind
            return None
        if shared_mem > DEFAULT_SHARED_LIMIT:
            self.allow_shared(name, shared_mem)
        return address


class PreparedLaunch:
    """One launch whose parameters live in a buffer packed once: a call writes the pointers,
    reads PyTorch's current stream and calls ``cuLaunchKernel``."""

    def __init__(self, launch: Callable[..., int], function: int, device_index: int,
                 grid: tuple[int, ...], block: tuple[int, ...], shared_mem: int,
                 template: Sequence[Any]) -> None:
        self._launch = launch
        self._function = function
        self._device = device_index
        self._geometry = (*(tuple(grid) + (1, 1))[:3], *(tuple(block) + (1, 1))[:3], shared_mem)
        slots = [ctypes.c_uint64(0) if value is None else _CTYPES[np.dtype(type(value))](value)
                 for value in template]
        self._pointers = [slot for slot, value in zip(slots, template) if value is None]
        self._slots = slots  # kept alive: the buffer below points into them
        self._params = (ctypes.c_void_p * max(len(slots), 1))(
            *[ctypes.cast(ctypes.byref(slot), ctypes.c_void_p) for slot in slots])

    def __call__(self, pointers: Sequence[int]) -> None:
        for slot, value in zip(self._pointers, pointers):
            slot.value = value
        stream = torch._C._cuda_getCurrentRawStream(self._device)
        err = self._launch(self._function, *self._geometry, stream, self._params, None)
        if err:
            raise RuntimeError(f"cuLaunchKernel failed: {_error_name(err)}")


_CTYPES = {np.dtype(np.int32): ctypes.c_int32, np.dtype(np.uint32): ctypes.c_uint32,
           np.dtype(np.int64): ctypes.c_int64, np.dtype(np.uint64): ctypes.c_uint64,
           np.dtype(np.float32): ctypes.c_float, np.dtype(np.float64): ctypes.c_double,
           np.dtype(np.bool_): ctypes.c_bool}


@cache
def _driver() -> ctypes.CDLL | None:
    try:
        return ctypes.CDLL("libcuda.so.1")
    except OSError:  # no driver library under that name: the generic path serves
        return None


@cache
def _driver_launch() -> Callable[..., int] | None:
    lib = _driver()
    if lib is None or not hasattr(torch._C, "_cuda_getCurrentRawStream"):
        return None
    launch = lib.cuLaunchKernel
    launch.argtypes = [ctypes.c_void_p, *[ctypes.c_uint] * 7, ctypes.c_void_p,
                       ctypes.c_void_p, ctypes.c_void_p]
    launch.restype = ctypes.c_int
    return launch


def _error_name(code: int) -> str:
    lib, name = _driver(), ctypes.c_char_p()
    if lib is not None and lib.cuGetErrorName(code, ctypes.byref(name)) == 0 and name.value:
        return name.value.decode()
    return f"CUresult {code}"


def _width(info: Any) -> int:
    size = getattr(info, "size", None)
    return int(size if size is not None else info[1])


class ForeignStream:
    """A stream handle in the ``__cuda_stream__`` protocol."""

    def __init__(self, handle: int) -> None:
        self.handle = handle

    def __cuda_stream__(self) -> tuple[int, int]:
        return (0, self.handle)


def _cuda_index(device: torch.device) -> int:
    return device.index if device.index is not None else torch.cuda.current_device()
