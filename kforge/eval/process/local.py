"""Evaluate in the calling process, without a worker: for tests and benchmarks.

Same checks and timing as the worker. A kernel that faults poisons this process's CUDA context and
one that hangs hangs it: searches go through ``GpuEvaluator``, whose workers absorb both.
"""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path

from kforge.core.candidate import Baseline, Candidate, EvalOutcome
from kforge.core.gpu import GpuInfo
from kforge.core.opcard import OpCard
from kforge.eval.verify.baseline import measure_baseline
from kforge.eval.verify.evaluate import evaluate_candidate
from kforge.eval.verify.pipeline import EvalSettings
from kforge.runtime.device import CudaRuntime
from kforge.runtime.gpuinfo import detect_gpu, start_cuda
from kforge.runtime.gpulock import GpuLock
from kforge.runtime.kernel_loader import NvrtcLoader


@dataclass
class Device:
    gpu: GpuInfo
    runtime: CudaRuntime
    loader: NvrtcLoader


_devices: dict[int, Device] = {}


def device_context(index: int) -> Device:
    """The runtime and loader of GPU ``index`` in this process (made once)."""
    if index not in _devices:
        lock = GpuLock.for_device(index)
        # A context's start is GPU work, not to run beside a timed section elsewhere, but mostly
        # host work: held shared (others' checks go on), the copy rate's few copies alone.
        with lock.shared() if lock is not None else nullcontext():
            start_cuda(index)
        with lock.exclusive() if lock is not None else nullcontext():
            gpu = detect_gpu(index)
        runtime = CudaRuntime(index, l2_bytes=int(gpu.l2_mb * (1 << 20)), lock=lock)
        _devices[index] = Device(gpu, runtime, NvrtcLoader(index, gpu.arch))
    return _devices[index]


def evaluate_local(card: OpCard, candidate: Candidate, *, samples_dir: Path | None = None,
                   device: int = 0, settings: EvalSettings | None = None) -> EvalOutcome:
    ctx = device_context(device)
    return evaluate_candidate(card, candidate, runtime=ctx.runtime, loader=ctx.loader,
                              gpu=ctx.gpu, samples_dir=samples_dir, settings=settings)


def baseline_local(card: OpCard, *, samples_dir: Path | None = None, device: int = 0,
                   settings: EvalSettings | None = None) -> Baseline:
    ctx = device_context(device)
    return measure_baseline(card, runtime=ctx.runtime, gpu=ctx.gpu, samples_dir=samples_dir,
                            settings=settings)
