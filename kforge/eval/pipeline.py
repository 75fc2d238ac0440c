"""One evaluation, start to verdict: compile, load, verify against eager, time, check the floor.

Device-agnostic: a ``Runtime`` (GPU or CPU) and a ``KernelLoader`` (NVRTC + cuda.core, or Python
stand-ins in tests) are passed in. The worker process and ``kforge.eval.local`` call it.

Verification, per input set (captured samples first, then fresh random sets):
1. the candidate runs twice, its fresh allocations poisoned with a different value each time;
   after each run its inputs (and the canaries around them) must be untouched;
2. eager PyTorch runs on a copy of the inputs, *after* the candidate, so no reference result
   exists anywhere while the candidate runs;
3. both runs must match eager (layout, NaN/Inf positions, tolerances, error norm) and each other.
On the first set the inputs then get new values at the same addresses and the candidate must
follow (no caching by address). After timing, a last poisoned run on fresh inputs must pass too,
so a candidate cannot behave one way while verified and another while timed.
"""

from __future__ import annotations

import contextlib
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Protocol

import torch

from kforge.core.argspec import resolve_op
from kforge.core.candidate import Baseline, Candidate, EvalOutcome, EvalStatus, Timing
from kforge.core.gpu import GpuInfo
from kforge.core.opcard import OpCard
from kforge.errors import KforgeError
from kforge.eval.compare import (
    Meta,
    ValueReport,
    compare_structure,
    compare_values,
    layout_problem,
    tolerance_for,
)
from kforge.eval.device import Runtime
from kforge.eval.guard import POISON_A, POISON_B, LauncherGuard, Poison
from kforge.eval.inputs import InputFactory, InputSet
from kforge.eval.kernels import Backend, Kernels, LaunchRefused
from kforge.eval.ops import (
    beats_floor,
    flatten_tensors,
    flop_count,
    hard_floor_us,
    memory_floor_us,
    mutated_values,
    traffic_bytes,
)
from kforge.eval.sandbox import Integrity, Launcher, LauncherSourceError, Violation
from kforge.eval.timing import TimingPlan, time_interleaved
from kforge.runtime.nvrtc import CompileResult

# Seeds of the two extra input sets: new values at the same addresses, and the check after timing.
ADDRESS_SEED = 1_000_001
RECHECK_SEED = 1_000_003


@dataclass(frozen=True)
class EvalSettings:
    seeds: tuple[int, ...] = (1, 2, 3)
    max_samples: int = 2
    timing_sets: int = 3
    timing: TimingPlan = field(default_factory=TimingPlan)
    compile_baseline: bool = True

    @classmethod
    def from_dict(cls, data: dict | None) -> EvalSettings:
        data = dict(data or {})
        plan_keys = {f.name for f in fields(TimingPlan)}
        plan = TimingPlan(**{k: data.pop(k) for k in list(data) if k in plan_keys})
        known = {f.name for f in fields(cls)} - {"timing"}
        values = {k: v for k, v in data.items() if k in known}
        if "seeds" in values:
            values["seeds"] = tuple(int(s) for s in values["seeds"])
        return cls(**values, timing=plan)


class KernelLoader(Protocol):
    def compile(self, candidate: Candidate) -> CompileResult: ...

    def load(self, compiled: CompileResult) -> Backend: ...


class Verdict(Exception):
    """An evaluation decided before its end."""

    def __init__(self, status: EvalStatus, summary: str, **details: Any) -> None:
        super().__init__(summary)
        self.status = status
        self.summary = summary
        self.details = details


# ----- results as the checks see them -----


@dataclass
class Observed:
    """One call's results: its return value, and the tensors to compare (returned tensors, then
    the arguments the op writes) with their layouts and the input each one aliases."""

    returned: Any
    tensors: list[torch.Tensor]
    metas: list[Meta]
    aliases: list[int | None]


