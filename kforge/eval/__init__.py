"""Evaluation: compile, verify and time candidates, beside ``propose`` above ``capture``/``store``,
in two rooms: ``verify``, the pipeline that judges one candidate inside a worker, and ``process``,
where that runs (workers per GPU, a Ray cluster, the calling process) and how a would-be best is
confirmed (compute-sanitizer, a re-timing). What measures the device (its runtime, the timing
protocol, the GPU's lock and facts) lies below, in ``kforge.runtime``.

``make_gpu_evaluator`` is the engine's factory for the ``gpu`` evaluator. Importing this package
is cheap: torch and CUDA load only when an evaluator is made.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kforge.core.protocols import SearchContext
    from kforge.eval.process.pool import GpuEvaluator


def make_gpu_evaluator(ctx: SearchContext) -> GpuEvaluator:
    """One evaluation worker per visible GPU (or per index in the session's ``[eval] devices``).

    Raises KforgeError when cuda-core is missing or no CUDA GPU is visible."""
    from kforge.errors import KforgeError
    from kforge.eval.process.pool import GpuEvaluator
    from kforge.runtime.gpuinfo import require_cuda

    require_cuda()
    import torch

    settings = ctx.settings.eval
    count = torch.cuda.device_count()
    devices = list(settings.devices or range(count))
    if bad := [d for d in devices if not 0 <= d < count]:
        raise KforgeError(f"GPU {bad[0]} is not visible: {count} GPU(s) found")
    return GpuEvaluator(
        ctx.samples_dir, devices, settings=settings.to_dict(), timeout_s=settings.timeout_s,
        baseline_timeout_s=settings.baseline_timeout_s, start_timeout_s=settings.start_timeout_s,
        gpu=ctx.gpu)
