"""The device side of an evaluation: where tensors live, how to wait, flush L2 and time a call.

``CudaRuntime`` runs everything on a dedicated stream of one GPU and times with CUDA events after
an L2 flush. ``CpuRuntime`` runs the same evaluation code on the CPU with a wall clock; the tests
use it, with Python stand-ins for kernels, to exercise every check without a GPU.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from typing import Any, Protocol

import torch


class Runtime(Protocol):
    device: torch.device

    def scope(self) -> contextlib.AbstractContextManager: ...

    def sync(self) -> None: ...

    def stream_problem(self) -> str | None: ...

    def flush(self) -> None: ...

    def start(self) -> Any: ...

    def stop(self, token: Any) -> Any: ...

    def elapsed_us(self, token: Any) -> float: ...

    def alive(self) -> bool: ...

    def free_bytes(self) -> int: ...


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

    def alive(self) -> bool:
        return True

    def free_bytes(self) -> int:
        return 8 << 30


# The L2 flush writes at least this much, twice the L2 size where that is larger.
MIN_FLUSH_BYTES = 64 << 20
# How long the GPU is held busy before a timed call's start event: longer than the host takes to
# enqueue the call (a Python op dispatch or a plan's launches, 10-30 us; a compiled graph's guards
# and launches more), so the window never holds a host gap.
HOLD_US = 100.0


class CudaRuntime:
    """One GPU: a private stream, an L2 flush buffer and CUDA events."""

    def __init__(self, index: int = 0, l2_bytes: int | None = None) -> None:
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
        self._hold_cycles = self._cycles_for(HOLD_US)

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

    def _cycles_for(self, us: float) -> int:
        """Spin cycles that hold this GPU for about ``us`` (measured once, at its current clock)."""
        probe = 1_000_000
        with self.scope():
            torch.cuda._sleep(probe // 10)  # wake the clocks before measuring them
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record(self.stream)
            torch.cuda._sleep(probe)
            end.record(self.stream)
            end.synchronize()
        return max(1, int(probe * us / (start.elapsed_time(end) * 1e3)))

    def start(self) -> torch.cuda.Event:
        """Hold the stream busy, then record the start event: the host enqueues the timed call
        while the GPU spins, so the call starts the moment the event fires. Without the hold a
        host slower than the GPU (a Python dispatch after a short flush) is timed as GPU time:
        eager's 65 us RMSNorm measured 76-89 us inside evaluations on an H200."""
        with torch.cuda.stream(self.stream):
            torch.cuda._sleep(self._hold_cycles)
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