def aliased_buffer(t: torch.Tensor, inputs: InputSet) -> int | None:
    """Index of the input buffer whose memory ``t`` lies in, if any."""
    if t.numel() == 0:
        return None
    ptr = t.data_ptr()
    for i, buf in enumerate(inputs.buffers):
        start = buf.base.data_ptr()
        if start <= ptr < start + buf.base.numel() * buf.base.element_size():
            return i
    return None


def plain_problem(t: Any) -> str | None:
    """Why a returned value is not a plain tensor with storage (a lazy subclass, a meta tensor)."""
    if type(t) is not torch.Tensor:
        return f"is a {type(t).__name__}, not a plain torch.Tensor"
    if t.device.type == "meta":
        return "is a meta tensor with no data"
    try:
        t.untyped_storage()
    except (RuntimeError, NotImplementedError):
        return "has no storage"
    return None


def observe(returned: Any, inputs: InputSet, written: list[int], candidate: bool) -> Observed:
    tensors, metas, aliases = [], [], []
    for i, t in enumerate(flatten_tensors(returned)):
        if candidate and (problem := plain_problem(t)):
            raise Verdict(EvalStatus.CHEAT, f"returned tensor {i} {problem}")
        alias = aliased_buffer(t, inputs)
        tensors.append(t.clone() if alias is not None else t)
        metas.append(Meta.of(t))
        aliases.append(alias)
    for i in written:
        view = inputs.buffers[i].view
        tensors.append(view.clone())
        metas.append(Meta.of(view))
        aliases.append(i)
    return Observed(returned, tensors, metas, aliases)


def compare_observed(out: Observed, ref: Observed, label: str) -> list[ValueReport]:
    """Check ``out`` against eager's ``ref``; raise a MISMATCH verdict at the first difference."""
    if problem := compare_structure(out.returned, ref.returned):
        raise Verdict(EvalStatus.MISMATCH, f"{label}: {problem}")
    reports = []
    for i, (o, r) in enumerate(zip(out.tensors, ref.tensors)):
        what = f"{label}, result {i}"
        if out.aliases[i] != ref.aliases[i]:
            theirs = ("a new tensor" if ref.aliases[i] is None
                      else f"tensor argument {ref.aliases[i]} itself")
            raise Verdict(EvalStatus.MISMATCH, f"{what}: eager returns {theirs}, the candidate "
                          + ("a new tensor" if out.aliases[i] is None
                             else f"memory of tensor argument {out.aliases[i]}"))
        if problem := layout_problem(out.metas[i], ref.metas[i]):
            raise Verdict(EvalStatus.MISMATCH, f"{what} {problem}")
        report = compare_values(o, r)
        if not report.ok:
            raise Verdict(EvalStatus.MISMATCH, f"{what}: {report.reason}", report=report.to_dict())
        reports.append(report)
    return reports


def same_bytes(x: torch.Tensor, y: torch.Tensor) -> bool:
    """Bitwise equality (NaN equals the same NaN)."""
    if x.shape != y.shape or x.dtype != y.dtype:
        return False
    return torch.equal(x.contiguous().reshape(-1).view(torch.uint8),
                       y.contiguous().reshape(-1).view(torch.uint8))


def bitwise_equal(a: Observed, b: Observed) -> bool:
    return len(a.tensors) == len(b.tensors) and all(
        same_bytes(x, y) for x, y in zip(a.tensors, b.tensors))


def written_buffers(op_name: str, inputs: InputSet) -> list[int]:
    """Indices of the input buffers the op writes in place (``self`` of add_, ``out=``)."""
    index = {id(b.view): i for i, b in enumerate(inputs.buffers)}
    values = mutated_values(op_name, inputs.args, inputs.kwargs)
    return [index[id(t)] for t in flatten_tensors(values) if id(t) in index]


# ----- running the candidate -----


