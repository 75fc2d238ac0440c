"""kforge's Python API: ``patch``, ``backend``, ``compile`` and ``accelerate`` (also as
``kforge.<name>``), each taking a session's winning kernels into a model the way its user runs it:
patched in eagerly or under CUDA graphs, through a torch.compile backend, or captured in a CUDA
graph. Which kernels go in is decided by ``kforge.integrate.decide`` (by measuring the whole
model where the caller gives example inputs); this module only takes what the caller gives.
"""

from __future__ import annotations

import contextlib
import os
import warnings
from typing import Any

import torch

from kforge.errors import KforgeError
from kforge.integrate.accelerate import Accelerated, check_faithful
from kforge.integrate.backend import Backend, KforgeWarning, unfused
from kforge.integrate.decide import (
    choose,
    choose_compiled,
    final_verdict,
    select_measured,
)
from kforge.integrate.measure import loaded_forward
from kforge.integrate.patching import (
    SessionPatch,
    by_saving,
    check_session_args,
    load_patch,
)
from kforge.runtime.guard import Patch
from kforge.runtime.table import Entry, KernelTable


def patch(session_id: int, *, db: str | os.PathLike[str] | None = None,
          device: str | torch.device | None = None, cuda_graphs: bool = False,
          model: torch.nn.Module | None = None, example_inputs: Any = None,
          example_kwargs: dict | None = None, reps: int = 20, warmup: int = 3) -> SessionPatch:
    """The session's winning kernels, compiled and loaded on ``device`` (default: the current
    CUDA device), as a context manager that patches them in while active::

        with kforge.patch(3, model=model, example_inputs=(x,)) as p:
            model(x)
        print(p.report())

    With ``model`` and ``example_inputs`` (a tensor or a tuple of arguments), each winner is
    tried in whole forwards of the model on those inputs (``reps`` timed after ``warmup``) and
    kept only where the forward gets faster beyond the timing noise, so the patched model is
    never slower than eager by that measurement (``p.selection`` has every trial). Without them,
    the winners are chosen by projection: every winner with ``cuda_graphs=True`` (the model is
    captured and replayed as CUDA graphs), otherwise only those projected to save more than their
    Python guard costs. ``cuda_graphs=True`` with a model measures CUDA graph replays. Kernels
    of fusion regions run only in a patch that knows the model (``model=``, or
    ``patch.for_model(model)``): they replace the forwards of the modules that are the region.
    """
    if model is not None and example_inputs is None:
        raise KforgeError("kforge.patch(model=...) needs example_inputs= too: the winners are "
                          "chosen by timing forwards of the model on them")
    built = load_patch(session_id, db=db, device=device,
                       cuda_graphs=cuda_graphs or model is not None)
    if model is None:
        return built
    args = example_inputs if isinstance(example_inputs, tuple) else (example_inputs,)
    return select_measured(built, loaded_forward(model, args, example_kwargs),
                           cuda_graphs=cuda_graphs, reps=reps, warmup=warmup)


def backend(source: int | KernelTable | Patch, *, mode: str | None = None,
            options: dict | None = None, dynamic: bool | None = None,
            db: str | os.PathLike[str] | None = None,
            device: str | torch.device | None = None) -> Backend:
    """A ``torch.compile`` backend running Inductor (``mode``, ``options`` as for
    ``torch.compile``) with kforge's kernels: those of a ``KernelTable`` or ``Patch`` as given,
    or of session ``source`` (loaded on ``device`` from database ``db``) those of ops Inductor
    does not fuse (``inductor_fuses``; the others need a measurement in the model:
    ``kforge.compile(..., example_inputs=...)``). A session that cannot be loaded here (no GPU,
    another GPU architecture) leaves Inductor alone, with a warning."""
    notes: list[str] = []
    if isinstance(source, Patch):
        table, notes = source.table, list(source.notes)
    elif isinstance(source, KernelTable):
        table = source
    else:
        check_session_args(source, db)  # a wrong argument is the caller's error, not a note
        try:
            # compiled code calls a kernel only for its exact variant, with no guard in front
            # of the op's other calls
            loaded = load_patch(source, db=db, device=device, cuda_graphs=True)
        except KforgeError as exc:
            table, notes = KernelTable(), [str(exc)]
        else:
            table, left = unfused(loaded.table)
            notes = [*loaded.notes, *left]
    return Backend(table, mode=mode, options=options, dynamic=dynamic, notes=notes)


def compile(model: Any, source: int | KernelTable | Patch, *, mode: str | None = None,
            options: dict | None = None, dynamic: bool | None = None, fullgraph: bool = False,
            db: str | os.PathLike[str] | None = None,
            device: str | torch.device | None = None, example_inputs: Any = None,
            example_kwargs: dict | None = None, reps: int = 20, warmup: int = 3) -> Any:
    """``torch.compile(model, backend=kforge.backend(source, ...))``; the backend, with its
    ``report``, is the compiled model's ``kforge_backend`` attribute. With ``example_inputs`` (a
    tensor or a tuple of arguments) and a session (its id or its ``kforge.patch``) as ``source``,
    the kernels are chosen by measuring the compiled model in ``mode`` on them
    (``choose_compiled``), and the result is timed against torch.compile alone in ``mode``:
    unless kforge's version is faster beyond noise, torch.compile's own model is returned (its
    ``kforge_verdict`` says why, as does a KforgeWarning)."""
    compile_mode = mode or "default"
    if example_inputs is None:
        chosen = backend(source, mode=mode, options=options, dynamic=dynamic, db=db,
                         device=device)
        compiled = torch.compile(model, backend=chosen, dynamic=dynamic, fullgraph=fullgraph)
        compiled.kforge_backend = chosen
        return compiled
    if isinstance(source, int):
        source = load_patch(source, db=db, device=device, cuda_graphs=True)
    if not isinstance(source, SessionPatch):
        raise KforgeError("kforge.compile(..., example_inputs=...) chooses among a session's "
                          "kernels: pass the session id (or its kforge.patch)")
    args = example_inputs if isinstance(example_inputs, tuple) else (example_inputs,)
    loaded = loaded_forward(model, args, example_kwargs)
    with torch.no_grad():
        table, _ = choose_compiled(loaded, source, compile_mode, reps=reps, warmup=warmup)
        judged = final_verdict(loaded, compile_mode, table, reps, warmup)
    if not judged.kept:
        warnings.warn(judged.line, KforgeWarning, stacklevel=2)
        compiled = torch.compile(model, mode=mode, options=options, dynamic=dynamic,
                                 fullgraph=fullgraph)
    else:
        chosen = Backend(table, mode=mode, options=options, dynamic=dynamic, notes=[judged.line])
        compiled = torch.compile(model, backend=chosen, dynamic=dynamic, fullgraph=fullgraph)
        compiled.kforge_backend = chosen
    compiled.kforge_verdict = judged
    return compiled


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
    check_faithful(fast, scope)
    return fast


def _patch_of(session: int | KernelTable | Patch | None, db: str | os.PathLike[str] | None,
              device: str | torch.device, model: torch.nn.Module) -> Patch | None:
    if isinstance(session, SessionPatch):
        return session.for_model(model)  # its region kernels replace module forwards
    if session is None or isinstance(session, Patch):
        return session
    if isinstance(session, KernelTable):
        return Patch(session)
    return patch(session, db=db, device=device, cuda_graphs=True).for_model(model)


def _order(patch: Patch) -> list[Entry]:
    """A session's kernels by the time they are projected to save, largest first."""
    return by_saving(patch) if isinstance(patch, SessionPatch) else list(patch.table.entries)
