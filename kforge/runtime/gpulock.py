"""One GPU shared by several of kforge's processes: their checks run side by side, a timed
section runs alone.

Every process that puts work on a GPU for kforge (the evaluation workers, a confirmation's fresh
worker, the sanitizer's children) holds the GPU's lock *shared* while it does, and a timed section
holds it *exclusive*: no other process's kernel then runs beside the timed calls, so device time
stays the candidate's own, while compiles, correctness checks and sanitizer runs of other
candidates overlap each other. The lock is an advisory ``flock`` on a file named by the GPU's UUID
under kforge's cache folder, so processes of one user agree whatever ``CUDA_VISIBLE_DEVICES``
says, and the kernel frees it when its holder dies. A second file is the turnstile every taker
passes: a process waiting to time closes it behind itself, so checks that keep coming cannot
starve a timed section.

Before it lets go of the lock a holder waits for its own GPU work (``sync``): a shared holder's
queued kernels must not run into someone's timed section. Torch-free (the sanitizer's child
imports no torch).
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import functools
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path

ENV_LOCKS = "KFORGE_GPU_LOCKS"  # a folder for the lock files (tests), else the cache folder's


def device_uuid(index: int) -> str:
    """The UUID of visible GPU ``index`` as the driver reports it (hex, no dashes): asked of the
    driver itself, so that a worker and a torch-free child name one GPU alike."""
    lib = ctypes.CDLL("libcuda.so.1")
    device = ctypes.c_int()
    uuid = (ctypes.c_ubyte * 16)()
    for call, args in (("cuInit", (0,)), ("cuDeviceGet", (ctypes.byref(device), index)),
                       ("cuDeviceGetUuid_v2", (uuid, device))):
        if err := getattr(lib, call)(*args):
            raise RuntimeError(f"{call} failed with CUresult {err}")
    return bytes(uuid).hex()


def lock_folder() -> Path:
    if env := os.environ.get(ENV_LOCKS):
        return Path(env)
    from kforge.runtime.cache import cache_dir

    return cache_dir() / "locks"


def _open(path: Path) -> int:
    """A lock file of our own: created private, never through a link."""
    path.parent.mkdir(parents=True, exist_ok=True)
    return os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)


class GpuLock:
    """The lock of one GPU, for this process: ``shared()`` around GPU work, ``exclusive()``
    around a timed section (which gives a shared hold up for its length and takes it back).
    ``sync`` waits for this process's work on the GPU."""

    def __init__(self, name: str, sync: Callable[[], None] = lambda: None,
                 folder: Path | None = None) -> None:
        folder = folder or lock_folder()
        self.sync = sync
        self._gate = _open(folder / f"gpu-{name}.lock")
        self._turn = _open(folder / f"gpu-{name}.turn")
        self._mode = 0  # 0, fcntl.LOCK_SH or fcntl.LOCK_EX: what this process holds
        self._depth = 0  # shared() nests
        self.waited_s = 0.0  # this process's time waiting to take the lock, in all

    @classmethod
    def for_device(cls, index: int) -> GpuLock | None:
        """This process's lock of visible GPU ``index`` (one per GPU and process: two in one
        process would wait on each other), or None where no lock file can be made."""
        return _for_device(index)

    def _take(self, mode: int) -> None:
        start = time.perf_counter()
        fcntl.flock(self._turn, fcntl.LOCK_EX)
        try:
            fcntl.flock(self._gate, mode)
        finally:
            fcntl.flock(self._turn, fcntl.LOCK_UN)
        self._mode = mode
        self.waited_s += time.perf_counter() - start

    def _let_go(self) -> None:
        with contextlib.suppress(Exception):  # a context a fault killed runs nothing more
            self.sync()
        fcntl.flock(self._gate, fcntl.LOCK_UN)
        self._mode = 0

    @contextlib.contextmanager
    def shared(self) -> Iterator[None]:
        """Hold the GPU beside other holders of a shared hold (nests; inside ``exclusive`` it
        keeps the exclusive hold)."""
        if self._mode:
            self._depth += 1
            try:
                yield
            finally:
                self._depth -= 1
            return
        self._take(fcntl.LOCK_SH)
        self._depth = 1
        try:
            yield
        finally:
            self._depth = 0
            self._let_go()

    @contextlib.contextmanager
    def exclusive(self) -> Iterator[None]:
        """Hold the GPU alone; a shared hold of this process is given up meanwhile."""
        before = self._mode
        if before == fcntl.LOCK_EX:
            yield
            return
        if before:
            self._let_go()
        self._take(fcntl.LOCK_EX)
        try:
            yield
        finally:
            self._let_go()
            if before:
                self._take(before)

    @contextlib.contextmanager
    def idle(self) -> Iterator[None]:
        """Host work that leaves the GPU alone for a while (a compile): a shared hold of this
        process is given up meanwhile, so a timed section elsewhere need not wait for it."""
        before = self._mode
        if before != fcntl.LOCK_SH:
            yield
            return
        self._let_go()
        try:
            yield
        finally:
            self._take(before)

    def close(self) -> None:
        for fd in (self._gate, self._turn):
            with contextlib.suppress(OSError):
                os.close(fd)


@functools.cache
def _for_device(index: int) -> GpuLock | None:
    try:
        return GpuLock(device_uuid(index))
    except (OSError, RuntimeError):  # no cache folder, no driver: nobody to share with
        return None
