"""Put a session's winning kernels into this process: ``with kforge.patch(session_id): model(x)``.

The winners are compiled for this GPU with NVRTC (through kforge's cubin cache), loaded with
cuda.core and handed to the runtime's guard, which runs each kernel for its exact op variant only.
"""

from __future__ import annotations

import os

import torch

from kforge.errors import KforgeError
from kforge.integrate.plan import SessionPlan, read_plan
from kforge.integrate.winners import (
    NO_GPU_ARCH,
    Decision,
    card_label,
    projected_speedup,
)
from kforge.runtime.cubin import KernelModule, device_arch
from kforge.runtime.guard import Patch
from kforge.runtime.plan import PlanRunner, check_kernels, check_widths, resolve_for
from kforge.runtime.table import Entry, KernelTable, Report
from kforge.store.config import db_path


class SessionPatch(Patch):
    """A patch made from a stored session; ``plan`` says what became of every card."""

    def __init__(self, plan: SessionPlan, table: KernelTable, notes: list[str]) -> None:
        super().__init__(table, notes)
        self.plan = plan

    def loaded(self, decision: Decision) -> bool:
        """Whether the decision's kernel is in this patch (a winner may fail to load here)."""
        return any(entry.key == decision.card.key for entry in self.table.entries)

    @property
    def projected(self) -> float:
        """Amdahl's projection over the kernels that did load."""
        return projected_speedup(d for d in self.plan.winners if self.loaded(d))


def patch(session_id: int, *, db: str | os.PathLike[str] | None = None,
          device: str | torch.device | None = None, cuda_graphs: bool = False) -> SessionPatch:
    """The session's winning kernels, compiled and loaded on ``device`` (default: the current
    CUDA device), as a context manager that patches them in while active::

        with kforge.patch(3) as p:
            model(x)
        print(p.report())

    Pass ``cuda_graphs=True`` when the model is captured and replayed as CUDA graphs: then every
    winner is used; otherwise only those that save more than their Python guard costs.
    """
    cuda = cuda_device(device, "kforge.patch")
    arch = device_arch(cuda)
    plan = read_plan(db_path(db), session_id, runs_on=arch, graphs=cuda_graphs)
    check_arch(plan, cuda)
    return build_patch(plan, cuda)


def cuda_device(device: str | torch.device | None, what: str) -> torch.device:
    """The CUDA device to run on, with its index; a KforgeError naming ``what`` where there is
    none."""
    try:
        import cuda.core  # noqa: F401
    except ImportError:
        raise KforgeError(f"{what} needs cuda-core to load kernels (pip install "
                          "'kforge[cuda]')") from None
    if not torch.cuda.is_available():
        raise KforgeError(f"{what} needs a CUDA GPU and this torch sees none "
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
        raise KforgeError(f"session {sid} was profiled without a GPU: it has no verified kernels "
                          "to apply (profile and search the model on this GPU)")
    if made_on != here:
        name = plan.session.gpu.get("name", "another GPU")
        raise KforgeError(f"session {sid} was searched on {name} ({made_on}) but this GPU is "
                          f"{torch.cuda.get_device_name(device)} ({here}): its kernels are "
                          "verified there only; search the model again here, or "
                          f"`kforge export {sid} --arch {here}` to take them along unverified")


def build_patch(plan: SessionPlan, device: torch.device) -> SessionPatch:
    """Compile and load the plan's winners on ``device``; a winner that fails to compile or
    load stays on eager, with a note saying why."""
    from kforge.eval.kernel_loader import NvrtcLoader

    loader = NvrtcLoader(device.index, device_arch(device))
    table, notes = KernelTable(), []
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
            entry = Entry(op=card.op, args=card.args, kwargs=card.kwargs, runner=runner,
                          device=device, label=label, key=card.key)
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
