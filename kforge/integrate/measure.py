"""Run a model in every mode a user may pick, with and without kforge's kernels, and measure
what the kernels change. This module measures; which kernels go in is decided elsewhere
(``kforge.integrate.decide``).

The modes (``MODES``): eager; its forward captured and replayed as a CUDA graph; torch.compile in
its default, reduce-overhead and max-autotune modes (kforge's kernels enter through the compile
backend, ``kforge.integrate.backend``), and, on request, the A/A control of each compiled mode:
kforge's backend with no kernel. Subjects are interleaved repetition by repetition (the order
flipping each time) so that clock and thermal drift cancel between them. Each forward is timed
twice: by device time, the span between CUDA events with the GPU held busy while the host enqueues
the forward (so host work is out of the window, as in a CUDA graph replay), and host-inclusive,
with the GPU idle before the call (what a caller waits for where the mode is not graphed).
Per-step state is restored outside the timed span (``LoadedModel.prepare``). A CUDA graph subject
is captured once (the guard, if any, active while capturing) and its replays are timed; a compiled
one is compiled by its first forward, timed apart. Outputs are compared with eager's: the largest
absolute difference and the relative L2 error, worst over all output tensors.
"""

from __future__ import annotations

import contextlib
import math
import time
import warnings
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import torch

from kforge.capture import zoo
from kforge.capture.loader import LoadedModel, ModelOptions, first_line, load_model
from kforge.core.candidate import KFORGE_SUFFIX, Timing
from kforge.errors import KforgeError
from kforge.eval.verify.ops import flatten_tensors
from kforge.integrate.backend import Backend, KforgeWarning
from kforge.integrate.graphs import capture, cuda_device_of, gc_paused, host_syncs
from kforge.runtime.guard import Patch
from kforge.runtime.table import KernelTable, Report
from kforge.runtime.timing import ForwardRun, time_forward_runs
from kforge.store.records import Session

EAGER, PATCHED, COMPILED = "eager", "patched", "torch.compile"


@dataclass(frozen=True)
class Difference:
    """How far one output is from eager's, worst over its tensors."""

    max_abs: float
    rel: float
    note: str = ""

    def __str__(self) -> str:
        if self.note:
            return self.note
        return f"max |diff| {self.max_abs:.3g}, relative {self.rel:.2g}"


def output_tensors(value: Any) -> list[torch.Tensor]:
    """The tensors of a model output, in order: tuples, lists and dicts (transformers' outputs
    are dicts) are walked; other objects (a KV cache) are not outputs to compare."""
    return flatten_tensors(value)


def output_difference(reference: Any, value: Any) -> Difference:
    ref, got = output_tensors(reference), output_tensors(value)
    if len(ref) != len(got):
        return Difference(math.nan, math.nan, f"{len(got)} output tensors where eager has "
                                              f"{len(ref)}")
    worst_abs = worst_rel = 0.0
    for a, b in zip(ref, got, strict=True):
        if a.shape != b.shape:
            return Difference(math.nan, math.nan, f"an output of shape {tuple(b.shape)} where "
                                                  f"eager's is {tuple(a.shape)}")
        a64, b64 = a.detach().double(), b.detach().double().to(a.device)
        diff = a64 - b64
        diff[torch.isnan(a64) & torch.isnan(b64)] = 0.0  # NaN where eager has NaN is agreement
        diff[(a64 == b64) & torch.isinf(a64)] = 0.0
        worst_abs = max(worst_abs, float(diff.abs().max()) if diff.numel() else 0.0)
        scale = float(torch.linalg.vector_norm(torch.nan_to_num(a64)))
        worst_rel = max(worst_rel, float(torch.linalg.vector_norm(diff)) / max(scale, 1e-30))
    return Difference(worst_abs, worst_rel)


