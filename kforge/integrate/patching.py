"""A session's winning kernels loaded into this process as a patch
(``with kforge.patch(session_id): model(x)``; ``kforge.integrate.decide`` chooses among them by
measuring the model).

The winners are compiled for this GPU with NVRTC (through kforge's cubin cache), loaded with
cuda.core and handed to the runtime's guard, which runs each kernel for its exact op variant only.
Without a measurement the winners are those projected to pay for their guard
(``worth_routing``), or all of them under CUDA graphs.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch

from kforge.core.opcard import OpCard
from kforge.errors import KforgeError
from kforge.integrate.plan import SessionPlan, read_plan
from kforge.integrate.regions import ForwardSwap
from kforge.integrate.winners import (
    NO_GPU_ARCH,
    CardChoice,
    Selection,
    card_label,
    projected_speedup,
    worth_routing,
)
from kforge.runtime.cubin import KernelModule, device_arch
from kforge.runtime.guard import Patch
from kforge.runtime.plan import PlanRunner, check_kernels, check_widths, resolve_for
from kforge.runtime.regions import register_cards
from kforge.runtime.table import Entry, KernelTable, RangeRunner, Report
from kforge.store.config import db_path


class SessionPatch(Patch):
    """A patch made from a stored session; ``plan`` says what became of every card."""

    def __init__(self, plan: SessionPlan, table: KernelTable, notes: list[str],
                 selection: Selection[Entry] | None = None,
                 model: torch.nn.Module | None = None) -> None:
        super().__init__(table, notes)
        self.plan = plan
        self.selection = selection  # how the kernels were chosen by measurement, if they were
        self.model = model  # where region kernels replace module forwards while active
        self._swap: ForwardSwap | None = None

    def for_model(self, model: torch.nn.Module) -> SessionPatch:
        """This patch, also replacing the forward of each of ``model``'s modules whose whole
        forward is a region with a kernel here (``kforge.integrate.regions``)."""
        return SessionPatch(self.plan, self.table, self.notes, self.selection, model)

    def subset(self, entries: Iterable[Entry], notes: Iterable[str] = ()) -> SessionPatch:
        return SessionPatch(self.plan, KernelTable(entries), list(notes), None, self.model)

    def region_cards(self) -> list[OpCard]:
        """The region cards whose kernels this patch holds."""
        keys = {entry.key for entry in self.table.entries}
        return [d.card for d in self.plan.winners if d.card.region is not None
                and d.card.key in keys]

    def report(self) -> Report:
        report = super().report()
        if self.model is None and (regions := self.region_cards()):
            report = Report(report.kernels, report.misses, [
                *report.notes, f"{len(regions)} fusion-region kernel(s) run only in a patch "
                "that knows the model: kforge.patch(..., model=..., example_inputs=...) or "
                "patch.for_model(model)"])
        return report

    def install(self) -> None:
        super().install()
        if self.model is not None and self._swap is None and (cards := self.region_cards()):
            self._swap = ForwardSwap(self.model, cards)
            self._swap.install()
            self.notes += [n for n in self._swap.notes if n not in self.notes]

    def remove(self) -> None:
        if self._swap is not None:
            self._swap.remove()
            self._swap = None
        super().remove()

    def loaded(self, decision: CardChoice) -> bool:
        """Whether the decision's kernel is in this patch (a winner may fail to load here)."""
        return any(entry.key == decision.card.key for entry in self.table.entries)

    @property
    def projected(self) -> float:
        """Amdahl's projection over the kernels that did load."""
        return projected_speedup(d for d in self.plan.winners if self.loaded(d))


def load_patch(session_id: int, *, db: str | os.PathLike[str] | None = None,
               device: str | torch.device | None = None,
               cuda_graphs: bool = False) -> SessionPatch:
    """The session's winning kernels compiled and loaded on ``device`` (default: the current
    CUDA device): with ``cuda_graphs`` every winner, else only those projected to pay for their
    guard (``kforge.patch`` chooses them by measurement where it has the model)."""
    path = session_database(session_id, db)
    cuda = cuda_device(device, "kforge.patch")
    arch = device_arch(cuda)
    plan = read_plan(path, session_id, runs_on=arch, graphs=cuda_graphs)
    check_arch(plan, cuda)
    return build_patch(plan, cuda)


def check_session_args(session_id: Any, db: Any) -> None:
    """A KforgeError naming ``session_id`` or ``db`` where it is not a session number or a
    path: checked before anything else (a GPU, a compile)."""
    if isinstance(session_id, bool) or not isinstance(session_id, int) or session_id < 1:
        raise KforgeError(f"{session_id!r} is not a session number: pass one that "
                          "`kforge sessions` lists")
    if db is not None and not isinstance(db, (str, os.PathLike)):
        raise KforgeError(f"db={db!r} is not a path to a kforge database")


def session_database(session_id: Any, db: Any) -> Path:
    """The database holding session ``session_id``, the arguments checked first
    (``check_session_args``), then that the database is there."""
    check_session_args(session_id, db)
    path = db_path(db)
    if not path.is_file():
        raise KforgeError(f"no kforge database at {path} (profile a model first, or pass db= "
                          "or set KFORGE_DB)")
    return path


