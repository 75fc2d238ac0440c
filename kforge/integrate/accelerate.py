"""What ``kforge.accelerate`` (``kforge.integrate.api``) returns: a model with static shapes,
captured as a CUDA graph with the winning kernels that make its replays faster.

    fast = kforge.accelerate(model, (x,), 3)    # session 3's kernels, chosen by measurement
    y = fast(x2)                                # x2: x's shape, dtype and device

Under CUDA graph replay Python is out of the loop, so every kernel costs only its GPU time; each
winner is still tried in the replayed model and kept only where the replays get faster beyond
noise (``kforge.integrate.winners.select``). A model that cannot be captured (tensors on the CPU, a
forward that synchronizes with the host, a graph that does not reproduce the forward) is refused
with one KforgeError naming why; so is a call with other shapes than the captured ones.
"""

from __future__ import annotations

from typing import Any

from kforge.errors import KforgeError
from kforge.integrate.graphs import StaticForward
from kforge.integrate.measure import output_difference
from kforge.integrate.winners import Selection
from kforge.runtime.guard import Patch
from kforge.runtime.table import Entry, KernelTable, Report

# Relative L2 difference between a replay and the same forward run eagerly above which the graph
# is not the forward: kernels are the same in both, so only work outside the graph differs.
FAITHFUL_REL = 1e-3


class Accelerated(StaticForward):
    """The captured model: call it as the model, with inputs of the captured shapes. ``patch``
    holds the kernels in the graph, ``selection`` how they were chosen (None: not measured)."""

    patch: Patch | None
    selection: Selection[Entry] | None

    def report(self) -> Report:
        """The kernels in the graph and how often each ran while it was captured."""
        return self.patch.report() if self.patch is not None else KernelTable().report()


def check_faithful(fast: Accelerated, scope: Any) -> None:
    """The replay must give what the same forward gives run eagerly on the same inputs."""
    replayed = fast.captured.replay()
    with scope():
        expected = fast.step()
    difference = output_difference(expected, replayed)
    if not difference.rel <= FAITHFUL_REL:  # NaN included
        raise KforgeError(f"the CUDA graph does not reproduce the forward ({difference}): the "
                          "forward does work outside the GPU stream (CPU tensors, Python state "
                          "that changes between calls) that a replay skips")
