"""Run a model eager, patched and under torch.compile, and measure what the kernels change.

Latency is GPU time per forward between CUDA events on the model's stream (median and p10..p90
over repetitions), with the subjects interleaved repetition by repetition (the order flipping
each time) so that clock and thermal drift cancel between them. Per-step state is restored
outside the timed span (``LoadedModel.prepare``). Under CUDA graphs each subject is captured once
(the guard, if any, is active while capturing) and its replays are timed. Outputs are compared
with eager's: the largest absolute difference and the relative L2 error, worst over all output
tensors.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from kforge.capture.loader import LoadedModel, ModelOptions, first_line, load_model
from kforge.core.candidate import Timing
from kforge.eval.ops import flatten_tensors
from kforge.eval.timing import summarize
from kforge.runtime.guard import Patch
from kforge.runtime.table import Report
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


@dataclass
class Measured:
    """One way of running the model: its latency and how its output compares with eager's."""

    name: str
    timing: Timing | None = None
    difference: Difference | None = None
    setup_s: float | None = None  # torch.compile's compile time, or a graph's capture time
    error: str = ""


@dataclass
class E2eResult:
    subjects: list[Measured]
    report: Report  # what the patched model's kernels did in one forward
    projected: float  # Amdahl over operator time, from the cards' shares and speedups
    cuda_graphs: bool
    notes: list[str] = field(default_factory=list)

    def subject(self, name: str) -> Measured | None:
        return next((s for s in self.subjects if s.name == name), None)

    @property
    def measured(self) -> float | None:
        """Eager latency over patched latency (medians)."""
        eager, patched = self.subject(EAGER), self.subject(PATCHED)
        if eager and patched and eager.timing and patched.timing:
            return eager.timing.median_us / patched.timing.median_us
        return None


def rebuild_model(session: Session, device: torch.device) -> LoadedModel:
    """The session's model and inputs, built again as they were profiled, on ``device``."""
    s = session.settings
    options = ModelOptions(dtype=s.get("dtype"), device=str(device), batch=s.get("batch"),
                           seq_len=s.get("seq_len"), mode=s.get("mode"), layers=s.get("layers"))
    return load_model(session.model, options)


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


def run_e2e(loaded: LoadedModel, patch: Patch, projected: float, *, reps: int = 20,
            warmup: int = 3, cuda_graphs: bool = False, compile: bool = True) -> E2eResult:
    """Time eager, patched and (unless ``compile`` is False) torch.compile forwards."""
    reference, difference, report = _first_runs(loaded, patch)
    eager = Subject(EAGER, loaded.step)
    patched = Subject(PATCHED, loaded.step, lambda: patch)
    results = {EAGER: Measured(EAGER),
               PATCHED: Measured(PATCHED, difference=difference)}
    notes: list[str] = []
    subjects = [eager, patched]
    if cuda_graphs:
        subjects = []
        for subject in (eager, patched):
            try:
                subjects.append(_graphed(loaded, subject, results[subject.name], reference))
            except Exception as exc:  # an op that cannot be captured (a host sync, a CPU op)
                results[subject.name].error = f"CUDA graph capture failed: {first_line(exc)}"
    if compile:
        compiled = _compiled(loaded, results, reference, warmup)
        if compiled is not None:
            subjects.append(compiled)
            if cuda_graphs:
                notes.append("torch.compile runs in its default mode (no CUDA graphs)")
    timings = time_forwards(loaded, subjects, reps, warmup)
    for name, timing in timings.items():
        results[name].timing = timing
    order = [EAGER, PATCHED, COMPILED]
    return E2eResult([results[n] for n in order if n in results], report, projected,
                     cuda_graphs, notes)


def _sync(loaded: LoadedModel) -> None:
    if loaded.device.type == "cuda":
        torch.cuda.synchronize(loaded.device)


def _compiled(loaded: LoadedModel, results: dict[str, Measured], reference: Any,
              warmup: int) -> Subject | None:
    """torch.compile of the model, compiled by its first forward (timed apart)."""
    measured = results[COMPILED] = Measured(COMPILED)
    model = torch.compile(loaded.model)

    def step() -> Any:
        with torch.no_grad():
            return model(*loaded.args, **loaded.kwargs)

    try:
        start = time.perf_counter()
        loaded.prepare()
        step()
        _sync(loaded)
        measured.setup_s = time.perf_counter() - start
        for _ in range(warmup):
            loaded.prepare()
            step()
        loaded.prepare()
        measured.difference = output_difference(reference, step())
    except Exception as exc:  # Dynamo or Inductor gave up on this model
        measured.error = f"torch.compile failed: {type(exc).__name__}: {first_line(exc)}"
        return None
    return Subject(COMPILED, step)


def _graphed(loaded: LoadedModel, subject: Subject, measured: Measured,
             reference: Any) -> Subject:
    """Capture one forward of ``subject`` in a CUDA graph; the subject then replays it."""
    device = loaded.device
    start = time.perf_counter()
    side = torch.cuda.Stream(device)
    with subject.scope():
        for _ in range(2):  # warm up on a side stream, as capture needs
            loaded.prepare()
            side.wait_stream(torch.cuda.current_stream(device))
            with torch.cuda.stream(side):
                subject.step()
            torch.cuda.current_stream(device).wait_stream(side)
        loaded.prepare()
        inputs = reachable_tensors((loaded.args, loaded.kwargs))  # alive for every replay
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = subject.step()
    graph.replay()
    _sync(loaded)
    measured.setup_s = time.perf_counter() - start
    measured.difference = output_difference(reference, out)  # for eager: is the graph faithful?
    return Subject(subject.name, graph.replay, prepare=False, keep=(graph, out, inputs))


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
    samples: dict[str, list[tuple[torch.cuda.Event, torch.cuda.Event]]] = {
        s.name: [] for s in subjects}
    for r in range(reps):
        for subject in subjects if r % 2 == 0 else reversed(subjects):
            samples[subject.name].append(_one(loaded, subject))
    _sync(loaded)
    return {name: summarize([start.elapsed_time(end) * 1e3 for start, end in events])
            for name, events in samples.items() if events}


def _one(loaded: LoadedModel, subject: Subject) -> tuple[torch.cuda.Event, torch.cuda.Event]:
    if subject.prepare:
        loaded.prepare()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    with subject.scope():
        start.record()
        subject.step()
        end.record()
    return start, end