@dataclass(frozen=True)
class Mode:
    """One way a user may run the model: eager, captured as a CUDA graph, or compiled with
    torch.compile in one of its modes, each without or with kforge's kernels; or the A/A control
    of a compiled mode (kforge's backend with no kernel)."""

    id: str  # as --modes names it: "reduce-overhead+kforge"
    label: str  # as tables show it
    kforge: bool
    graphs: bool = False  # the eager forward captured and replayed as a CUDA graph
    compile: str | None = None  # the torch.compile mode; None: not compiled
    control: bool = False  # the A/A control: kforge's backend with an empty kernel table

    @property
    def base(self) -> str:
        return self.id.removesuffix(KFORGE_SUFFIX).removesuffix(AA_SUFFIX)


AA_SUFFIX = "+aa"
# (base id, label, captured as a CUDA graph, torch.compile mode), in table order
_BASES = (("eager", "eager", False, None), ("graphs", "CUDA graphs", True, None),
          ("compile", "compile", False, "default"),
          ("reduce-overhead", "reduce-overhead", False, "reduce-overhead"),
          ("max-autotune", "max-autotune", False, "max-autotune"))
MODES: dict[str, Mode] = {
    mode.id: mode for base, label, graphs, compile_mode in _BASES for mode in (
        Mode(base, label, False, graphs, compile_mode),
        Mode(base + KFORGE_SUFFIX, label + " + kforge", True, graphs, compile_mode))}
BASES = tuple(base for base, *_ in _BASES)
# the A/A controls: what kforge's backend costs with nothing to put in
CONTROLS: dict[str, Mode] = {
    base + AA_SUFFIX: Mode(base + AA_SUFFIX, label + " A/A (kforge, no kernels)", True,
                           compile=compile_mode, control=True)
    for base, label, _, compile_mode in _BASES if compile_mode is not None}
# Whose run a +kforge row with no kforge kernel shows: the mode's own, in the row's words.
ALONE = {"eager": "eager's own", "graphs": "the CUDA graph's own"}


def own_run(base: str) -> str:
    """The kernels column of a ``+kforge`` row of mode ``base`` that runs the mode alone."""
    return "no kernels (" + ALONE.get(base, "Inductor's own") + ")"


# p90/p10 above which a mode's own timing noise hides any gain (a host-bound compiled forward)
UNDECIDABLE_SPREAD = 1.5


def parse_modes(text: str | None, *, aa: bool = False) -> list[Mode]:
    """``--modes``: comma-separated mode ids (``compile+kforge``) or bases (``compile``: with and
    without kforge), or ``all`` (the default); eager, the reference, is always measured. In table
    order; with ``aa``, each compiled mode measured without kforge is followed by its A/A
    control."""
    wanted = named_modes(text, list(MODES), BASES, "mode")
    modes = []
    for mode in MODES.values():
        if mode.id in wanted:
            modes.append(mode)
            if aa and mode.compile and not mode.kforge:
                modes.append(CONTROLS[mode.id + AA_SUFFIX])
    return modes


def named_modes(text: str | None, ids: list[str], bases: Iterable[str], what: str) -> set[str]:
    """The mode ids a comma-separated list names: ids, bases (each with and without kforge), or
    ``all`` (the default); eager always. An unknown name is a KforgeError calling it ``what``."""
    wanted = {"eager"}
    for word in (text or "all").split(","):
        word = word.strip()
        if word == "all":
            wanted |= set(ids)
        elif word in bases:
            wanted |= {word, word + KFORGE_SUFFIX}
        elif word in ids:
            wanted.add(word)
        elif word:
            raise KforgeError(f"unknown {what} {word!r}: use all, or any of "
                              f"{', '.join(ids)} (a name without +kforge selects both)")
    return wanted


