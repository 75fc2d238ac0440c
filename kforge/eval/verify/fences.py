"""Fences around the memory a candidate writes: each new output and scratch buffer of a call sits
between bytes of a known pattern, so a kernel that writes past either end of one (an off-by-one,
a vector store over the tail) is caught on that call, not only under compute-sanitizer.

Inputs have their own canaries (``kforge.eval.verify.inputs``); arguments an op writes in place are
inputs. A write that jumps further than a fence is left to compute-sanitizer.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kforge.core.argspec import storage_span
from kforge.eval.verify.placement import PRODUCTION, SCRATCH_GRAIN, fitted, placed
from kforge.runtime.plan import Allocation

FENCE_BYTES = 256  # each side at least: a multiple of every item size
PATTERN = 0xA5


@dataclass(frozen=True)
class Fence:
    """One fenced buffer: its whole allocation in bytes, where the buffer starts in it and the
    bytes it spans."""

    raw: torch.Tensor
    start: int
    span: int


class Fences:
    """The fenced buffers of one call, in the order they were made, each starting ``shift``
    bytes past a 512-byte boundary (``kforge.eval.verify.placement``; scratch keeps 16-byte
    alignment)."""

    def __init__(self, shift: int = PRODUCTION) -> None:
        self.shift = shift
        self.fences: list[Fence] = []

    def empty(self, shape: tuple[int, ...], stride: tuple[int, ...], *, dtype: torch.dtype,
              device: torch.device) -> torch.Tensor:
        """Like ``torch.empty_strided``, between two fences (``PlanRunner.allocate``'s maker)."""
        itemsize = torch.empty((), dtype=dtype).element_size()
        span = storage_span(shape, stride) * itemsize
        grain = SCRATCH_GRAIN if dtype == torch.uint8 else 1  # scratch is made as bytes
        raw, start = placed(span, torch.uint8, device, FENCE_BYTES, FENCE_BYTES,
                            fitted(self.shift, itemsize, grain))
        raw[:start].fill_(PATTERN)
        raw[start + span:].fill_(PATTERN)
        self.fences.append(Fence(raw, start, span))
        return torch.empty(0, dtype=dtype, device=device).set_(
            raw.untyped_storage(), start // itemsize, shape, stride)

    def copy(self) -> Fences:
        """These fences as they are now (queued copies of their bytes alone, not of the buffers
        between them), to be judged later."""
        copied = Fences(self.shift)
        copied.fences = [Fence(torch.cat([f.raw[:f.start], f.raw[f.start + f.span:]]), f.start, 0)
                         for f in self.fences]
        return copied

    def broken(self) -> list[int]:
        """Indices of the buffers whose fences were written (one device sync)."""
        if not self.fences:
            return []
        hit = torch.stack([(f.raw[:f.start] != PATTERN).any()
                           | (f.raw[f.start + f.span:] != PATTERN).any()
                           for f in self.fences])
        return [i for i, bad in enumerate(hit.tolist()) if bad]


@dataclass(slots=True)
class FencedAllocation(Allocation):
    """A call's outputs and scratch with the fences around them, and what each buffer is."""

    fences: Fences
    labels: list[str]

    def overruns(self) -> list[str]:
        """What the call wrote past: ``result 0``, ``scratch 'partial'``."""
        return [self.labels[i] for i in self.fences.broken()]