def projected_patch(patch: SessionPatch) -> SessionPatch:
    """The patch with only the kernels projected to save more than their guard costs outside
    CUDA graphs (``worth_routing``), as ``patch(..., cuda_graphs=False)`` chooses them."""
    why = {d.card.key: d.reason for d in worth_routing(patch.plan.decisions) if not d.replaced}
    kept = KernelTable([e for e in patch.table.entries if e.key not in why])
    notes = [*patch.notes, *(f"{e.label}: kept on eager, {why[e.key]}"
                             for e in patch.table.entries if e.key in why)]
    return SessionPatch(patch.plan, kept, notes, None, patch.model)


def by_saving(patch: SessionPatch) -> list[Entry]:
    """The patch's kernels by the operator time they are projected to save, largest first."""
    saving = {d.card.key: d.card.share * (1.0 - 1.0 / d.speedup)
              for d in patch.plan.winners if d.speedup}
    return sorted(patch.table.entries, key=lambda e: -saving.get(e.key, 0.0))


class NoGpu(KforgeError):
    """This machine cannot load kernels: no CUDA GPU, or no cuda-core."""


class ProfiledWithoutGpu(KforgeError):
    """The session was profiled on the CPU: it has no verified kernel to load."""


def cuda_device(device: str | torch.device | None, what: str) -> torch.device:
    """The CUDA device to run on, with its index; a KforgeError naming ``what`` where there is
    none (NoGpu where this machine has no GPU or no cuda-core)."""
    try:
        import cuda.core  # noqa: F401
    except ImportError:
        raise NoGpu(f"{what} needs cuda-core to load kernels (pip install "
                    "'kforge[cuda]')") from None
    if not torch.cuda.is_available():
        raise NoGpu(f"{what} needs a CUDA GPU and this torch sees none "
                    "(`kforge export` packages the kernels without one)")
    try:
        chosen = torch.device(device) if device is not None else torch.device("cuda")
    except RuntimeError:
        raise KforgeError(f"unknown device {device!r}: use cuda or cuda:N") from None
    if chosen.type != "cuda":
        raise KforgeError(f"{what} runs kernels on a CUDA device, not {chosen}")
    index = chosen.index if chosen.index is not None else torch.cuda.current_device()
    if index >= torch.cuda.device_count():
        raise KforgeError(f"there is no cuda:{index}: {torch.cuda.device_count()} GPU(s) visible")
    return torch.device("cuda", index)


def check_arch(plan: SessionPlan, device: torch.device) -> None:
    """Refuse a session whose kernels were verified on another GPU architecture."""
    made_on, here = plan.made_on, device_arch(device)
    sid = plan.session.id
    if made_on == NO_GPU_ARCH:
        raise ProfiledWithoutGpu(f"session {sid} was profiled without a GPU: it has no verified "
                                 "kernels to apply (profile and search the model on this GPU)")
    if made_on != here:
        name = plan.session.gpu.get("name", "another GPU")
        raise KforgeError(f"session {sid} was searched on {name} ({made_on}) but this GPU is "
                          f"{torch.cuda.get_device_name(device)} ({here}): its kernels are "
                          "verified there only; search the model again here, or "
                          f"`kforge export {sid} --arch {here}` to take them along unverified")


def build_patch(plan: SessionPlan, device: torch.device) -> SessionPatch:
    """Compile and load the plan's winners on ``device``; a winner that fails to compile or
    load stays on eager, with a note saying why."""
    from kforge.runtime.kernel_loader import NvrtcLoader

    loader = NvrtcLoader(device.index, device_arch(device))
    table, notes = KernelTable(), []
    register_cards(d.card for d in plan.winners)  # the region cards' operators
    for decision in plan.winners:
        card, candidate = decision.card, decision.candidate
        assert candidate is not None  # a winner always carries its code
        label = card_label(card)
        compiled = loader.compile(candidate)
        if not compiled.ok:
            first = compiled.log.strip().splitlines()[0] if compiled.log.strip() else "no log"
            notes.append(f"{label}: kept on eager, it does not compile for {loader.arch}: {first}")
            continue
        try:
            resolved = resolve_for(candidate.plan, card.op, card.args, card.kwargs)
            kernels = KernelModule(compiled.cubin, device)
            check_kernels(resolved, kernels.has_kernel, sorted(compiled.resources))
            check_widths(resolved, kernels.param_widths)
            runner = PlanRunner(resolved, card.op, kernels, device)
            if card.ranges is not None:  # the plan resolved per point of the range
                runner = RangeRunner(candidate.plan, card.op, card.args, card.kwargs,
                                     card.ranges, kernels, device)
            entry = Entry(op=card.op, args=card.args, kwargs=card.kwargs, runner=runner,
                          device=device, label=label, key=card.key, ranges=card.ranges)
        except Exception as exc:  # a plan or cubin that cannot load: eager keeps the op
            notes.append(f"{label}: kept on eager, it does not load: {type(exc).__name__}: {exc}")
            continue
        table.add(entry)
    return SessionPatch(plan, table, notes)


def unused_message(patch: SessionPatch, report: Report) -> str | None:
    """What to tell the user when a patched forward ran none of the kernels: the model is not
    the one the session profiled."""
    if not len(patch.table) or report.hits:
        return None
    return (f"none of session {patch.plan.session.id}'s kernels ran: the model does not call the "
            "op variants it was profiled with (did the model, its inputs or its settings change "
            "since?)")