@dataclass
class Measured:
    """One way of running the model: its latency and how its output compares with eager's."""

    name: str
    timing: Timing | None = None  # device time per forward
    difference: Difference | None = None
    setup_s: float | None = None  # torch.compile's compile time, or a graph's capture time
    error: str = ""
    mode: str = ""  # the Mode id
    kernels: str = ""  # what kforge's kernels did: calls per forward, or compiled nodes
    host: Timing | None = None  # host-inclusive time per forward (the GPU idle before the call)
    ran: int | None = None  # distinct kforge kernels that ran (None: a mode without kforge)
    # kforge's own version where it was not faster and torch.compile's result was handed back
    tried: Timing | None = None

    @property
    def spread(self) -> float | None:
        """p90/p10 of the device time."""
        t = self.timing
        return t.p90_us / t.p10_us if t is not None and t.p10_us > 0 else None


@dataclass
class E2eResult:
    subjects: list[Measured]
    report: Report  # what the patched model's kernels did in one forward
    projected: float  # Amdahl over operator time, from the cards' shares and speedups
    cuda_graphs: bool = False
    notes: list[str] = field(default_factory=list)

    def subject(self, name: str) -> Measured | None:
        return next((s for s in self.subjects if s.name == name or s.mode == name), None)

    def gain(self, base: str) -> float | None:
        """Mode ``base``'s latency over the same mode's with kforge's kernels (medians); None
        where no kforge kernel ran in it (nothing to gain: the difference is noise) or where the
        mode's own noise makes any gain undecidable."""
        without, with_kforge = self.subject(base), self.subject(base + KFORGE_SUFFIX)
        if not (without and with_kforge and without.timing and with_kforge.timing):
            return None
        if not with_kforge.ran or self.undecidable(base):
            return None
        return without.timing.median_us / with_kforge.timing.median_us

    def undecidable(self, base: str) -> bool:
        """Whether mode ``base``'s own timing spread (p90/p10) hides any gain."""
        return any((s := self.subject(mode)) is not None and (s.spread or 0) > UNDECIDABLE_SPREAD
                   for mode in (base, base + KFORGE_SUFFIX))

    def kforge_gain(self, measured: Measured) -> float | None:
        """For a mode with kforge's kernels, what they gain over the same mode without them."""
        mode = MODES.get(measured.mode)
        return self.gain(mode.base) if mode is not None and mode.kforge else None

    def gains(self) -> dict[str, float]:
        """What kforge gains in each mode measured with and without it, by the mode's label."""
        return {MODES[base].label: gain for base in BASES
                if (gain := self.gain(base)) is not None}

    @property
    def measured(self) -> float | None:
        """What kforge's kernels change in the eagerly run model (or, where it ran as CUDA
        graphs only, in the replayed one)."""
        eager = self.gain("eager")
        return eager if eager is not None else self.gain("graphs")


def rebuild_model(session: Session, device: torch.device, *,
                  trust_model: bool = False) -> LoadedModel:
    """The session's model and inputs, built again as they were profiled, on ``device``. A
    model file (any model but a built-in one) is code that the database names: it is imported
    only where the user confirms it (``trust_model``: ``--trust-model``)."""
    if not trust_model and zoo.get(session.model) is None:
        raise KforgeError(f"session {session.id} names the model {session.model!r}: rebuilding "
                          "it imports and runs that file; check that it is the one you mean, "
                          "then pass --trust-model")
    s = session.settings
    options = ModelOptions(dtype=s.get("dtype"), device=str(device), batch=s.get("batch"),
                           seq_len=s.get("seq_len"), mode=s.get("mode"), layers=s.get("layers"))
    return load_model(session.model, options)


def loaded_forward(model: torch.nn.Module, args: tuple, kwargs: dict | None = None
                   ) -> LoadedModel:
    """A user's model and example inputs in the form the measurements take."""
    device = cuda_device_of(model, args, kwargs or {})
    dtype = next((p.dtype for p in model.parameters() if p.is_floating_point()), torch.float32)
    return LoadedModel(type(model).__name__, model, tuple(args), dict(kwargs or {}), dtype,
                       device)


