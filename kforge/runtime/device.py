"""The device side of an evaluation: where tensors live, how to wait, flush L2 and time a call.

``CudaRuntime`` runs everything on a dedicated stream of one GPU and times with CUDA events after
an L2 flush. To time the GPU and not the host, the timing loop puts a *hold* on the stream (a tiny
NVRTC kernel polling a flag in mapped host memory), queues its timed calls behind it and then
releases it: every window between two events then holds device time only, however slow the host
is to issue a call (nvbench's blocking kernel, TritonBench's ``gpu_events``). The hold gives up by
itself after a timeout (``%globaltimer``), so a host that cannot queue (a call that synchronizes,
a full launch queue) never hangs the GPU; the loop then learns it from ``release``.

``CpuRuntime`` runs the same evaluation code on the CPU with a wall clock; the tests use it, with
Python stand-ins for kernels, to exercise every check without a GPU.
"""

from __future__ import annotations

import contextlib
import ctypes
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, Protocol

import torch

if TYPE_CHECKING:
    from kforge.runtime.gpulock import GpuLock


class Runtime(Protocol):
    device: torch.device

    def scope(self) -> contextlib.AbstractContextManager: ...

    def sync(self) -> None: ...

    def stream_problem(self) -> str | None: ...

    def flush(self) -> None: ...

    def start(self) -> Any: ...

    def stop(self, token: Any) -> Any: ...

    def elapsed_us(self, token: Any) -> float: ...

    def hold(self, timeout_s: float) -> None: ...

    def release(self) -> bool: ...

    def alive(self) -> bool: ...

    def free_bytes(self) -> int: ...

    def shared(self) -> contextlib.AbstractContextManager: ...

    def exclusive(self) -> contextlib.AbstractContextManager: ...

    def idle(self) -> contextlib.AbstractContextManager: ...

    def lock_waited_s(self) -> float: ...


class CpuRuntime:
    """Runs evaluations on the CPU (tests); times with ``perf_counter``."""

    device = torch.device("cpu")

    def scope(self) -> contextlib.AbstractContextManager:
        return contextlib.nullcontext()

    def sync(self) -> None:
        pass

    def stream_problem(self) -> str | None:
        return None

    def flush(self) -> None:
        pass

    def start(self) -> float:
        return time.perf_counter()

    def stop(self, token: float) -> tuple[float, float]:
        return token, time.perf_counter()

    def elapsed_us(self, token: tuple[float, float]) -> float:
        return (token[1] - token[0]) * 1e6

    def hold(self, timeout_s: float) -> None:
        """Nothing to hold: on the CPU the host is the device."""

    def release(self) -> bool:
        return True

    def alive(self) -> bool:
        return True

    def free_bytes(self) -> int:
        return 8 << 30

    def shared(self) -> contextlib.AbstractContextManager:
        """Nothing to share: the CPU runs one evaluation at a time here."""
        return contextlib.nullcontext()

    def exclusive(self) -> contextlib.AbstractContextManager:
        return contextlib.nullcontext()

    def idle(self) -> contextlib.AbstractContextManager:
        return contextlib.nullcontext()

    def lock_waited_s(self) -> float:
        return 0.0


# The L2 flush writes at least this much, twice the L2 size where that is larger.
MIN_FLUSH_BYTES = 64 << 20
# The hold: polls its flag (mapped host memory) every 2 us until the host sets it, or
# gives up after max_ns of the GPU's global timer and says so in timed_out.
HOLD_SOURCE = r"""
extern "C" __global__ void kforge_hold(volatile int* flag, volatile int* timed_out,
                                       unsigned long long max_ns) {
    unsigned long long start, now;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
    while (*flag == 0) {
        __nanosleep(2000);
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
        if (now - start > max_ns) {
            *timed_out = 1;
            __threadfence_system();
            return;
        }
    }
}
"""
HOLD_KERNEL = "kforge_hold"


class MappedFlags:
    """Two int32 flags in page-locked host memory mapped into the GPU's address space: the
    host writes ``flag`` and reads ``timed_out``, the hold kernel the other way round."""

    def __init__(self) -> None:
        from cuda.bindings import driver

        flags = driver.CU_MEMHOSTALLOC_DEVICEMAP | driver.CU_MEMHOSTALLOC_PORTABLE
        err, host = driver.cuMemHostAlloc(8, flags)
        _check(err, "cuMemHostAlloc")
        err, dev = driver.cuMemHostGetDevicePointer(host, 0)
        _check(err, "cuMemHostGetDevicePointer")
        self.host = int(host)
        self.device = int(dev)
        self.values = (ctypes.c_int32 * 2).from_address(self.host)
        self.values[0] = self.values[1] = 0

    def pointers(self) -> tuple[int, int]:
        return self.device, self.device + 4


def _check(err: Any, what: str) -> None:
    from cuda.bindings import driver

    if err != driver.CUresult.CUDA_SUCCESS:
        raise RuntimeError(f"{what} failed: {getattr(err, 'name', err)}")


