"""Profile a loaded model into op cards: what each aten op variant costs and which library runs it.

The model runs three ways. A warm-up forward settles lazy initialisation and autotuning. Timed
forwards run under ``torch.profiler`` and a ``CallRecorder``, which wraps each aten call in a
profiler range named after its card key: the CUDA kernels launched inside a range are that call's
GPU time (on a CPU-only run, the range's CPU time is used instead). A last forward under a
``SampleRecorder`` saves the inputs of a few calls per target card, spread over the model's calls,
into the staging folder (made only then), within the byte caps of
``kforge.capture.samples``. The caller owns the staging folder: it hands it to the store with the
cards, or removes it if anything fails.
"""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch.autograd import DeviceType

from kforge.capture.classify import op_library
from kforge.capture.loader import LoadedModel, first_line
from kforge.capture.recorder import (
    RANGE_PREFIX,
    CallRecorder,
    ModuleTracker,
    SampleRecorder,
    elsewhere_note,
    unwatched_note,
)
from kforge.capture.regions import RegionPlan, TraceRecorder, region_cards, region_reads
from kforge.capture.samples import SampleBudget, spread
from kforge.capture.staging import make_staging
from kforge.core.gpu import memory_of
from kforge.core.opcard import OpCard, rank_cards
from kforge.errors import KforgeError
from kforge.runtime.regions import register_cards

Progress = Callable[[str, int, int], None]
# Kernel time outside any aten op (custom extensions, Triton) above this share earns a warning.
UNATTRIBUTED_WARN_SHARE = 0.01
TRACE_LINE_PREFIX = b"USDT:"  # torch.profiler's (kineto's) own lines on stderr


@dataclass
class Profile:
    """A profiled model: its op cards ranked, and what else the session should keep."""

    cards: list[OpCard]
    total_us: float  # operator time of one forward (GPU kernel time; CPU time on a CPU run)
    modules: dict[str, list[str]]  # card key -> module paths that issued it, in first-use order
    timing: str  # "cuda" (kernel time) or "cpu" (CPU time)
    samples_saved: int = 0
    sample_bytes: int = 0
    warnings: list[str] = field(default_factory=list)


@dataclass
class _RangeTimes:
    """Time measured inside the profiler ranges of one card key."""

    us: float = 0.0
    kernels: dict[str, float] = field(default_factory=dict)


def profile(loaded: LoadedModel, *, samples_per_card: int, staging_dir: Path,
            progress: Progress | None = None, repeats: int | None = None,
            budget: SampleBudget | None = None, regions: bool = True) -> Profile:
    """Profile ``loaded`` into op cards, and with ``regions`` region cards (one more forward
    records which tensors each call reads and writes), saving sample inputs into
    ``staging_dir`` (made as they are saved, where it is not a folder already).

    ``repeats`` timed forwards are averaged (default 3 on a GPU, 1 on the CPU).
    """
    report = progress or (lambda stage, done, total: None)
    on_gpu = loaded.device.type == "cuda"
    repeats = repeats or (3 if on_gpu else 1)

    report("warmup", 0, 1)
    _guarded(loaded, lambda: _forward(loaded, on_gpu), watched=False)
    report("warmup", 1, 1)

    recorder, times, unattributed_us = _timed_passes(loaded, on_gpu, repeats, report)
    cards = _cards(recorder, times, repeats)
    unwatched = unwatched_note({name: max(1, round(calls / repeats))
                                for name, calls in recorder.unwatched.items()})
    if not cards:
        raise KforgeError(f"{loaded.name} ran no operator on {loaded.device}: "
                          + (unwatched if unwatched else "its forward returned without calling "
                             "any, so there is nothing to profile"))
    total_us = sum(card.total_us for card in cards)
    cards = [c.with_(share=c.total_us / total_us if total_us else 0.0) for c in cards]
    found = _regions(loaded, on_gpu, cards, total_us, report) if regions else None
    result = Profile(
        cards=rank_cards(cards + (found.cards if found else [])),
        total_us=total_us, timing="cuda" if on_gpu else "cpu",
        modules={key: list(paths) for key, paths in recorder.modules.items()})
    if found:
        result.modules.update(found.modules)
    left_out = found.unmatched if found else 0
    changed = left_out and (
        f"{left_out} fusion region{'s were' if left_out > 1 else ' was'} left out: the forward "
        "that found them ran op variants the timed forwards did not (shapes that change from "
        "one forward to the next); op cards describe the timed forwards")
    for note in (unwatched, elsewhere_note(recorder.tracker.elsewhere), changed):
        if note:
            result.warnings.append(note)
    if not on_gpu:
        result.warnings.append("profiled on the CPU: times are CPU times, libraries not known")
    else:
        share = unattributed_us / max(total_us * repeats + unattributed_us, 1e-9)
        if share > UNATTRIBUTED_WARN_SHARE:
            result.warnings.append(f"{share:.0%} of GPU time ran in kernels launched outside "
                                   "aten ops (custom extensions or Triton); they have no op card")
    if samples_per_card > 0:
        _save_samples(loaded, on_gpu, result, samples_per_card, staging_dir,
                      budget or SampleBudget(), report, found)
    return result


