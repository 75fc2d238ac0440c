"""Run a model in every mode a user may pick, with and without kforge's kernels, and measure
what the kernels change; and choose the kernels worth keeping by that measurement.

The modes (``MODES``): eager; its forward captured and replayed as a CUDA graph; torch.compile in
its default, reduce-overhead and max-autotune modes (kforge's kernels enter through the compile
backend, ``kforge.integrate.backend``). Latency is GPU time per forward between CUDA events on the
model's stream (median and p10..p90 over repetitions), with the subjects interleaved repetition by
repetition (the order flipping each time) so that clock and thermal drift cancel between them.
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
from typing import TYPE_CHECKING, Any

import torch

from kforge.capture import zoo
from kforge.capture.loader import LoadedModel, ModelOptions, first_line, load_model
from kforge.core.candidate import KFORGE_SUFFIX, Timing
from kforge.errors import KforgeError
from kforge.eval.ops import flatten_tensors
from kforge.eval.timing import summarize
from kforge.integrate.backend import KforgeWarning
from kforge.integrate.graphs import capture, cuda_device_of
from kforge.integrate.select import Selection, select
from kforge.runtime.guard import Patch
from kforge.runtime.table import Entry, KernelTable, Report
from kforge.store.records import Session

if TYPE_CHECKING:
    from kforge.integrate.patching import SessionPatch

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
    torch.compile in one of its modes, each without or with kforge's kernels."""

    id: str  # as --modes names it: "reduce-overhead+kforge"
    label: str  # as tables show it
    kforge: bool
    graphs: bool = False  # the eager forward captured and replayed as a CUDA graph
    compile: str | None = None  # the torch.compile mode; None: not compiled

    @property
    def base(self) -> str:
        return self.id.removesuffix(KFORGE_SUFFIX)


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


def parse_modes(text: str | None) -> list[Mode]:
    """``--modes``: comma-separated mode ids (``compile+kforge``) or bases (``compile``: with and
    without kforge), or ``all`` (the default); eager, the reference, is always measured. In table
    order."""
    wanted = named_modes(text, list(MODES), BASES, "mode")
    return [mode for mode in MODES.values() if mode.id in wanted]


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
    timing: Timing | None = None
    difference: Difference | None = None
    setup_s: float | None = None  # torch.compile's compile time, or a graph's capture time
    error: str = ""
    mode: str = ""  # the Mode id
    kernels: str = ""  # what kforge's kernels did: calls per forward, or compiled nodes


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
        """Mode ``base``'s latency over the same mode's with kforge's kernels (medians)."""
        without, with_kforge = self.subject(base), self.subject(base + KFORGE_SUFFIX)
        if without and with_kforge and without.timing and with_kforge.timing:
            return without.timing.median_us / with_kforge.timing.median_us
        return None

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


@dataclass
class Subject:
    """One way of running a forward, for ``time_forwards``."""

    name: str
    step: Callable[[], Any]  # one timed forward
    scope: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext
    prepare: bool = True  # restore per-step state before each forward (not for graph replays)
    keep: Any = None  # what a captured graph reads and writes, kept alive while it replays


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
              graphed: Patch | None = None, compiled: KernelTable | Patch | None = None,
              projected: float, reps: int = 20, warmup: int = 3) -> E2eResult:
    """Time the model in each of ``modes``, interleaved rep by rep, and compare each output with
    eager's. kforge's kernels come from ``patched`` run eagerly, ``graphed`` (default: patched)
    in CUDA graphs, ``compiled`` (default: graphed) through the compile backend."""
    graphed = graphed or patched
    compiled = compiled or graphed
    reference, difference, report = _first_runs(loaded, patched)
    results = {m.id: Measured(m.label, mode=m.id) for m in modes}
    subjects: list[Subject] = []
    notes: list[str] = []
    with torch._dynamo.config.patch(recompile_limit=64):  # one compile per compiled mode
        for mode in modes:
            measured = results[mode.id]
            kernels = compiled if mode.compile else graphed if mode.graphs else patched
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always", KforgeWarning)
                subject = _subject(loaded, mode, kernels, measured, reference, warmup)
            notes += [f"{mode.label}: {w.message}" for w in caught
                      if issubclass(w.category, KforgeWarning)]
            if mode.kforge and not mode.graphs and not mode.compile:
                measured.difference = difference
                measured.kernels = f"{report.hits} calls"
            if subject is not None:
                subjects.append(subject)
        timings = time_forwards(loaded, subjects, reps, warmup)
    for mode in modes:
        results[mode.id].timing = timings.get(mode.label)
    return E2eResult([results[m.id] for m in modes], report, projected, notes=notes)


