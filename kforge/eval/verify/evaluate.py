"""One candidate's verdict, whatever its card: one exact variant (``pipeline``), or a range card
judged at several points of its range (``ranges``). The entry point the workers call."""

from __future__ import annotations

from pathlib import Path

from kforge.core.candidate import Candidate, EvalOutcome
from kforge.core.gpu import GpuInfo
from kforge.core.opcard import OpCard
from kforge.core.settings import EvalSettings
from kforge.eval.verify.pipeline import KernelLoader, evaluate_variant
from kforge.eval.verify.ranges import evaluate_range
from kforge.runtime.device import Runtime


def evaluate_candidate(card: OpCard, candidate: Candidate, *, runtime: Runtime,
                       loader: KernelLoader, gpu: GpuInfo, samples_dir: Path | None = None,
                       settings: EvalSettings | None = None) -> EvalOutcome:
    """The full verdict on ``candidate`` for ``card`` (a range card: at several points of its
    range). Never raises for a bad candidate."""
    judge = evaluate_range if card.ranges is not None else evaluate_variant
    return judge(card, candidate, runtime=runtime, loader=loader, gpu=gpu,
                 samples_dir=samples_dir, settings=settings)