def compare_once(loaded: LoadedModel, patch: Patch) -> tuple[Difference, Report]:
    """One eager and one patched forward: the output difference and what the kernels did."""
    _, difference, report = _first_runs(loaded, patch)
    return difference, report


def _first_runs(loaded: LoadedModel, patch: Patch) -> tuple[Any, Difference, Report]:
    loaded.prepare()
    reference = loaded.step()
    patch.table.reset_counts()
    loaded.prepare()
    with patch:
        patched = loaded.step()
    _sync(loaded)
    return reference, output_difference(reference, patched), patch.report()


def run_modes(loaded: LoadedModel, modes: list[Mode], *, patched: Patch,
              graphed: Patch | None = None,
              compiled: KernelTable | Patch | dict[str, KernelTable] | None = None,
              projected: float, reps: int = 20, warmup: int = 3) -> E2eResult:
    """Time the model in each of ``modes``, interleaved rep by rep, and compare each output with
    eager's. kforge's kernels come from ``patched`` run eagerly, ``graphed`` (default: patched)
    in CUDA graphs, ``compiled`` (default: graphed; or one table per torch.compile mode, where
    an empty one leaves the ``+kforge`` mode untimed: it is torch.compile alone) through the
    compile backend."""
    graphed = graphed or patched
    compiled = compiled or graphed
    reference, difference, report = _first_runs(loaded, patched)
    results = {m.id: Measured(m.label, mode=m.id) for m in modes}
    subjects: list[ForwardRun] = []
    notes: list[str] = []
    # captures happen throughout (graphs, first and timed calls of modes with CUDA graphs)
    with gc_paused(), torch._dynamo.config.patch(recompile_limit=64):  # one compile per mode
        for mode in modes:
            measured = results[mode.id]
            kernels = (KernelTable() if mode.control else
                       compiled.get(mode.compile, KernelTable()) if isinstance(compiled, dict)
                       else compiled) if mode.compile else graphed if mode.graphs else patched
            if mode.kforge and not mode.control and not len(
                    kernels.table if isinstance(kernels, Patch) else kernels):
                # No kernel was chosen for this mode: it is the mode alone, not timed twice
                # (its row takes the mode's own figures below).
                measured.ran, measured.kernels = 0, "no kernels"
                continue
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always", KforgeWarning)
                subject = _subject(loaded, mode, kernels, measured, reference, warmup)
            notes += [f"{mode.label}: {w.message}" for w in caught
                      if issubclass(w.category, KforgeWarning) and not mode.control]
            if mode.kforge and not mode.graphs and not mode.compile:
                measured.difference = difference
                measured.kernels = f"{report.hits} calls"
                measured.ran = sum(1 for k in report.kernels if k.hits)
            if subject is not None:
                subjects.append(subject)
        if "eager" in results and loaded.device.type == "cuda":
            notes += synchronizing_note(loaded)
        times = time_subjects(loaded, subjects, reps, warmup)
    for mode in modes:
        measured = results[mode.id]
        if measured.name in times:
            measured.timing, measured.host = times[measured.name]
        alone = results.get(mode.base)
        if (mode.kforge and not mode.control and measured.ran == 0 and measured.timing is None
                and not measured.error and alone is not None and alone.timing is not None):
            # nothing of kforge's in it: the user runs the mode alone, and the row says so
            measured.timing, measured.host = alone.timing, alone.host
            measured.difference = alone.difference
            measured.kernels = own_run(mode.base)
        elif measured.ran == 0:
            measured.kernels = "no kernels"
    return E2eResult([results[m.id] for m in modes], report, projected, notes=notes)


def synchronizing_note(loaded: LoadedModel) -> list[str]:
    """A note where the eager forward waits for the GPU (``.item()``, a value checked on the
    host): its device time then includes the host's time after each wait."""
    loaded.prepare()
    places = host_syncs(loaded.step)
    if not places:
        return []
    return [f"eager: the forward synchronizes with the host at {', '.join(places[:3])}"
            f"{' and more' if len(places) > 3 else ''}: the GPU idles while the host issues "
            "what follows, so eager's device time includes host time"]