def _subject(loaded: LoadedModel, mode: Mode, kernels: KernelTable | Patch, measured: Measured,
             reference: Any, warmup: int) -> Subject | None:
    """How to run one forward in ``mode`` (compiled or captured first); None, with the error
    in ``measured``, where the mode fails for this model."""
    try:
        if mode.compile is not None:
            return _compiled(loaded, mode, kernels, measured, reference, warmup)
        patch = kernels if isinstance(kernels, Patch) else Patch(kernels)
        scope = (lambda: patch) if mode.kforge else contextlib.nullcontext
        subject = Subject(mode.label, loaded.step, scope)
        if not mode.graphs:
            return subject
        if mode.kforge:
            patch.table.reset_counts()
        graphed = _graphed(loaded, subject, measured, reference)
        if mode.kforge:
            measured.kernels = f"{patch.report().hits} captured"
        return graphed
    except Exception as exc:  # Dynamo, Inductor or graph capture gave up on this model
        what = "torch.compile" if mode.compile else "CUDA graph capture"
        measured.error = f"{what} failed: {type(exc).__name__}: {first_line(exc)}"
        return None


def _sync(loaded: LoadedModel) -> None:
    if loaded.device.type == "cuda":
        torch.cuda.synchronize(loaded.device)


def _compiled(loaded: LoadedModel, mode: Mode, kernels: KernelTable | Patch, measured: Measured,
              reference: Any, warmup: int) -> Subject:
    """torch.compile of the model in ``mode`` (through kforge's backend for a kforge mode),
    compiled by its first forward (timed apart)."""
    from torch._inductor import list_mode_options

    from kforge.integrate.backend import backend

    assert mode.compile is not None
    chosen = backend(kernels, mode=mode.compile) if mode.kforge else None
    model = (torch.compile(loaded.model, backend=chosen) if chosen is not None
             else torch.compile(loaded.model, mode=mode.compile))
    replays = bool(list_mode_options(mode.compile).get("triton.cudagraphs"))

    def step() -> Any:
        if replays:  # each call is a new step: earlier outputs may be overwritten
            torch.compiler.cudagraph_mark_step_begin()
        with torch.no_grad():
            return model(*loaded.args, **loaded.kwargs)

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
        measured.kernels = f"{chosen.report.nodes} nodes"
    return Subject(mode.label, step)


def _graphed(loaded: LoadedModel, subject: Subject, measured: Measured,
             reference: Any) -> Subject:
    """Capture one forward of ``subject`` in a CUDA graph; the subject then replays it."""

    def prepare() -> list[torch.Tensor]:
        loaded.prepare()
        return reachable_tensors((loaded.args, loaded.kwargs))  # alive for every replay

    captured = capture(subject.step, loaded.device, prepare=prepare, scope=subject.scope)
    measured.setup_s = captured.setup_s
    if reference is not None:  # for eager: is the graph faithful?
        measured.difference = output_difference(reference, captured.outputs)
    return Subject(subject.name, captured.graph.replay, prepare=False, keep=captured)


def measure_session(patch: SessionPatch, loaded: LoadedModel, modes: list[Mode], *,
                    select: bool = True, reps: int = 20, warmup: int = 3) -> E2eResult:
    """Every mode of ``modes`` for a session's model, ``patch`` holding all its winners: eager +
    kforge with the winners that make eager forwards faster by measurement (without ``select``:
    those projected to pay for their guard), CUDA graphs + kforge with those that make replays
    faster (without ``select``: all), the compiled modes with those that make the compiled
    model faster (``choose_compiled``; without ``select``: all of them) through the backend.
    Notes say which winners each kforge mode left out, and why."""
    from kforge.integrate.patching import (
        projected_patch,
        select_measured,
        unused_message,
    )

    patch = patch.for_model(loaded.model)  # region kernels replace module forwards in eager
    # Every winner in place once, before minutes of timing: a forward that runs none of them is
    # another model than the session's. (After selection none may run: that is a measured result.)
    if message := unused_message(patch, compare_once(loaded, patch)[1]):
        raise KforgeError(message)
    ids = {m.id for m in modes}

    def kernels(graphs: bool) -> SessionPatch:
        if ("graphs+kforge" if graphs else "eager+kforge") not in ids:
            return patch
        if not select:
            return patch if graphs else projected_patch(patch)
        return select_measured(patch, loaded, cuda_graphs=graphs, reps=reps, warmup=warmup)

    eager, graphed = kernels(False), kernels(True)
    compiled, compile_notes = patch.table, []
    if select and any(m.compile and m.kforge for m in modes):
        compiled, selection = choose_compiled(loaded, patch, reps=reps, warmup=warmup)
        compile_notes = [f"{t.winner.label or t.winner.op}: left to Inductor, {t.reason}"
                         for t in selection.dropped]
    result = run_modes(loaded, modes, patched=eager, graphed=graphed, compiled=compiled,
                       projected=patch.projected, reps=reps, warmup=warmup)
    result.notes[:0] = [*patch.notes,
                        *(f"{MODES['eager+kforge'].label}: {n}" for n in eager.notes
                          if n not in patch.notes),
                        *(f"{MODES['graphs+kforge'].label}: {n}" for n in graphed.notes
                          if n not in patch.notes),
                        *(f"torch.compile + kforge: {n}" for n in compile_notes)]
    return result


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


