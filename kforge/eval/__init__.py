"""Evaluation: compile, verify and time candidates (GPU work runs in worker processes), beside
``propose`` above ``capture``/``store``; compute-sanitizer and re-timing confirm a would-be best.

``make_gpu_evaluator`` is the engine's factory for the ``gpu`` evaluator. Importing this package
is cheap: torch and CUDA load only when an evaluator is made.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kforge.core.protocols import SearchContext
    from kforge.eval.pool import GpuEvaluator


def make_gpu_evaluator(ctx: SearchContext) -> GpuEvaluator:
    """One evaluation worker per visible GPU (or per index in the session's ``[eval] devices``).

    Raises KforgeError when cuda-core is missing or no CUDA GPU is visible."""
    from kforge.errors import KforgeError
    from kforge.eval.gpuinfo import require_cuda
    from kforge.eval.pool import GpuEvaluator

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