def _regions(loaded: LoadedModel, on_gpu: bool, cards: list[OpCard], total_us: float,
             report: Progress) -> RegionPlan:
    """The region cards of one recorded forward."""
    report("regions", 0, 1)
    tracker = ModuleTracker(loaded.model)
    recorder = TraceRecorder(tracker)

    def traced() -> None:
        loaded.prepare()
        with tracker, recorder:
            loaded.step()
        if on_gpu:
            torch.cuda.synchronize(loaded.device)

    _guarded(loaded, traced)
    found = region_cards(recorder.trace, cards, total_us, recorder.forwards)
    register_cards(found.cards)  # their operators, for the samples' and the search's use
    report("regions", 1, 1)
    return found


def _timed_passes(loaded: LoadedModel, on_gpu: bool, repeats: int, report: Progress
                  ) -> tuple[CallRecorder, dict[str, _RangeTimes], float]:
    """Run ``repeats`` profiled forwards; the recorder, time per card key, unattributed time."""
    tracker = ModuleTracker(loaded.model)
    recorder = CallRecorder(tracker)
    times: dict[str, _RangeTimes] = {}
    unattributed_us = 0.0
    for done in range(repeats):
        report("profile", done, repeats)
        prof = _guarded(loaded, lambda: _timed_forward(loaded, on_gpu, tracker, recorder))
        unattributed_us += _collect(prof.events(), on_gpu, times)
    report("profile", repeats, repeats)
    return recorder, times, unattributed_us


def _save_samples(loaded: LoadedModel, on_gpu: bool, result: Profile, per_card: int,
                  staging_dir: Path, budget: SampleBudget, report: Progress,
                  regions: RegionPlan | None) -> None:
    """Save up to ``per_card`` inputs of each target card, spread over its calls (a region's
    inputs where its instances first read them)."""
    plan = {c.key: spread(c.calls, per_card) for c in result.cards
            if c.target and c.region is None}
    reads = region_reads(regions, per_card) if regions else {}
    if not plan and not reads:
        return
    total_calls = sum(c.calls for c in result.cards if c.region is None)
    report("samples", 0, total_calls)
    if staging_dir.is_symlink() or not staging_dir.is_dir():
        make_staging(staging_dir)  # only now: a profile killed before leaves no folder
    sampler = SampleRecorder(plan, staging_dir, budget, on_progress=lambda passed: report(
        "samples", min(passed, total_calls), total_calls), region_reads=reads)
    _guarded(loaded, lambda: _sampled_forward(loaded, on_gpu, sampler))
    report("samples", total_calls, total_calls)
    result.samples_saved = sum(sampler.saved.values())
    result.sample_bytes = budget.used
    if budget.tensors_left_out:
        result.warnings.append(f"{budget.tensors_left_out} sample tensors were over the byte caps "
                               "and not saved; the evaluator fills those with random values")


def _forward(loaded: LoadedModel, on_gpu: bool) -> None:
    loaded.run()
    if on_gpu:
        torch.cuda.synchronize(loaded.device)


