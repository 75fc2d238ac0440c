"""The process compute-sanitizer watches: a candidate's launches, and nothing else, straight
through the CUDA driver.

It imports neither torch nor anything of kforge that does: Python, ``ctypes`` and the driver start
in a fraction of a second under a tool, where a torch child spent about 9 of its 13 seconds on
Python, ``import torch`` and a CUDA context before its first call. Everything it needs comes
resolved in its job (``Job``), written by the parent (``kforge.eval.process.sanitize``): the cubin,
the input values as bytes, each buffer's size, and each launch with its parameters already mapped to
buffers or typed scalars, so no kernel runs in this process but the candidate's own.

Every buffer is an allocation of its own (``cuMemAlloc``) that the buffer *ends*: the first byte
past it is the sanitizer's padding, where memcheck sees a read or write past its end. Outputs and
scratch are made afresh for every call, poisoned (``0xFF`` bytes) or zeroed as the plan says, as
the evaluator makes them. The GPU's lock (``kforge.runtime.gpulock``) is held shared while this
process works on the GPU (the inputs' copies, then call by call), so a timed section elsewhere
never runs beside it.

Run as ``python -P -m kforge.eval.process.sanitize_child JOB.json``; with ``phases`` in the job it
prints, last, ``PHASES {json}``: when it began and each step's seconds.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import mmap
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

# The line of step times, and the padding grain: every allocation is a whole number of these.
PHASES = "KFORGE-SANITIZE-PHASES"
ALLOCATION_GRAIN = 512
POISON = 0xFF  # NaN in every float width, -1 in every integer one
DEFAULT_SHARED_LIMIT = 48 * 1024
_CTYPES = {"i32": ctypes.c_int32, "u32": ctypes.c_uint32, "i64": ctypes.c_int64,
           "u64": ctypes.c_uint64, "f32": ctypes.c_float, "f64": ctypes.c_double,
           "bool": ctypes.c_bool}
_MAX_DYNAMIC_SHARED = 8  # CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES


# ----- the job: one typed record, written by the parent, read here -----


@dataclass(frozen=True)
class Memory:
    """One buffer: ``nbytes`` long, at the end of an allocation of its own. ``fill``: "data"
    (``data``: offset and length of its values in the job's data file), "zero" or "poison"."""

    nbytes: int
    fill: str = "poison"
    data: tuple[int, int] | None = None


@dataclass(frozen=True)
class Param:
    """One kernel parameter: ``kind`` "memory" (the address of buffer ``index``: the job's
    inputs, then its per-call buffers) or a scalar's C type ("i32", "f32"...) with ``value``."""

    kind: str
    index: int = 0
    value: bool | int | float = 0


@dataclass(frozen=True)
class ChildLaunch:
    """One launch of the plan; ``unaligned_kernel`` runs instead where a buffer parameter is not
    a multiple of ``align`` bytes."""

    kernel: str
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    shared_mem: int
    params: tuple[Param, ...]
    align: int | None = None
    unaligned_kernel: str | None = None


@dataclass(frozen=True)
class Job:
    """What the child runs: the candidate's cubin on GPU ``device``, the ``inputs`` made once,
    the ``per_call`` buffers (outputs, scratch) made afresh for each of ``calls`` calls, and the
    plan's ``launches`` on them."""

    device: int
    cubin: str  # path of the compiled candidate
    data: str  # path of the input values
    inputs: tuple[Memory, ...]
    per_call: tuple[Memory, ...]
    launches: tuple[ChildLaunch, ...]
    calls: int
    phases: bool = False
    extra: dict = field(default_factory=dict)  # what the parent notes for a reader (the card)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> Job:
        def launch(d: dict) -> ChildLaunch:
            return ChildLaunch(**{**d, "grid": tuple(d["grid"]), "block": tuple(d["block"]),
                             "params": tuple(Param(**p) for p in d["params"])})

        def memory(d: dict) -> Memory:
            return Memory(d["nbytes"], d["fill"], tuple(d["data"]) if d["data"] else None)

        return cls(**{**data, "inputs": tuple(memory(m) for m in data["inputs"]),
                      "per_call": tuple(memory(m) for m in data["per_call"]),
                      "launches": tuple(launch(x) for x in data["launches"])})


# ----- the driver, through ctypes -----


class DriverError(RuntimeError):
    pass


class Driver:
    """The few CUDA driver calls the child makes, each checked."""

    def __init__(self) -> None:
        self.lib = ctypes.CDLL("libcuda.so.1")
        self.lib.cuLaunchKernel.argtypes = [ctypes.c_void_p, *[ctypes.c_uint] * 7,
                                            ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]

    def call(self, name: str, *args: Any) -> None:
        err = getattr(self.lib, name)(*args)
        if err:
            text = ctypes.c_char_p()
            self.lib.cuGetErrorName(err, ctypes.byref(text))
            raise DriverError(f"{name} failed: {(text.value or b'?').decode()} ({err})")

    def context(self, index: int) -> None:
        """Make GPU ``index``'s primary context current."""
        self.call("cuInit", 0)
        device = ctypes.c_int()
        self.call("cuDeviceGet", ctypes.byref(device), index)
        context = ctypes.c_void_p()
        self.call("cuDevicePrimaryCtxRetain", ctypes.byref(context), device)
        self.call("cuCtxSetCurrent", context)

    def sync(self) -> None:
        self.call("cuCtxSynchronize")

    def load(self, cubin: bytes, names: set[str]) -> dict[str, ctypes.c_void_p]:
        module = ctypes.c_void_p()
        self.call("cuModuleLoadData", ctypes.byref(module), ctypes.c_char_p(cubin))
        functions = {}
        for name in sorted(names):
            function = ctypes.c_void_p()
            self.call("cuModuleGetFunction", ctypes.byref(function), module, name.encode())
            functions[name] = function
        return functions

    def allocate(self, nbytes: int) -> tuple[int, int]:
        """An allocation of ``nbytes`` rounded up to the grain: its base, and the address where
        ``nbytes`` end with it."""
        size = max(-(-nbytes // ALLOCATION_GRAIN) * ALLOCATION_GRAIN, ALLOCATION_GRAIN)
        base = ctypes.c_uint64()
        self.call("cuMemAlloc_v2", ctypes.byref(base), ctypes.c_size_t(size))
        return base.value, base.value + size - nbytes

    def free(self, base: int) -> None:
        self.call("cuMemFree_v2", ctypes.c_uint64(base))

    def fill(self, address: int, value: int, nbytes: int) -> None:
        if nbytes:
            self.call("cuMemsetD8_v2", ctypes.c_uint64(address), ctypes.c_ubyte(value),
                      ctypes.c_size_t(nbytes))

    def copy_in(self, address: int, host: int, nbytes: int) -> None:
        if nbytes:
            self.call("cuMemcpyHtoD_v2", ctypes.c_uint64(address), ctypes.c_void_p(host),
                      ctypes.c_size_t(nbytes))

    def allow_shared(self, function: ctypes.c_void_p, nbytes: int) -> None:
        self.call("cuFuncSetAttribute", function, _MAX_DYNAMIC_SHARED, nbytes)

    def launch(self, function: ctypes.c_void_p, launch: ChildLaunch, params: ctypes.Array) -> None:
        self.call("cuLaunchKernel", function, *launch.grid, *launch.block, launch.shared_mem,
                  None, params, None)


# ----- the run -----


def made(driver: Driver, memory: Memory, data: Any) -> tuple[int, int]:
    """One buffer, allocated and filled: (its allocation's base, its address)."""
    base, address = driver.allocate(memory.nbytes)
    if memory.fill == "data" and memory.data is not None:
        offset, length = memory.data
        driver.copy_in(address, data + offset, min(length, memory.nbytes))
    else:
        driver.fill(address, 0 if memory.fill == "zero" else POISON, memory.nbytes)
    return base, address


def packed(launch: ChildLaunch, addresses: list[int]) -> tuple[ctypes.Array, list]:
    """The launch's parameter buffer (``void**``) and the slots it points into."""
    slots = [ctypes.c_uint64(addresses[p.index]) if p.kind == "memory"
             else _CTYPES[p.kind](p.value) for p in launch.params]
    pointers = (ctypes.c_void_p * max(len(slots), 1))(
        *[ctypes.cast(ctypes.byref(slot), ctypes.c_void_p) for slot in slots])
    return pointers, slots


def kernel_for(launch: ChildLaunch, addresses: list[int]) -> str:
    """The launch's kernel, or its unaligned twin where a buffer parameter is misaligned."""
    if launch.align and launch.unaligned_kernel and any(
            addresses[p.index] % launch.align for p in launch.params if p.kind == "memory"):
        return launch.unaligned_kernel
    return launch.kernel


def run(job: Job, phases: dict[str, float]) -> None:
    clock = [time.perf_counter()]

    def step(name: str) -> None:
        now = time.perf_counter()
        phases[name] = round(now - clock[0], 3)
        clock[0] = now

    from kforge.runtime.gpulock import GpuLock, device_uuid

    driver = Driver()
    driver.context(job.device)
    try:
        lock: Any = GpuLock(device_uuid(job.device), driver.sync)
    except OSError:  # no lock folder: nobody to take turns with
        lock = None
    step("device")
    held = lock.shared if lock is not None else contextlib.nullcontext
    host, _keep = _mapped(Path(job.data))
    # The module's load is the tool's host work (it instruments the code before the driver takes
    # it), so it holds nothing: a timed section elsewhere waits only for the copies and calls.
    kernels = {k for launch in job.launches for k in (launch.kernel, launch.unaligned_kernel) if k}
    functions = driver.load(Path(job.cubin).read_bytes(), kernels)
    for launch in job.launches:
        if launch.shared_mem > DEFAULT_SHARED_LIMIT:
            for k in (launch.kernel, launch.unaligned_kernel):
                if k:
                    driver.allow_shared(functions[k], launch.shared_mem)
    step("module_load")
    with held():
        inputs = [made(driver, m, host) for m in job.inputs]
        driver.sync()
    step("inputs")
    for _ in range(job.calls):
        with held():
            fresh = [made(driver, m, host) for m in job.per_call]
            addresses = [a for _, a in inputs] + [a for _, a in fresh]
            for launch in job.launches:
                pointers, _slots = packed(launch, addresses)
                driver.launch(functions[kernel_for(launch, addresses)], launch, pointers)
            driver.sync()
            for base, _ in fresh:
                driver.free(base)
    step("calls")


def _mapped(path: Path) -> tuple[int, Any]:
    """The data file mapped (copy-on-write, so ctypes may take its address; nothing writes it):
    its first byte's address, and what must stay alive meanwhile."""
    size = path.stat().st_size
    if not size:
        return 0, None
    with open(path, "rb") as f:
        mapped = mmap.mmap(f.fileno(), size, access=mmap.ACCESS_COPY)
    first = ctypes.c_char.from_buffer(mapped)
    return ctypes.addressof(first), (mapped, first)


def main(argv: list[str]) -> int:
    phases: dict[str, float] = {"entered_at": time.time()}
    job = Job.from_dict(json.loads(Path(argv[0]).read_text()))
    try:
        run(job, phases)
    except DriverError as exc:  # a fault in a kernel, or a launch the driver refused
        print(f"kforge sanitizer child: {exc}", file=sys.stderr, flush=True)
        return 1
    if job.phases:
        print(PHASES, json.dumps(phases), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
