"""An op card's baseline: eager PyTorch and torch.compile timed interleaved on the card's inputs
(device, host and wall time: ``kforge.runtime.timing``), the memory floor of one call, the kernels
eager launches (names and times, from torch.profiler), and whether the baseline agrees with the
model profile's GPU time per call for the variant (``profile_disagreement``). Measured once per
card; candidates are timed against eager again in their own runs.

torch.compile is timed under ``torch.compiler.set_stance("fail_on_recompile")``: a recompile (a
guard that fails) while timing is an error naming the guard, and the card keeps no compiled
figure, rather than a figure that holds compile time."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from kforge.core.argspec import checked_op
from kforge.core.candidate import Baseline, profile_disagreement
from kforge.core.gpu import GpuInfo
from kforge.core.opcard import OpCard
from kforge.core.settings import EvalSettings
from kforge.errors import KforgeError
from kforge.eval.verify.inputs import InputFactory
from kforge.eval.verify.ops import (
    admit,
    flatten_tensors,
    memory_floor_us,
    traffic_bytes,
)
from kforge.runtime.device import Runtime
from kforge.runtime.regions import region_function
from kforge.runtime.timing import time_interleaved

PROFILED_CALLS = 5  # eager calls profiled for the kernels they launch


def call_op(op: Callable[..., Any]) -> Callable[..., Any]:
    """A plain function calling ``op``, for torch.compile to trace."""

    def call(*args: Any, **kwargs: Any) -> Any:
        return op(*args, **kwargs)

    return call


def measure_baseline(card: OpCard, *, runtime: Runtime, gpu: GpuInfo,
                     samples_dir: Path | None = None,
                     settings: EvalSettings | None = None) -> Baseline:
    """Eager and torch.compile times for ``card`` (interleaved), and its memory floor. Raises
    KforgeError when the evaluator may not run the card (``admit``) or eager itself cannot run
    the card's inputs."""
    settings = settings or EvalSettings()
    admit(card, runtime)
    op = checked_op(card.op)
    with runtime.scope():
        factory = InputFactory(card, runtime.device, samples_dir, settings.max_samples)
        sets = factory.sets(settings.seeds)[:max(1, settings.timing_sets)]
        try:
            result = op(*sets[0].args, **sets[0].kwargs)
            runtime.sync()
        except Exception as exc:  # the op cannot be replayed alone: the engine skips the card
            raise KforgeError(f"eager {card.op} fails on replayed inputs: {exc}") from None
        read = traffic_bytes([b.view for b in sets[0].buffers])
        write = traffic_bytes(flatten_tensors(result))
        del result
        n = len(sets)
        subjects: dict[str, Callable[[int], Any]] = {
            "eager": lambda r: op(*sets[r % n].args, **sets[r % n].kwargs)}
        compile_s, notes = None, [f"inputs: {', '.join(s.label for s in sets)}"]
        if settings.compile_baseline:
            try:
                torch._dynamo.reset()
                # A region is compiled as its chain of aten calls, which Inductor fuses as it
                # would inside the model (its operator would stay one opaque call).
                traced = call_op(op) if card.region is None else region_function(card.region)
                compiled = torch.compile(traced, dynamic=False)
                start = time.perf_counter()
                with runtime.idle():  # Inductor's compile is host work: others may time
                    compiled(*sets[0].args, **sets[0].kwargs)
                    runtime.sync()
                compile_s = time.perf_counter() - start
                subjects["compiled"] = lambda r: compiled(*sets[r % n].args, **sets[r % n].kwargs)
            except Exception as exc:  # Inductor cannot handle every op: eager still counts
                first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
                notes.append(f"torch.compile failed: {first[:300]}")
        timings = time_subjects(subjects, runtime, settings, notes)
        kernels: list[dict] = []
        if runtime.device.type == "cuda":
            try:
                with runtime.exclusive():  # the profiler times eager's kernels
                    kernels = eager_kernels(lambda: subjects["eager"](0), runtime)
            except Exception as exc:  # the profiler is informative only: eager's time stands
                notes.append(f"eager's kernels could not be profiled: {exc}")
    profile_us = profile_us_of(card) if runtime.device.type == "cuda" else None
    base = Baseline(eager=timings["eager"], compiled=timings.get("compiled"),
                    compile_s=round(compile_s, 3) if compile_s is not None else None,
                    floor_us=memory_floor_us(read, write, gpu.bandwidth_gbs),
                    note="; ".join(notes), eager_kernels=kernels, profile_us=profile_us)
    if runtime.device.type != "cuda":
        return base
    return replace(base, profile_check=profile_disagreement(
        base.eager.device_us, profile_us, base.kernels_us, base.launches))


def profile_us_of(card: OpCard) -> float | None:
    """The GPU time of one call of the card's variant in the model's own profile."""
    if card.total_us <= 0 or card.calls <= 0:
        return None
    return card.total_us / card.calls


def time_subjects(subjects: dict[str, Callable[[int], Any]], runtime: Runtime,
                  settings: EvalSettings, notes: list[str]) -> dict:
    """Time the subjects, torch.compile's under ``fail_on_recompile``; where it recompiles,
    eager again alone, with the failing guard in ``notes``."""
    if "compiled" not in subjects:
        return time_interleaved(subjects, runtime, settings.timing).timings
    try:
        with torch.compiler.set_stance("fail_on_recompile"):
            return time_interleaved(subjects, runtime, settings.timing).timings
    except RuntimeError as exc:
        if "recompile" not in str(exc):
            raise
        notes.append("torch.compile recompiled while timed, so it has no figure: "
                     + " ".join(str(exc).split())[:400])
    eager_only = {"eager": subjects["eager"]}
    return time_interleaved(eager_only, runtime, settings.timing).timings


def eager_kernels(call: Callable[[], Any], runtime: Runtime,
                  calls: int = PROFILED_CALLS) -> list[dict]:
    """The GPU work one ``call`` launches, seen by torch.profiler: each kernel (or copy) with its
    time per call and launches per call, longest first."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    call()
    runtime.sync()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            call()
        runtime.sync()
    found: dict[str, list[float]] = {}
    for evt in prof.events():
        if evt.device_type == DeviceType.CUDA:
            found.setdefault(evt.name, []).append(evt.time_range.elapsed_us())
    ranked = sorted(found.items(), key=lambda item: -sum(item[1]))
    return [{"name": name, "us": round(sum(times) / calls, 3), "calls": len(times) / calls}
            for name, times in ranked]
