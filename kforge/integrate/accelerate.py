"""``kforge.accelerate``: a model with static shapes, captured as a CUDA graph with the winning
kernels that make its replays faster.

    fast = kforge.accelerate(model, (x,), 3)    # session 3's kernels, chosen by measurement
    y = fast(x2)                                # x2: x's shape, dtype and device

Under CUDA graph replay Python is out of the loop, so every kernel costs only its GPU time; each
winner is still tried in the replayed model and kept only where the replays get faster beyond
noise (``kforge.integrate.select``). A model that cannot be captured (tensors on the CPU, a
forward that synchronizes with the host, a graph that does not reproduce the forward) is refused
with one KforgeError naming why; so is a call with other shapes than the captured ones.
"""

from __future__ import annotations

import contextlib
import os
from typing import Any

import torch

from kforge.errors import KforgeError
from kforge.integrate.graphs import StaticForward
from kforge.integrate.decide import choose
from kforge.integrate.measure import loaded_forward, output_difference
from kforge.integrate.select import Selection
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


def accelerate(model: torch.nn.Module, example_inputs: Any, session: int | KernelTable | Patch |
               None = None, *, example_kwargs: dict | None = None,
               db: str | os.PathLike[str] | None = None,
               device: str | torch.device | None = None, select: bool = True, reps: int = 20,
               warmup: int = 3, clone_outputs: bool = True) -> Accelerated:
    """``model`` on ``example_inputs`` (a tensor or a tuple of arguments) captured as a CUDA
    graph, with the kernels of ``session`` (a session id, loaded on ``device`` from ``db``; a
    ``KernelTable`` or ``Patch``; None: none) that make its replays faster beyond noise (all of
    them with ``select=False``). Outputs are cloned from the graph's buffers unless
    ``clone_outputs=False`` (then the next call overwrites them)."""
    args = example_inputs if isinstance(example_inputs, tuple) else (example_inputs,)
    loaded = loaded_forward(model, args, example_kwargs)  # refuses tensors off the GPU
    patch = _patch_of(session, db, device or loaded.device, model)
    selection = None
    if patch is not None and select and len(patch.table):
        table, selection = choose(loaded, patch, cuda_graphs=True, order=_order(patch),
                                  reps=reps, warmup=warmup)
        patch = patch.subset(table.entries, patch.notes)
    scope = (lambda: patch) if patch is not None else contextlib.nullcontext
    if patch is not None:
        patch.table.reset_counts()
    fast = Accelerated(model, args, example_kwargs, scope=scope, clone_outputs=clone_outputs)
    fast.patch, fast.selection = patch, selection
    _check_faithful(fast, scope)
    return fast


def _patch_of(session: int | KernelTable | Patch | None, db: str | os.PathLike[str] | None,
              device: str | torch.device, model: torch.nn.Module) -> Patch | None:
    from kforge.integrate.decide import patch
    from kforge.integrate.patching import SessionPatch

    if isinstance(session, SessionPatch):
        return session.for_model(model)  # its region kernels replace module forwards
    if session is None or isinstance(session, Patch):
        return session
    if isinstance(session, KernelTable):
        return Patch(session)
    return patch(session, db=db, device=device, cuda_graphs=True).for_model(model)


def _order(patch: Patch) -> list[Entry]:
    """A session's kernels by the time they are projected to save, largest first."""
    from kforge.integrate.patching import SessionPatch, by_saving

    return by_saving(patch) if isinstance(patch, SessionPatch) else list(patch.table.entries)


def _check_faithful(fast: Accelerated, scope: Any) -> None:
    """The replay must give what the same forward gives run eagerly on the same inputs."""
    replayed = fast.captured.replay()
    with scope():
        expected = fast.step()
    difference = output_difference(expected, replayed)
    if not difference.rel <= FAITHFUL_REL:  # NaN included
        raise KforgeError(f"the CUDA graph does not reproduce the forward ({difference}): the "
                          "forward does work outside the GPU stream (CPU tensors, Python state "
                          "that changes between calls) that a replay skips")