def _subject(loaded: LoadedModel, mode: Mode, kernels: KernelTable | Patch, measured: Measured,
             reference: Any, warmup: int) -> ForwardRun | None:
    """How to run one forward in ``mode`` (compiled or captured first); None, with the error
    in ``measured``, where the mode fails for this model."""
    try:
        if mode.compile is not None:
            return _compiled(loaded, mode, kernels, measured, reference, warmup)
        patch = kernels if isinstance(kernels, Patch) else Patch(kernels)
        scope = (lambda: patch) if mode.kforge else contextlib.nullcontext
        subject = ForwardRun(mode.label, loaded.step, scope)
        if not mode.graphs:
            return subject
        if mode.kforge:
            patch.table.reset_counts()
        graphed = _graphed(loaded, subject, measured, reference)
        if mode.kforge:
            captured = patch.report()
            measured.kernels = f"{captured.hits} captured"
            measured.ran = sum(1 for k in captured.kernels if k.hits)
        return graphed
    except Exception as exc:  # Dynamo, Inductor or graph capture gave up on this model
        what = "torch.compile" if mode.compile else "CUDA graph capture"
        measured.error = f"{what} failed: {type(exc).__name__}: {first_line(exc)}"
        return None


def _sync(loaded: LoadedModel) -> None:
    if loaded.device.type == "cuda":
        torch.cuda.synchronize(loaded.device)


def compiled_step(loaded: LoadedModel, compile_mode: str,
                  kernels: KernelTable | Patch | None) -> tuple[Callable[[], Any], Any]:
    """One forward of the model under torch.compile in ``compile_mode``: through kforge's
    backend with ``kernels`` (an empty table: the A/A control), or (None) torch.compile
    alone; and the backend (None for torch.compile alone). Not compiled until first called."""
    from torch._inductor import list_mode_options

    table = kernels.table if isinstance(kernels, Patch) else kernels
    chosen = Backend(table, mode=compile_mode) if table is not None else None
    model = (torch.compile(loaded.model, backend=chosen) if chosen is not None
             else torch.compile(loaded.model, mode=compile_mode))
    replays = bool(list_mode_options(compile_mode).get("triton.cudagraphs"))

    def step() -> Any:
        if replays:  # each call is a new step: earlier outputs may be overwritten
            torch.compiler.cudagraph_mark_step_begin()
        with torch.no_grad():
            return model(*loaded.args, **loaded.kwargs)

    return step, chosen


def _compiled(loaded: LoadedModel, mode: Mode, kernels: KernelTable | Patch, measured: Measured,
              reference: Any, warmup: int) -> ForwardRun:
    """torch.compile of the model in ``mode`` (through kforge's backend for a kforge mode),
    compiled by its first forward (timed apart)."""
    assert mode.compile is not None
    table = kernels.table if isinstance(kernels, Patch) else kernels
    if mode.kforge:
        table.reset_counts()
    step, chosen = compiled_step(loaded, mode.compile, table if mode.kforge else None)
    start = time.perf_counter()
    loaded.prepare()
    step()
    _sync(loaded)
    measured.setup_s = time.perf_counter() - start
    for _ in range(warmup):
        loaded.prepare()
        step()
    loaded.prepare()
    output = step()
    if reference is not None:
        measured.difference = output_difference(reference, output)
    if chosen is not None:
        measured.ran = len(ran_kernels(chosen))
        measured.kernels = (f"{chosen.report.nodes} nodes" if chosen.report.nodes
                            else f"{measured.ran} kernels")
    return ForwardRun(mode.label, step)