def _timed_forward(loaded: LoadedModel, on_gpu: bool, tracker: ModuleTracker,
                   recorder: CallRecorder) -> torch.profiler.profile:
    loaded.prepare()
    activities = [torch.profiler.ProfilerActivity.CPU]
    if on_gpu:
        activities.append(torch.profiler.ProfilerActivity.CUDA)
        torch.cuda.synchronize(loaded.device)
    with _without_trace_lines(), torch.profiler.profile(activities=activities) as prof:
        with tracker, recorder:
            loaded.step()
        if on_gpu:
            torch.cuda.synchronize(loaded.device)
    return prof


@contextlib.contextmanager
def _without_trace_lines() -> Iterator[None]:
    """Hold back what native code writes to stderr meanwhile, then pass it on without the
    profiler's own trace lines (``USDT: ... profiler_start``), which say nothing to a user."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as held:
        os.dup2(held.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            held.seek(0)
            kept = [line for line in held if not line.startswith(TRACE_LINE_PREFIX)]
            if kept:
                with open(2, "wb", closefd=False) as native_stderr:
                    native_stderr.write(b"".join(kept))


def _sampled_forward(loaded: LoadedModel, on_gpu: bool, sampler: SampleRecorder) -> None:
    loaded.prepare()
    with sampler:
        loaded.step()
    if on_gpu:
        torch.cuda.synchronize(loaded.device)


def _guarded(loaded: LoadedModel, work: Callable[[], Any], watched: bool = True) -> Any:
    """Run ``work``, turning the ways a model fails to run into one clear KforgeError;
    ``watched``: the model runs under kforge's recorders, after a forward without them passed."""
    try:
        return work()
    except torch.OutOfMemoryError:
        torch.cuda.empty_cache()
        raise KforgeError(f"out of {memory_of(loaded.device.type)} running {loaded.name} on "
                          f"{loaded.device}: try a smaller --batch, --seq-len or --layers"
                          ) from None
    except KforgeError:
        raise
    except SystemExit as exc:
        raise KforgeError(f"{loaded.name} called sys.exit({exc.code!r}) while running") from None
    except Exception as exc:
        dtype = str(loaded.dtype).removeprefix("torch.")
        where = (" under kforge's op recorder (a torch dispatch mode; the forward before it, "
                 "without the recorder, ran)") if watched else ""
        raise KforgeError(f"{loaded.name} failed to run on {loaded.device} in {dtype}{where}: "
                          f"{type(exc).__name__}: {first_line(exc)}") from None


def _collect(events: Iterable[Any], on_gpu: bool, times: dict[str, _RangeTimes]) -> float:
    """Add each card range's time in ``events`` to ``times``; return kernel time outside them."""
    device_total = 0.0
    attributed = 0.0
    for evt in events:
        if evt.device_type == DeviceType.CUDA:
            if not evt.name.startswith(RANGE_PREFIX):  # skip the ranges' GPU-side annotations
                device_total += evt.time_range.elapsed_us()
            continue
        if evt.device_type != DeviceType.CPU or not evt.name.startswith(RANGE_PREFIX):
            continue
        entry = times.setdefault(evt.name[len(RANGE_PREFIX):], _RangeTimes())
        if on_gpu:
            for kernel, us in _kernels(evt):
                entry.kernels[kernel] = entry.kernels.get(kernel, 0.0) + us
                entry.us += us
                attributed += us
        else:
            entry.us += evt.cpu_time_total
    return max(0.0, device_total - attributed)


def _kernels(evt: Any) -> Iterable[tuple[str, float]]:
    """``(kernel name, us)`` of every device kernel launched inside ``evt``, children included."""
    for kernel in evt.kernels:
        if not kernel.name.startswith(RANGE_PREFIX):  # the range's own GPU-side annotation
            yield kernel.name, kernel.duration
    for child in evt.cpu_children:
        yield from _kernels(child)


def _cards(recorder: CallRecorder, times: dict[str, _RangeTimes], repeats: int) -> list[OpCard]:
    cards = []
    for key, spec in recorder.specs.items():
        measured = times.get(key, _RangeTimes())
        calls = max(1, round(recorder.calls[key] / repeats))
        total_us = measured.us / repeats
        cards.append(OpCard(
            op=spec.op, args=spec.args, kwargs=spec.kwargs, calls=calls, total_us=total_us,
            library=op_library(spec.op, spec.view_or_copy, measured.kernels),
            target=not (spec.view_or_copy or spec.random), eager_us=total_us / calls))
    return cards
