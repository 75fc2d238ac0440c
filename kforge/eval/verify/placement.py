"""Where the evaluator puts the memory a candidate sees, relative to 512-byte boundaries.

In a user's model a tensor's storage comes from PyTorch's caching allocator, whose blocks start on
512-byte boundaries, so a pointer sits ``storage offset * item size`` bytes past one (the card's
own offset): that is the production placement. A kernel that tests its own pointers, or a plan
whose ``align`` branch picks another kernel, could run one path where the evaluator puts its
buffers and another in production, so every storage the evaluator makes (inputs, new outputs,
scratch) is put a *shift* past a 512-byte boundary, and the shift varies: the production shift
0 first, then others the plan allows.

A plan with no ``align`` fallback may rely on 16-byte alignment (vector loads, TMA), so it gets
shifts that keep it; a plan whose launches declare ``align`` with an ``unaligned_kernel`` says it
handles any pointer, so it also gets shifts below its ``align`` (down to the element size), where
the fallback runs.
"""

from __future__ import annotations

import torch

from kforge.core.launch_plan import ResolvedPlan

BOUNDARY = 512
PRODUCTION = 0
# Byte shifts in the order input sets and calls take them: production's, the 256 bytes every
# buffer sat at before shifts varied, then others.
ALIGNED_SHIFTS = (0, 256, 16, 0, 128, 48, 0, 384, 32, 208)
# Shifts below 16 bytes, mixed in where the plan falls back on misaligned pointers.
FALLBACK_SHIFTS = (0, 256, 4, 0, 130, 16, 0, 2, 384, 8)
# Scratch is promised 16-byte alignment whatever the plan (docs/launch-plan.md).
SCRATCH_GRAIN = 16


def shifts_for(plan: ResolvedPlan) -> tuple[int, ...]:
    """The byte shifts the evaluator cycles through for ``plan``."""
    fallback = any(launch.align and launch.unaligned_kernel for launch in plan.launches)
    return FALLBACK_SHIFTS if fallback else ALIGNED_SHIFTS


def fitted(shift: int, itemsize: int, grain: int = 1) -> int:
    """``shift`` rounded down to a multiple of the item size (and of ``grain``)."""
    step = max(itemsize, grain)
    return (shift % BOUNDARY) // step * step


def placed(count: int, dtype: torch.dtype, device: torch.device, lead: int, trail: int,
           shift: int) -> tuple[torch.Tensor, int]:
    """A 1-D tensor of ``dtype`` holding at least ``lead`` elements, ``count`` more starting
    ``shift`` bytes (a multiple of the item size) past a 512-byte boundary, and ``trail`` after
    them; and the index where the ``count`` elements start."""
    itemsize = torch.empty((), dtype=dtype).element_size()
    slack = BOUNDARY // itemsize
    raw = torch.empty(lead + slack + count + trail, dtype=dtype, device=device)
    first = raw.data_ptr() + lead * itemsize
    start = lead + ((shift - first) % BOUNDARY) // itemsize
    return raw, start


class Shifts:
    """A cycle through a plan's shifts: each ``next()`` is the next one."""

    def __init__(self, shifts: tuple[int, ...] = ALIGNED_SHIFTS) -> None:
        self.shifts = shifts
        self.taken = 0

    def next(self) -> int:
        shift = self.shifts[self.taken % len(self.shifts)]
        self.taken += 1
        return shift