def choose(loaded: LoadedModel, patch: Patch, *, cuda_graphs: bool,
           order: list[Entry] | None = None, reps: int = 20,
           warmup: int = 3) -> tuple[KernelTable, Selection[Entry]]:
    """The patch's kernels that make the whole forward faster beyond noise (``select``), run
    eagerly or (``cuda_graphs``) as CUDA graph replays; tried in ``order`` (default: the
    table's)."""
    entries = order if order is not None else list(patch.table.entries)

    def measure(subset: frozenset[Entry]) -> Timing:
        trial = patch.subset([e for e in entries if e in subset])
        subject = Subject("trial", loaded.step, lambda: trial)
        if cuda_graphs:
            subject = _graphed(loaded, subject, Measured("trial"), None)
        return time_forwards(loaded, [subject], reps, warmup)["trial"]

    selection = select(entries, measure)
    patch.table.reset_counts()  # the trials ran the kernels; what counts is what runs next
    return KernelTable(selection.kept), selection


SELECT_MODE = "compile+kforge"  # compiled trials cost a compile each: the quickest mode
MAX_COMPILED_TRIALS = 6


def choose_compiled(loaded: LoadedModel, patch: SessionPatch, *, reps: int = 20,
                    warmup: int = 3, trials: int = MAX_COMPILED_TRIALS
                    ) -> tuple[KernelTable, Selection[Entry]]:
    """The patch's kernels that make the *compiled* model faster beyond noise: a kernel takes
    its op (or region) out of Inductor's fusions, so it must beat them in the model, not eager.
    Candidates are the winners whose kernel beats the card's compiled baseline (or that have
    none), the largest savings first, at most ``trials`` of them; each is tried by compiling the
    model (torch.compile's default mode) with the kernels kept so far and it, against the model
    compiled without them."""
    candidates = by_compiled_saving(patch)[:trials]
    mode = MODES[SELECT_MODE]

    def measure(subset: frozenset[Entry]) -> Timing:
        torch._dynamo.reset()  # each trial compiles afresh
        trial = KernelTable([e for e in candidates if e in subset])
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", KforgeWarning)
            subject = _compiled(loaded, mode, trial, Measured("trial"), None, warmup)
        return time_forwards(loaded, [subject], reps, warmup)[subject.name]

    selection = select(candidates, measure)
    torch._dynamo.reset()
    patch.table.reset_counts()
    return KernelTable(selection.kept), selection


def by_compiled_saving(patch: SessionPatch) -> list[Entry]:
    """The patch's kernels that beat the card's compiled baseline (or whose card has none), by
    the operator time they would save over Inductor's code, largest first."""
    saving: dict[str, float] = {}
    for d in patch.plan.winners:
        card = d.card
        if not d.speedup or not card.eager_us:
            continue
        kernel_us = card.eager_us / d.speedup
        against = card.compiled_us or card.eager_us
        if kernel_us < against:
            saving[card.key] = card.calls * (against - kernel_us)
    return sorted((e for e in patch.table.entries if e.key in saving),
                  key=lambda e: -saving[e.key])


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


def time_forwards(loaded: LoadedModel, subjects: list[Subject], reps: int,
                  warmup: int) -> dict[str, Timing]:
    """GPU time per forward of each subject, interleaved rep by rep (order flipped each rep)."""
    for _ in range(warmup):
        for subject in subjects:
            _one(loaded, subject)
    samples: dict[str, list[Callable[[], float]]] = {s.name: [] for s in subjects}
    for r in range(reps):
        for subject in subjects if r % 2 == 0 else reversed(subjects):
            samples[subject.name].append(_one(loaded, subject))
    _sync(loaded)
    return {name: summarize([elapsed_us() for elapsed_us in taken])
            for name, taken in samples.items() if taken}


def _one(loaded: LoadedModel, subject: Subject) -> Callable[[], float]:
    """Run one forward of ``subject``; its time in µs, read once the device is synchronized
    (GPU time between CUDA events on the stream; on the CPU, wall time)."""
    if subject.prepare:
        loaded.prepare()
    if loaded.device.type != "cuda":
        with subject.scope():
            start = time.perf_counter()
            subject.step()
            seconds = time.perf_counter() - start
        return lambda: seconds * 1e6
    begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    with subject.scope():
        begin.record()
        subject.step()
        end.record()
    return lambda: begin.elapsed_time(end) * 1e3