class CandidateRunner:
    """Calls the launcher as the op would be called. ``call`` runs it under every run-time check
    (verification); ``timed`` runs it as integration will, with the checks that cost nothing on
    the hot path (the launcher cannot tell the two apart: it keeps no state and cannot read
    values), and ``check_process`` looks for what a timed call may have left behind."""

    def __init__(self, launcher: Launcher, backend: Backend, runtime: Runtime) -> None:
        self.launcher = launcher
        self.runtime = runtime
        self.kernels = Kernels(backend, runtime.device, runtime.stream_problem)
        self.integrity = Integrity()
        self.launches = 0

    def call(self, inputs: InputSet, poison: Poison | None) -> Any:
        threads = set(threading.enumerate())
        guard = LauncherGuard(poison)
        result = self._run(inputs, guard)
        self.check_process(threads)
        return result

    def timed(self, inputs: InputSet) -> Any:
        return self._run(inputs, None)

    def _run(self, inputs: InputSet, guard: LauncherGuard | None) -> Any:
        namespace_seen = len(self.launcher.namespace.violations)
        kernel_seen = len(self.kernels._recorded_violations())
        self.kernels._reset()
        error: BaseException | None = None
        result = None
        try:
            launch = self.launcher.fresh()
            with guard if guard is not None else contextlib.nullcontext():
                result = launch(self.kernels, *inputs.args, **inputs.kwargs)
        except Violation:
            pass  # recorded where it was raised
        except Exception as exc:  # the launcher's own bug: its traceback is the repair hint
            error = exc
        violations = ((guard.violations if guard is not None else [])
                      + self.launcher.namespace.violations[namespace_seen:]
                      + self.kernels._recorded_violations()[kernel_seen:])
        if cheats := [v for v in violations if v.kind == "cheat"]:
            raise Verdict(EvalStatus.CHEAT, str(cheats[0]))
        if violations:
            raise Verdict(EvalStatus.LAUNCH_ERROR, str(violations[0]))
        if error is not None:
            if not self.runtime.alive():
                raise Verdict(EvalStatus.CRASH, "the GPU context died during the launcher: "
                              f"{error}", restart=True)
            raise Verdict(EvalStatus.LAUNCH_ERROR, launcher_error(error))
        self.launches = self.kernels._launches()
        if self.launches == 0:
            raise Verdict(EvalStatus.CHEAT, "the launcher launched none of the candidate's kernels")
        return result

    def check_process(self, threads_before: set[threading.Thread]) -> None:
        """Timers and checks untouched, no threads left behind."""
        if tampered := self.integrity.tampered():
            raise Verdict(EvalStatus.CHEAT, f"launcher replaced {', '.join(tampered)}",
                          restart=True)
        if started := [t.name for t in set(threading.enumerate()) - threads_before]:
            raise Verdict(EvalStatus.CHEAT, f"launcher left threads running: {', '.join(started)}",
                          restart=True)


