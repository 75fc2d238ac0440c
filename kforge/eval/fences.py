"""Fences around the memory a candidate writes: each new output and scratch buffer of a call sits
between bytes of a known pattern, so a kernel that writes past either end of one (an off-by-one,
a vector store over the tail) is caught on that call, not only under compute-sanitizer.

Inputs have their own canaries (``kforge.eval.inputs``); arguments an op writes in place are
inputs. A write that jumps further than a fence is left to compute-sanitizer.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kforge.core.argspec import storage_span
from kforge.runtime.plan import Allocation

FENCE_BYTES = 256  # each side: a multiple of every item size, keeping 256-byte alignment
PATTERN = 0xA5


@dataclass(frozen=True)
class Fence:
    """One fenced buffer: its whole allocation in bytes, and the bytes the buffer spans."""

    raw: torch.Tensor
    span: int


class Fences:
    """The fenced buffers of one call, in the order they were made."""

    def __init__(self) -> None:
        self.fences: list[Fence] = []

    def empty(self, shape: tuple[int, ...], stride: tuple[int, ...], *, dtype: torch.dtype,
              device: torch.device) -> torch.Tensor:
        """Like ``torch.empty_strided``, between two fences (``PlanRunner.allocate``'s maker)."""
        itemsize = torch.empty((), dtype=dtype).element_size()
        span = storage_span(shape, stride) * itemsize
        raw = torch.empty(2 * FENCE_BYTES + span, dtype=torch.uint8, device=device)
        raw[:FENCE_BYTES].fill_(PATTERN)
        raw[FENCE_BYTES + span:].fill_(PATTERN)
        self.fences.append(Fence(raw, span))
        return torch.empty(0, dtype=dtype, device=device).set_(
            raw.untyped_storage(), FENCE_BYTES // itemsize, shape, stride)

    def copy(self) -> Fences:
        """These fences as they are now (queued copies), to be judged later."""
        copied = Fences()
        copied.fences = [Fence(f.raw.clone(), f.span) for f in self.fences]
        return copied

    def broken(self) -> list[int]:
        """Indices of the buffers whose fences were written (one device sync)."""
        if not self.fences:
            return []
        hit = torch.stack([(f.raw[:FENCE_BYTES] != PATTERN).any()
                           | (f.raw[FENCE_BYTES + f.span:] != PATTERN).any()
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