def ran_kernels(chosen: Backend) -> set[str]:
    """The kernels of a compiled model that are in its graphs (counted by kforge's pass) or, for
    graphs from Inductor's FX graph cache, that ran."""
    ran = {k.label or k.op for k in chosen.table.report().kernels if k.hits}
    return chosen.report.kernels() | (ran if chosen.report.cached else set())


def _graphed(loaded: LoadedModel, subject: ForwardRun, measured: Measured,
             reference: Any) -> ForwardRun:
    """Capture one forward of ``subject`` in a CUDA graph; the subject then replays it."""

    def prepare() -> list[torch.Tensor]:
        loaded.prepare()
        return reachable_tensors((loaded.args, loaded.kwargs))  # alive for every replay

    captured = capture(subject.step, loaded.device, prepare=prepare, scope=subject.scope)
    measured.setup_s = captured.setup_s
    if reference is not None:  # for eager: is the graph faithful?
        measured.difference = output_difference(reference, captured.outputs)
    # The step stays alive with its graph: it owns what the graph launches (a compiled model's
    # kernels, a kernel table's cubins), unloaded when collected.
    return ForwardRun(subject.name, captured.graph.replay, prepare=False,
                   keep=(captured, subject.step))


def run_e2e(loaded: LoadedModel, patch: Patch, projected: float, *, reps: int = 20,
            warmup: int = 3, cuda_graphs: bool = False, compile: bool = True) -> E2eResult:
    """Eager, patched and (unless ``compile`` is False) torch.compile forwards, named so; with
    ``cuda_graphs`` eager and patched are CUDA graph replays and torch.compile runs in its
    default mode."""
    modes = [MODES["graphs"], MODES["graphs+kforge"]] if cuda_graphs else [
        MODES["eager"], MODES["eager+kforge"]]
    result = run_modes(loaded, modes + ([MODES["compile"]] if compile else []), patched=patch,
                       projected=projected, reps=reps, warmup=warmup)
    names = {"eager": EAGER, "graphs": EAGER, "eager+kforge": PATCHED, "graphs+kforge": PATCHED,
             "compile": COMPILED}
    for measured in result.subjects:
        measured.name = names[measured.mode]
    result.cuda_graphs = cuda_graphs
    if cuda_graphs and compile:
        result.notes.append("torch.compile runs in its default mode (no CUDA graphs)")
    return result


def reachable_tensors(value: Any, depth: int = 6) -> list[torch.Tensor]:
    """Tensors held by ``value`` (through containers and plain objects' attributes, such as a KV
    cache's layers): a captured graph reads them on every replay, so they must stay alive even
    when the model's own step rebinds them."""
    if depth < 0 or isinstance(value, torch.nn.Module):
        return []
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        items = value
    elif isinstance(value, dict):
        items = list(value.values())
    elif hasattr(value, "__dict__"):
        items = list(vars(value).values())
    else:
        return []
    return [t for item in items for t in reachable_tensors(item, depth - 1)]


def time_forwards(loaded: LoadedModel, subjects: list[ForwardRun], reps: int,
                  warmup: int) -> dict[str, Timing]:
    """Device time per forward of each subject, interleaved rep by rep (order flipped each
    rep); ``kforge.runtime.timing.time_forward_runs`` says how."""
    return {name: device for name, (device, _) in
            time_subjects(loaded, subjects, reps, warmup, host=False).items()}


def time_subjects(loaded: LoadedModel, subjects: list[ForwardRun], reps: int, warmup: int, *,
                  host: bool = True) -> dict[str, tuple[Timing, Timing | None]]:
    """Per subject, device time per forward and (with ``host``) host-inclusive time, each
    forward after ``loaded.prepare``. Garbage collection waits until the end: a compiled mode
    with CUDA graphs may record again in any call (``gc_paused``), and a collection inside a
    timed forward is noise."""
    with gc_paused():
        return time_forward_runs(subjects, loaded.device, reps, warmup,
                                 restore=loaded.prepare, host=host)