class CudaRuntime:
    """One GPU: a private stream, an L2 flush buffer and CUDA events. ``lock``: the GPU's lock
    (``kforge.runtime.gpulock``) where other processes work on it beside this one; its shared hold
    is taken around GPU work (``shared``), its exclusive one around timed sections."""

    def __init__(self, index: int = 0, l2_bytes: int | None = None,
                 lock: GpuLock | None = None) -> None:
        torch.cuda.set_device(index)
        self.index = index
        self.device = torch.device("cuda", index)
        self.stream = torch.cuda.Stream(self.device)
        if l2_bytes is None:
            l2_bytes = getattr(torch.cuda.get_device_properties(index), "L2_cache_size", 0)
        self.l2_bytes = int(l2_bytes)
        flush_bytes = max(2 * self.l2_bytes, MIN_FLUSH_BYTES)
        self._flush = torch.empty(flush_bytes // 4, dtype=torch.int32, device=self.device)
        self._events: list[torch.cuda.Event] = []
        self._hold: Any = None  # (KernelModule, MappedFlags), made on the first hold
        self.lock = lock
        if lock is not None:
            lock.sync = lambda: torch.cuda.synchronize(self.device)

    def shared(self) -> contextlib.AbstractContextManager:
        """GPU work beside other processes' (the GPU's lock held shared, where there is one)."""
        return self.lock.shared() if self.lock is not None else contextlib.nullcontext()

    def exclusive(self) -> contextlib.AbstractContextManager:
        """A timed section: no other process's work on the GPU meanwhile."""
        return self.lock.exclusive() if self.lock is not None else contextlib.nullcontext()

    def idle(self) -> contextlib.AbstractContextManager:
        """Host work (a compile) inside GPU work: a shared hold is given up meanwhile."""
        return self.lock.idle() if self.lock is not None else contextlib.nullcontext()

    def lock_waited_s(self) -> float:
        """This process's time waiting for the GPU's lock so far, in all."""
        return self.lock.waited_s if self.lock is not None else 0.0

    @contextlib.contextmanager
    def scope(self) -> Iterator[None]:
        with torch.cuda.device(self.index), torch.cuda.stream(self.stream):
            yield

    def sync(self) -> None:
        self.stream.synchronize()

    def stream_problem(self) -> str | None:
        current = torch.cuda.current_stream(self.device)
        if current.cuda_stream != self.stream.cuda_stream:
            return f"stream {current.cuda_stream:#x}, not the evaluation stream"
        return None

    def flush(self) -> None:
        self._flush.zero_()

    def _event(self) -> torch.cuda.Event:
        return self._events.pop() if self._events else torch.cuda.Event(enable_timing=True)

    def hold(self, timeout_s: float) -> None:
        """Hold the stream until ``release``: a one-thread kernel that polls a host flag, so
        every call queued behind it starts back to back with the one before, not when the host
        gets to it. It gives up after ``timeout_s`` by itself."""
        import numpy as np

        module, flags = self._hold_kernel()
        flags.values[0] = flags.values[1] = 0
        flag, timed_out = flags.pointers()
        with torch.cuda.stream(self.stream):
            module.launch(HOLD_KERNEL, (1,), (1,), 0,
                          [flag, timed_out, np.uint64(int(timeout_s * 1e9))])

    def release(self) -> bool:
        """Let the held stream go and wait for it; False when the hold had already given up
        (its timeout passed before the host released it): the windows queued behind it may
        then hold host time."""
        _module, flags = self._hold_kernel()
        flags.values[0] = 1
        self.sync()
        return flags.values[1] == 0

    def _hold_kernel(self) -> tuple[Any, MappedFlags]:
        if self._hold is None:
            from kforge.runtime.cache import cache_dir
            from kforge.runtime.cubin import KernelModule, device_arch
            from kforge.runtime.nvrtc import Compiler

            compiled = Compiler(cache_dir() / "nvrtc").compile(HOLD_SOURCE, device_arch(self.index))
            if not compiled.ok:
                raise RuntimeError(f"the timing hold does not compile: {compiled.log}")
            with torch.cuda.device(self.index):
                self._hold = (KernelModule(compiled.cubin, self.index), MappedFlags())
        return self._hold

    def start(self) -> torch.cuda.Event:
        event = self._event()
        event.record(self.stream)
        return event

    def stop(self, token: torch.cuda.Event) -> tuple[torch.cuda.Event, torch.cuda.Event]:
        end = self._event()
        end.record(self.stream)
        return token, end

    def elapsed_us(self, token: tuple[torch.cuda.Event, torch.cuda.Event]) -> float:
        start, end = token
        value = start.elapsed_time(end) * 1e3
        self._events.extend(token)
        return value

    def alive(self) -> bool:
        """False once a kernel fault has poisoned the CUDA context."""
        try:
            torch.cuda.synchronize(self.device)
            probe = torch.ones(1, device=self.device)
            return float((probe + 1).item()) == 2.0
        except Exception:  # any CUDA error here means the context is gone
            return False

    def free_bytes(self) -> int:
        free, _total = torch.cuda.mem_get_info(self.device)
        return int(free)