def launcher_error(exc: BaseException) -> str:
    """The exception and the launcher line it came from."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if f.filename == "launcher.py"]
    where = f" (launcher line {frames[-1].lineno}: {frames[-1].line})" if frames else ""
    if isinstance(exc, (LaunchRefused, LauncherSourceError)):
        return f"{exc}{where}"
    return f"launcher raised {type(exc).__name__}: {exc}{where}"


# ----- one evaluation -----


class Evaluation:
    """Verification and timing of one loaded candidate on one card."""

    def __init__(self, card: OpCard, runner: CandidateRunner, runtime: Runtime, gpu: GpuInfo,
                 samples_dir: Path | None, settings: EvalSettings) -> None:
        self.card = card
        self.op = resolve_op(card.op)
        self.runner = runner
        self.runtime = runtime
        self.gpu = gpu
        self.settings = settings
        self.factory = InputFactory(card, runtime.device, samples_dir, settings.max_samples)
        self.written: list[int] = []

    def wait(self, what: str) -> None:
        """Let the GPU finish; a fault there is a crash of the candidate's kernels."""
        try:
            self.runtime.sync()
        except Exception as exc:  # torch raises its AcceleratorError/RuntimeError
            if not self.runtime.alive():
                raise Verdict(EvalStatus.CRASH, f"a kernel crashed during {what}: {exc}",
                              restart=True) from None
            raise Verdict(EvalStatus.LAUNCH_ERROR, f"the GPU reported an error during {what}: "
                          f"{exc}") from None

    def run_candidate(self, inputs: InputSet, poison: Poison, what: str) -> Observed:
        result = self.runner.call(inputs, poison)
        self.wait(what)
        if changed := inputs.changed(set(self.written)):
            inside = [c for c in changed if not c.startswith("the memory around")]
            if inside:
                raise Verdict(EvalStatus.CHEAT, f"{what}: the candidate modified its inputs "
                              f"({', '.join(inside)})")
            raise Verdict(EvalStatus.MISMATCH, f"{what}: the candidate wrote out of bounds, into "
                          f"{', '.join(changed)}")
        observed = observe(result, inputs, self.written, candidate=True)
        inputs.restore(self.written)
        return observed

    def reference(self, inputs: InputSet) -> Observed:
        copy = inputs.fresh_copy()
        try:
            result = self.op(*copy.args, **copy.kwargs)
            self.runtime.sync()
        except Exception as exc:  # eager itself cannot run these inputs: not the candidate's fault
            raise Verdict(EvalStatus.INFRA, f"eager {self.card.op} failed on {inputs.label}: "
                          f"{exc}") from None
        return observe(result, copy, self.written, candidate=False)

    def verify(self, inputs: InputSet, address_check: bool = False) -> dict:
        label = inputs.label
        first = self.run_candidate(inputs, POISON_A, f"{label}, run 1")
        second = self.run_candidate(inputs, POISON_B, f"{label}, run 2")
        ref = self.reference(inputs)
        reports = compare_observed(first, ref, f"{label}, run 1")
        compare_observed(second, ref, f"{label}, run 2")
        for i, (a, b) in enumerate(zip(first.tensors, second.tensors)):
            agree = compare_values(b, a, tolerance_for(a.dtype))
            if not agree.ok:
                raise Verdict(EvalStatus.MISMATCH, f"{label}: two runs on the same inputs disagree "
                              f"on result {i} (a race?): {agree.reason}")
        entry = {"inputs": label, "max_abs": max((r.max_abs for r in reports), default=0.0),
                 "rel_norm": max((r.rel_norm for r in reports), default=0.0),
                 "deterministic": bitwise_equal(first, second)}
        if address_check:
            self.check_new_values_same_addresses(inputs, first)
            entry["address_check"] = True
        return entry

    def check_new_values_same_addresses(self, inputs: InputSet, before: Observed) -> None:
        inputs.load_values_from(self.factory.random_set(ADDRESS_SEED))
        label = f"{inputs.label} with new values at the same addresses"
        after = self.run_candidate(inputs, POISON_A, label)
        ref = self.reference(inputs)
        try:
            compare_observed(after, ref, label)
        except Verdict:
            if bitwise_equal(after, before):
                raise Verdict(EvalStatus.CHEAT, f"{label}: the candidate returned its previous "
                              "result (results cached by address?)") from None
            raise

    def run(self) -> tuple[dict, Timing, Timing, dict]:
        sets = self.factory.sets(self.settings.seeds)
        if not sets:
            raise Verdict(EvalStatus.INFRA, "no input sets: give seeds or samples")
        self.written = written_buffers(self.card.op, sets[0])
        checked = [self.verify(s, address_check=(i == 0)) for i, s in enumerate(sets)]
        candidate, eager, work, out_dtypes = self.time_against_eager(self.timing_sets(sets))
        del sets  # the last check needs only a fresh set
        recheck = self.verify(self.factory.random_set(RECHECK_SEED))
        correctness = {"sets": checked, "after_timing": recheck,
                       "tolerances": {str(d).removeprefix("torch."): vars(tol)
                                      for d in out_dtypes if (tol := tolerance_for(d))}}
        return correctness, candidate, eager, work

    def time_against_eager(self, timed: list[InputSet]
                           ) -> tuple[Timing, Timing, dict, set[torch.dtype]]:
        """Candidate and eager timed interleaved; then the floor and the last timed result."""
        op = self.op
        threads = set(threading.enumerate())
        run = time_interleaved(
            {"candidate": lambda i: self.runner.timed(timed[i]),
             "eager": lambda i: op(*timed[i].args, **timed[i].kwargs)},
            len(timed), self.runtime, self.settings.timing)
        self.wait("timing")
        self.runner.check_process(threads)
        work, out_dtypes = self.work(timed[0])
        candidate, eager = run.timings["candidate"], run.timings["eager"]
        if beats_floor(candidate.median_us, eager.median_us, work["hard_floor_us"]):
            raise Verdict(EvalStatus.CHEAT, f"timed at {candidate.median_us:.1f} us, below the "
                          f"physical floor of {work['hard_floor_us']:.1f} us for the bytes this op "
                          "must move: work done elsewhere or skipped when timed")
        self.check_timed_result(timed, *run.last["candidate"])
        return candidate, eager, work, out_dtypes

    def check_timed_result(self, timed: list[InputSet], index: int, result: Any) -> None:
        """The last timed call's result must be right too. Inputs rotate while timing, so a
        kernel that skipped its work leaves another set's result in a recycled buffer. (In-place
        ops changed their inputs while timed: nothing to compare with.)"""
        if self.written or len(timed) < 2:
            return
        inputs = timed[index]
        observed = observe(result, inputs, self.written, candidate=True)
        try:
            compare_observed(observed, self.reference(inputs), f"timed call on {inputs.label}")
        except Verdict as v:
            raise Verdict(EvalStatus.CHEAT, f"{v.summary}: the candidate computes otherwise when "
                          "timed") from None

    def timing_sets(self, sets: list[InputSet]) -> list[InputSet]:
        """A few sets to rotate while timing, as many as memory comfortably allows."""
        per_set = max(sets[0].nbytes(), 1)
        fit = max(1, int(self.runtime.free_bytes() // (8 * per_set)))
        return sets[:max(1, min(self.settings.timing_sets, fit, len(sets)))]

    def work(self, inputs: InputSet) -> tuple[dict, set[torch.dtype]]:
        """Bytes moved, FLOPs and the floors of one call (from eager's results), and the dtypes
        of its results."""
        ref = self.reference(inputs)
        fresh = [t for t, alias in zip(ref.tensors, ref.aliases) if alias is None]
        read = traffic_bytes([b.view for b in inputs.buffers])
        write = traffic_bytes(fresh + [inputs.buffers[i].view for i in self.written])
        bandwidth = self.gpu.bandwidth_gbs
        l2 = int(self.gpu.l2_mb * (1 << 20))
        work = {"read_bytes": read, "write_bytes": write,
                "floor_us": memory_floor_us(read, write, bandwidth),
                "hard_floor_us": hard_floor_us(read, write, bandwidth, l2),
                "flops": flop_count(self.card.op, inputs.args, ref.tensors)}
        return work, {t.dtype for t in ref.tensors}


def outcome_from(status: EvalStatus, summary: str, started: float, compiled: CompileResult | None,
                 **fields_: Any) -> EvalOutcome:
    extra = dict(fields_.pop("extra", {}))
    if compiled is not None:
        extra.update({"compile_s": round(compiled.seconds, 4), "compile_cached": compiled.cached,
                      "registers": {k: v.registers for k, v in compiled.resources.items()},
                      "spills": compiled.spills})
    return EvalOutcome(status=status, summary=summary[:2000],
                       compile_log=compiled.log if compiled is not None else "",
                       wall_s=round(time.perf_counter() - started, 4), extra=extra, **fields_)


def evaluate_candidate(card: OpCard, candidate: Candidate, *, runtime: Runtime,
                       loader: KernelLoader, gpu: GpuInfo, samples_dir: Path | None = None,
                       settings: EvalSettings | None = None) -> EvalOutcome:
    """The full verdict on ``candidate`` for ``card``. Never raises for a bad candidate."""
    settings = settings or EvalSettings()
    started = time.perf_counter()
    compiled: CompileResult | None = None
    try:
        compiled = loader.compile(candidate)
        if not compiled.ok:
            first = next((ln for ln in compiled.log.splitlines() if "error" in ln),
                         compiled.log.splitlines()[0] if compiled.log else "no log")
            return outcome_from(EvalStatus.COMPILE_ERROR, f"NVRTC: {first.strip()}", started,
                                compiled)
        try:
            launcher = Launcher(candidate.launcher)
        except LauncherSourceError as exc:
            raise Verdict(EvalStatus.LAUNCH_ERROR, str(exc)) from None
        except Violation as exc:
            raise Verdict(EvalStatus.CHEAT, str(exc)) from None
        backend = loader.load(compiled)
        with runtime.scope():
            runner = CandidateRunner(launcher, backend, runtime)
            evaluation = Evaluation(card, runner, runtime, gpu, samples_dir, settings)
            correctness, timing, eager, work = evaluation.run()
    except Verdict as v:
        return outcome_from(v.status, v.summary, started, compiled, extra=dict(v.details))
    except KforgeError as exc:
        return outcome_from(EvalStatus.INFRA, str(exc), started, compiled)
    except Exception as exc:  # our own failure, or a GPU fault that surfaced in our code
        if not runtime.alive():
            return outcome_from(EvalStatus.CRASH, f"the GPU context died: {exc}", started, compiled,
                                extra={"restart": True})
        return outcome_from(EvalStatus.INFRA, f"evaluator error: {type(exc).__name__}: {exc}",
                            started, compiled, extra={"traceback": traceback.format_exc()[-4000:]})
    speedup = eager.median_us / timing.median_us if timing.median_us > 0 else None
    moved = work["read_bytes"] + work["write_bytes"]
    extra = {"launches": runner.launches, "device": str(runtime.device), **work}
    if work["flops"]:
        extra["tflops"] = work["flops"] / (timing.median_us * 1e6)
    floor = work["floor_us"]
    return outcome_from(
        EvalStatus.OK,
        f"{speedup:.2f}x eager ({timing.median_us:.1f} us vs {eager.median_us:.1f} us)"
        if speedup else "ok", started, compiled,
        correctness=correctness, timing=timing, eager=eager, speedup=speedup,
        bandwidth_gbs=moved / (timing.median_us * 1e3) if timing.median_us > 0 else None,
        floor_fraction=floor / timing.median_us if floor and timing.median_us > 0 else None,
        extra=extra)


def call_op(op: Callable[..., Any]) -> Callable[..., Any]:
    """A plain function calling ``op``, for torch.compile to trace."""

    def call(*args: Any, **kwargs: Any) -> Any:
        return op(*args, **kwargs)

    return call


def measure_baseline(card: OpCard, *, runtime: Runtime, gpu: GpuInfo,
                     samples_dir: Path | None = None,
                     settings: EvalSettings | None = None) -> Baseline:
    """Eager and torch.compile times for ``card`` (interleaved), and its memory floor. Raises
    KforgeError when eager itself cannot run the card's inputs."""
    settings = settings or EvalSettings()
    op = resolve_op(card.op)
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
        subjects: dict[str, Callable[[int], Any]] = {
            "eager": lambda i: op(*sets[i].args, **sets[i].kwargs)}
        compile_s, notes = None, [f"inputs: {', '.join(s.label for s in sets)}"]
        if settings.compile_baseline:
            try:
                torch._dynamo.reset()
                compiled = torch.compile(call_op(op), dynamic=False)
                start = time.perf_counter()
                compiled(*sets[0].args, **sets[0].kwargs)
                runtime.sync()
                compile_s = time.perf_counter() - start
                subjects["compiled"] = lambda i: compiled(*sets[i].args, **sets[i].kwargs)
            except Exception as exc:  # Inductor cannot handle every op: eager still counts
                first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
                notes.append(f"torch.compile failed: {first[:300]}")
        timings = time_interleaved(subjects, len(sets), runtime, settings.timing).timings
    return Baseline(eager=timings["eager"], compiled=timings.get("compiled"),
                    compile_s=round(compile_s, 3) if compile_s is not None else None,
                    floor_us=memory_floor_us(read, write, gpu.bandwidth_gbs),
                    note="; ".join(notes))
