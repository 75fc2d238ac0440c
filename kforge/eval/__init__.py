"""Evaluation: compile, verify and time candidates (GPU work runs in worker processes).

``make_gpu_evaluator`` is the engine's factory for the ``gpu`` evaluator. Importing this package
is cheap: torch and CUDA load only when an evaluator is made.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kforge.core.protocols import SearchContext
    from kforge.eval.pool import GpuEvaluator

# Keys of the session settings' "eval" section that configure the pool rather than a check.
POOL_SETTINGS = ("devices", "timeout_s", "baseline_timeout_s", "start_timeout_s")


def make_gpu_evaluator(ctx: SearchContext) -> GpuEvaluator:
    """One evaluation worker per visible GPU (or per index in ``settings["eval"]["devices"]``).

    Raises KforgeError when cuda-core is missing or no CUDA GPU is visible."""
    from kforge.errors import KforgeError
    from kforge.eval.gpuinfo import require_cuda
    from kforge.eval.pool import (
        DEFAULT_BASELINE_TIMEOUT_S,
        DEFAULT_START_TIMEOUT_S,
        DEFAULT_TIMEOUT_S,
        GpuEvaluator,
    )

    require_cuda()
    import torch

    section = dict(ctx.settings.get("eval") or {})
    count = torch.cuda.device_count()
    devices = [int(d) for d in section.get("devices") or range(count)]
    if bad := [d for d in devices if not 0 <= d < count]:
        raise KforgeError(f"GPU {bad[0]} is not visible: {count} GPU(s) found")
    return GpuEvaluator(
        ctx.samples_dir, devices,
        settings={k: v for k, v in section.items() if k not in POOL_SETTINGS},
        timeout_s=float(section.get("timeout_s", DEFAULT_TIMEOUT_S)),
        baseline_timeout_s=float(section.get("baseline_timeout_s", DEFAULT_BASELINE_TIMEOUT_S)),
        start_timeout_s=float(section.get("start_timeout_s", DEFAULT_START_TIMEOUT_S)),
        gpu=ctx.gpu)
