"""One evaluation, start to verdict: compile, resolve the launch plan, verify against eager, time,
check the floor.

A candidate runs no host code of its own: its launch plan is resolved for the card's exact variant
and every call goes through kforge's ``PlanRunner``, checked or timed alike (fresh outputs filled
with the next poison pattern, an L2 flush, the plan's launches), so a kernel cannot tell a checked
call from a timed one.

Verification, per input set (captured samples, fresh random sets, then values that stress the
op's semantics, NaN, inf and -0.0 included), each set's storages and each call's new memory a
varying shift past a 512-byte boundary (production's 0 first; ``kforge.eval.verify.placement``):
1. the candidate runs twice, the second time while other work holds the device
   (``kforge.eval.verify.contention``: races between blocks); after each run its inputs (and the
   canaries around them) must be untouched;
2. eager PyTorch runs on a copy of the inputs, *after* the candidate, so no reference result
   exists anywhere while the candidate runs;
3. both runs must match eager (layout, NaN/Inf positions, tolerances or, where eager is exact,
   bits; error norm) and each other;
4. each run's error against a higher-precision reference may not exceed a small multiple of
   eager's own (``kforge.eval.verify.precision``), as for every other checked result.
On the first set the inputs then get new values at the same addresses, then a few of them change
in place, and the candidate must follow both. While timed, every call gets new input values
(rotating over buffers at different addresses), and randomly chosen timed calls are checked
against eager; after timing, a last run on fresh inputs must pass too.
"""

from __future__ import annotations

import math
import random
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Protocol

import torch

from kforge.core.argspec import checked_op, encode_call, resolve_op
from kforge.core.candidate import (
    Candidate,
    EvalOutcome,
    EvalStatus,
    Timing,
    held_reason,
)
from kforge.core.gpu import GpuInfo
from kforge.core.launch_plan import PlanError, PlanNotApplicable
from kforge.core.opcard import OpCard
from kforge.core.outcome import (
    CompileFacts,
    Confirmation,
    Correctness,
    CounterFigures,
    FailureEvidence,
    HostCost,
    Placement,
    Precision,
    SetCheck,
    Work,
)
from kforge.core.settings import EvalSettings
from kforge.errors import KforgeError
from kforge.eval.verify.compare import compare_values, tolerance_for
from kforge.eval.verify.contention import contention_for
from kforge.eval.verify.fences import FencedAllocation, Fences
from kforge.eval.verify.inputs import InputFactory, InputSet
from kforge.eval.verify.observe import (
    Observed,
    Verdict,
    bitwise_equal,
    compare_observed,
    observe,
    written_buffers,
)
from kforge.eval.verify.ops import (
    admit,
    beats_floor,
    flatten_tensors,
    flop_count,
    hard_floor_us,
    memory_floor_us,
    traffic_bytes,
)
from kforge.eval.verify.placement import PRODUCTION, Shifts, shifts_for
from kforge.eval.verify.poison import PoisonCycle
from kforge.eval.verify.precision import (
    PrecisionReport,
    eager_errors,
    judge_precision,
    precision_reference,
)
from kforge.eval.verify.stress import INDEX, card_family, exact_op, usable_stress_sets
from kforge.runtime.counters import CounterReport, measure_counters
from kforge.runtime.device import Runtime
from kforge.runtime.guard import Patch
from kforge.runtime.nvrtc import CompileResult
from kforge.runtime.plan import (
    Allocation,
    KernelLauncher,
    PlanRunner,
    check_kernels,
    check_widths,
)
from kforge.runtime.plan import resolve_for as resolve_plan
from kforge.runtime.table import Entry, KernelTable
from kforge.runtime.timing import WALL_ROUND, Subject, time_interleaved, timing_stage

# On stress values a result outside eager's tolerances still passes when it is this many times
# the precision rule's multiple as close to the float64 truth as eager is (ill-conditioned inputs
# such as zero-variance rows make honest reduction orders differ from eager's beyond them).
STRESS_LEEWAY = 8.0
# Seeds of the extra input sets: new values at the same addresses, and the check after timing.
ADDRESS_SEED = 1_000_001
RECHECK_SEED = 1_000_003
# A result of fewer elements than this has eager's error on one call as a single noisy draw: the
# precision rule also takes eager's typical error, its RMS over TYPICAL_SETS random sets from
# TYPICAL_SEED on (``judge_precision``'s ``typical``).
FEW_ELEMENTS = 64
TYPICAL_SETS = 16
TYPICAL_SEED = 1_000_005


class KernelLoader(Protocol):
    def compile(self, candidate: Candidate) -> CompileResult: ...

    def load(self, compiled: CompileResult) -> KernelLauncher: ...


# ----- calling the candidate -----


class CandidateCalls:
    """Every call of the candidate, checked or timed, made the same way: fresh outputs and
    scratch between fences (``kforge.eval.verify.fences``; not where ``fenced`` is False: under
    compute-sanitizer each buffer ends its allocation instead) filled with the next poison
    pattern, then the plan's launches."""

    def __init__(self, runner: PlanRunner, runtime: Runtime, fenced: bool = True) -> None:
        self.runner = runner
        self.runtime = runtime
        self.fenced = fenced
        self.poisons = PoisonCycle()
        self.shifts = Shifts(shifts_for(runner.plan))  # where each call's new memory starts
        plan = runner.plan
        self.labels = ([f"result {i}" for i, o in enumerate(plan.outputs) if o.kind == "new"]
                       + [f"scratch {s.name!r}" for s in plan.scratch])

    def memory(self, production: bool = False, shift: int | None = None) -> Allocation:
        """One call's fresh outputs and scratch: at ``shift``, where production's sit
        (``production``: a timed call's) or else at the next placement."""
        if self.fenced:
            if shift is None:
                shift = PRODUCTION if production else self.shifts.next()
            fences = Fences(shift)
            made = self.runner.allocate(fences.empty)
            memory: Allocation = FencedAllocation(made.outputs, made.scratch, fences, self.labels)
        else:
            memory = self.runner.allocate()
        poison = self.poisons.next()
        for t in memory.outputs:
            if t is not None:
                poison.fill(t)
        for t, spec in zip(memory.scratch, self.runner.plan.scratch):
            if not spec.zero:
                poison.fill(t)
        return memory

    def run(self, inputs: InputSet, memory: Allocation) -> Any:
        return self.runner.launch(inputs.args, inputs.kwargs, memory)

    def call(self, inputs: InputSet, contention: AbstractContextManager | None = None,
             shift: int | None = None) -> tuple[Any, Allocation]:
        """One call on fresh memory (at ``shift``, else the next placement), with other work
        competing for the device where ``contention`` is given: what it returned, and that
        memory."""
        memory = self.memory(shift=shift)
        self.runtime.flush()
        with contention or nullcontext():
            return self.run(inputs, memory), memory


@dataclass
class TimedCheck:
    """A timed call chosen for checking, as it was the moment it returned: work queued right
    after its stop event, before any later call, copying what it returned and its fences and
    comparing its input buffers (and their canaries) with the values it was given. Judged after
    timing; a kernel that fills a kept result in on a later call is judged on what it had
    written. Nothing the size of the inputs is kept but the values given (an embedding's table
    of gigabytes, kept for each of several checked calls, would not fit beside the sets)."""

    label: str
    inputs: InputSet  # its input buffers, the values it was given as their snapshot
    # the buffers right after it, against those
    differences: list[tuple[torch.Tensor, torch.Tensor]]
    fences: Allocation
    observed: Observed


class Wider:
    """The op's result on one input set's values upcast (``precision_reference``), computed
    when first needed and once."""

    def __init__(self, op: Callable[..., Any], inputs: InputSet) -> None:
        self.op = op
        self.inputs = inputs
        self.computed = False
        self.value: Any = None

    def result(self) -> Any:
        if not self.computed:
            copy = self.inputs.fresh_copy()
            self.value = precision_reference(self.op, copy.args, copy.kwargs)
            self.computed = True
        return self.value


# ----- one evaluation -----


class Evaluation:
    """Verification and timing of one loaded candidate on one card."""

    def __init__(self, card: OpCard, calls: CandidateCalls, runtime: Runtime, gpu: GpuInfo,
                 samples_dir: Path | None, settings: EvalSettings) -> None:
        self.card = card
        self.op = checked_op(card.op)
        self.calls = calls
        self.runtime = runtime
        self.gpu = gpu
        self.settings = settings
        self.factory = InputFactory(card, runtime.device, samples_dir, settings.max_samples,
                                    shifts_for(calls.runner.plan))
        self.written: list[int] = []
        self.exact = exact_op(card)
        self.typical: dict[int, tuple[float, float]] | None = None  # typical_errors, once
        self.steps_s: dict[str, float] = {}  # the seconds of each step (``step``)
        # A runtime may bring its own competing work (the CPU tests' stand-in does).
        contend = getattr(runtime, "contention", None)
        self.contention: AbstractContextManager = (contend() if callable(contend)
                                                   else contention_for(runtime.device))
        # Which timed calls are checked, what values they get and which elements a partial
        # update changes: nothing the candidate can see.
        self.chance = random.Random(random.SystemRandom().getrandbits(64))

    @contextmanager
    def step(self, name: str) -> Iterator[None]:
        """One step of the evaluation, its seconds added to ``steps_s``."""
        start = time.perf_counter()
        try:
            yield
        finally:
            self.steps_s[name] = round(self.steps_s.get(name, 0.0)
                                       + time.perf_counter() - start, 4)

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

    def launch_failed(self, exc: Exception, what: str) -> Verdict:
        if not self.runtime.alive():
            return Verdict(EvalStatus.CRASH, f"the GPU context died during {what}: {exc}",
                           restart=True)
        return Verdict(EvalStatus.LAUNCH_ERROR, f"launching the plan failed during {what}: "
                       f"{type(exc).__name__}: {exc}")

    def run_candidate(self, inputs: InputSet, what: str, contended: bool = False,
                      shift: int | None = None) -> Observed:
        try:
            result, memory = self.calls.call(inputs, self.contention if contended else None,
                                             shift)
        except Exception as exc:  # cuda.core refused a launch (bad config, too many resources)
            raise self.launch_failed(exc, what) from None
        self.wait(what)
        self.check_inputs(inputs, what)
        self.check_fences(memory, what)
        observed = observe(result, inputs, self.written, candidate=True)
        inputs.restore(self.written)
        return observed

    def check_inputs(self, inputs: InputSet, what: str,
                     differences: list[tuple[torch.Tensor, torch.Tensor]] | None = None) -> None:
        """The inputs against their snapshot (or ``differences``, taken right after a call)."""
        if changed := inputs.changed(set(self.written), differences):
            inside = [c for c in changed if not c.startswith("the memory around")]
            if inside:
                raise Verdict(EvalStatus.CHEAT, f"{what}: the candidate modified its inputs "
                              f"({', '.join(inside)})")
            raise Verdict(EvalStatus.MISMATCH, f"{what}: the candidate wrote out of bounds, into "
                          f"{', '.join(changed)}")

    def check_fences(self, memory: Allocation, what: str) -> None:
        if isinstance(memory, FencedAllocation) and (past := memory.overruns()):
            raise Verdict(EvalStatus.MISMATCH, f"{what}: the candidate wrote out of bounds, past "
                          f"the ends of {', '.join(past)}")

    def reference(self, inputs: InputSet) -> Observed:
        copy = inputs.fresh_copy()
        try:
            result = self.op(*copy.args, **copy.kwargs)
            self.runtime.sync()
        except Exception as exc:  # eager itself cannot run these inputs: not the candidate's fault
            raise Verdict(EvalStatus.INFRA, f"eager {self.card.op} failed on {inputs.label}: "
                          f"{exc}") from None
        return observe(result, copy, self.written, candidate=False)

    def verify(self, inputs: InputSet, address_check: bool = False,
               precision: bool = True) -> SetCheck:
        """Two runs on ``inputs`` (the second while other work holds the device), each judged
        against eager and, where ``precision``, by the precision rule; then they must agree.

        Both runs put their new memory at one placement: at another, a plan's ``align`` branch
        may run its scalar twin, whose honest reduction order differs from the vector kernel's
        beyond any tolerance on ill-conditioned values (a group norm's mean over millions of
        near-subnormal values). At one placement the same kernels run, and only a race (or
        another nondeterminism) makes their results differ."""
        label = inputs.label
        shift = self.calls.shifts.next()
        first = self.run_candidate(inputs, f"{label}, run 1", shift=shift)
        second = self.run_candidate(inputs, f"{label}, run 2", contended=True, shift=shift)
        ref = self.reference(inputs)
        high = Wider(self.op, inputs)
        leeway = 1.0 if precision else STRESS_LEEWAY
        reports, judged = self.judge(first, ref, inputs, f"{label}, run 1", leeway, precision,
                                     high)
        self.judge(second, ref, inputs, f"{label}, run 2", leeway, precision, high)
        for i, (a, b) in enumerate(zip(first.tensors, second.tensors)):
            agree = compare_values(b, a, tolerance_for(a.dtype))
            if not agree.ok:
                raise Verdict(EvalStatus.MISMATCH, f"{label}: two runs on the same inputs disagree "
                              f"on result {i} (a race?): {agree.reason}")
        if address_check:
            self.check_new_values_same_addresses(inputs, first)
        return SetCheck(label, max((r.max_abs for r in reports), default=0.0),
                        max((r.rel_norm for r in reports), default=0.0),
                        bitwise_equal(first, second), inputs.shift, judged, address_check)

    def judge(self, out: Observed, ref: Observed, inputs: InputSet, label: str,
              leeway: float = 1.0, rule: bool = True, high: Wider | None = None
              ) -> tuple[list, dict | None]:
        """``out`` against eager's ``ref`` (``compare``), then, where ``rule``, by the precision
        rule: its value reports and the worst precision figures (None where not judged)."""
        high = high or Wider(self.op, inputs)
        reports = self.compare(out, ref, inputs, label, leeway, high)
        return reports, self.check_precision(inputs, out, ref, label, high) if rule else None

    def compare(self, out: Observed, ref: Observed, inputs: InputSet, label: str,
                leeway: float = 1.0, high: Wider | None = None) -> list:
        """``out`` against eager's ``ref``. A returned result outside eager's tolerances still
        passes when it is as close to the float64 truth as the precision rule asks (its multiple
        times ``leeway``): on ill-conditioned values (a sum that nearly cancels, a zero-variance
        row) honest reduction orders differ from eager's beyond any fixed tolerance. Arguments
        written in place, and ops with no wider reference, are held to eager's tolerances; ops
        eager computes exactly (``exact_op``) are held to eager's bits, -0.0 apart from 0.0."""
        judged: list[PrecisionReport] | None = None
        high = high or Wider(self.op, inputs)

        def as_close_as_eager(i: int) -> str | None:
            nonlocal judged
            if judged is None:
                judged = self.against_float64(high, out, ref, leeway=leeway) or []
            if i >= len(judged):
                return ""
            report = judged[i]
            return None if report.ok else ("against float64 it is less accurate than eager: "
                                           f"{report.reason}")

        return compare_observed(out, ref, label, forgive=as_close_as_eager, exact=self.exact)

    def against_float64(self, high: Wider, out: Observed, ref: Observed,
                        leeway: float = 1.0) -> list[PrecisionReport] | None:
        """Each returned result of the candidate judged against a higher-precision reference,
        beside eager's; None where the op has no higher precision to run in."""
        wide = high.result()
        if wide is None:
            return None
        references = flatten_tensors(wide)[:len(flatten_tensors(out.returned))]
        typical = self.typical_errors() if any(r.numel() < FEW_ELEMENTS for r in references) else {}
        return [judge_precision(out.tensors[i], ref.tensors[i], reference, leeway=leeway,
                                typical=typical.get(i))
                for i, reference in enumerate(references)]

    def typical_errors(self) -> dict[int, tuple[float, float]]:
        """Eager's (norm, max) errors against the wider reference as RMS over TYPICAL_SETS random
        sets, for each returned result of fewer than FEW_ELEMENTS elements; computed once, the
        first time such a result is judged."""
        if self.typical is None:
            inputs = self.factory.random_set(TYPICAL_SEED)
            squares: dict[int, list[float]] = {}
            for j in range(TYPICAL_SETS):
                if j:
                    self.factory.refill(inputs, TYPICAL_SEED + j)
                eager = self.reference(inputs)
                wide = Wider(self.op, inputs).result()
                references = flatten_tensors(wide)[:len(flatten_tensors(eager.returned))]
                for i, reference in enumerate(references):
                    if reference.numel() < FEW_ELEMENTS:
                        figures = eager_errors(eager.tensors[i], reference)
                        if figures is not None:
                            squares.setdefault(i, []).append(figures)
            self.typical = {i: tuple(math.sqrt(sum(f[k] ** 2 for f in found) / len(found))
                                     for k in (0, 1))
                            for i, found in squares.items()}
        return self.typical

    def check_precision(self, inputs: InputSet, out: Observed, ref: Observed, label: str,
                        high: Wider) -> Precision | None:
        """The candidate's error against a higher-precision reference, next to eager's."""
        judged = self.against_float64(high, out, ref)
        if judged is None:
            return None
        worst: Precision | None = None
        for i, report in enumerate(judged):
            if not report.ok:
                raise Verdict(EvalStatus.MISMATCH, f"{label}, result {i}: {report.reason}")
            if worst is None or report.candidate_error >= worst.candidate_error:
                worst = Precision(report.candidate_error, report.eager_error, report.bound)
        return worst

    def check_new_values_same_addresses(self, inputs: InputSet, before: Observed) -> None:
        """New values at the same addresses, then part of them changed in place: the candidate
        must follow both (a result cached by address, or by address and a few sampled values,
        is stale)."""
        inputs.load_values_from(self.factory.random_set(ADDRESS_SEED))
        before = self.check_follows(inputs, before, f"{inputs.label} with new values at the same "
                                    "addresses", "results cached by address?")
        self.factory.update_part(inputs, torch.Generator().manual_seed(self.chance.getrandbits(62)))
        self.check_follows(inputs, before, f"{inputs.label} with part of its values changed in "
                           "place", "results cached by address and sampled values?")

    def check_follows(self, inputs: InputSet, before: Observed, label: str, why: str) -> Observed:
        """A run on ``inputs`` judged like any other; a wrong result equal to ``before`` is a
        cheat."""
        after = self.run_candidate(inputs, label)
        try:
            self.judge(after, self.reference(inputs), inputs, label)
        except Verdict:
            if bitwise_equal(after, before):
                raise Verdict(EvalStatus.CHEAT, f"{label}: the candidate returned its previous "
                              f"result ({why})") from None
            raise
        return after

    def run(self) -> tuple[Correctness, Timing, Timing, Work, HostCost, CounterFigures | None]:
        with self.step("inputs"):
            sets = self.factory.sets(self.settings.seeds)
        if not sets:
            raise Verdict(EvalStatus.INFRA, "no input sets: give seeds or samples")
        self.written = written_buffers(self.card.op, sets[0])
        checked: list[SetCheck] = []
        for i, inputs in enumerate(sets):
            try:
                with self.step("checks"):
                    checked.append(self.verify(inputs, address_check=(i == 0)))
            except Verdict as verdict:  # a repair is told which sets held, and how closely
                verdict.evidence = replace(verdict.evidence or FailureEvidence(),
                                           sets_passed=tuple(checked))
                raise
        # Stress values are ill-conditioned on purpose: eager's tolerances judge them, not the
        # precision rule, which holds honest half-precision kernels to eager's own error.
        with self.step("stress"):
            stress, dropped = usable_stress_sets(self.factory, self.settings.stress_seed)
            stressed = [self.verify(each, precision=False) for each in stress]
        # The timing and the counters in one exclusive hold: the other workers' checks drain once
        with self.runtime.exclusive():
            with self.step("timing"):
                candidate, eager, work, out_dtypes = self.time_against_eager(
                    self.timing_sets(sets))
            counters = self.counter_figures()
        del sets  # the last check needs only a fresh set
        fresh = self.factory.random_set(RECHECK_SEED)
        with self.step("recheck"):
            recheck = self.verify(fresh)
        with self.step("host cost"):
            host = self.host_cost(fresh)
        correctness = Correctness(
            tuple(checked), tuple(stressed), recheck,
            {str(d).removeprefix("torch."): tol
             for d in out_dtypes if (tol := tolerance_for(d))}, dropped)
        return correctness, candidate, eager, work, host, counters

    def counter_figures(self) -> CounterFigures | None:
        """The candidate's hardware counters where they are wanted and a GPU can give them."""
        if not (self.settings.counters and self.runtime.device.type == "cuda"):
            return None
        with self.step("counters"):
            return self.counters().figures()

    def counters(self) -> CounterReport:
        """Hardware counters of one call's launches, measured after the checks and the timing
        (each pass's memory is prepared and L2 flushed outside the measured launches)."""
        inputs = self.factory.random_set(RECHECK_SEED, shift=PRODUCTION)

        def prepare() -> Allocation:
            memory = self.calls.memory(production=True)
            self.runtime.flush()
            return memory

        kernels = [launch.kernel for launch in self.calls.runner.plan.launches]
        with self.runtime.exclusive():  # the counters measure the GPU as the kernel leaves it
            return measure_counters(prepare, lambda memory: self.calls.run(inputs, memory),
                                    kernels, self.runtime.sync, self.runtime.device.index or 0)

    # ----- timing -----

    def time_against_eager(self, buffers: list[InputSet]
                           ) -> tuple[Timing, Timing, dict, set[torch.dtype]]:
        """Candidate and eager timed interleaved (``kforge.runtime.timing``: device, host and wall
        time), each call on new input values; then the checked timed calls, the floor and the
        work done.

        Every timed call is prepared alike (new values, their snapshot, fresh poisoned memory),
        so nothing the candidate can see marks the calls that get checked. Which ones do is
        drawn after each call, uniformly over all timed calls however many there are (reservoir
        sampling); a drawn call's results are copied right after its stop event. The number of
        timed calls follows eager's time alone, drawn at random below it."""
        op, k = self.op, len(buffers)
        values_seed = self.chance.getrandbits(30)
        warmup, wanted = self.settings.timing.warmup, self.settings.checked_timed_calls
        checks: list[TimedCheck] = []
        timed = 0
        memory: dict[int, Allocation] = {}

        def prepare_candidate(r: int) -> None:
            inputs = buffers[r % k]
            self.factory.refill(inputs, values_seed + 2 * r)
            inputs.take_snapshot()
            if r != WALL_ROUND:
                memory[r] = self.calls.memory(production=True)

        def run_candidate(r: int) -> Any:
            inputs = buffers[r % k]
            try:
                if r == WALL_ROUND:
                    # The wall-time calls run back to back after one prepare: each makes its own
                    # memory as production's calls do, so a plan's zeroed scratch is zero at
                    # every call (a ticket counter left by the call before sends blocks past
                    # the end of their buffers).
                    return self.calls.runner(inputs.args, inputs.kwargs)
                return self.calls.run(inputs, memory[r])
            except Exception as exc:  # cuda.core refused a launch
                raise self.launch_failed(exc, "timing") from None

        def after_candidate(r: int, result: Any) -> None:
            nonlocal timed
            used = memory.pop(r, None)
            if r < warmup:
                return
            timed += 1
            slot = len(checks) if len(checks) < wanted else self.chance.randrange(timed)
            if slot >= wanted:
                return
            checks[slot:slot + 1] = [self.keep_timed_call(r, buffers[r % k], used, result)]

        def prepare_eager(r: int) -> None:
            self.factory.refill(buffers[r % k], values_seed + 2 * r + 1)

        try:
            run = time_interleaved(
                {"candidate": Subject(run_candidate, prepare_candidate, after_candidate,
                                      paces=False),
                 "eager": Subject(lambda r: op(*buffers[r % k].args, **buffers[r % k].kwargs),
                                  prepare_eager)},
                self.runtime, self.settings.timing, self.chance)
        except Verdict:
            raise
        except Exception as exc:  # a fault surfacing where the loop waits for the GPU
            if self.runtime.alive():
                raise
            raise Verdict(EvalStatus.CRASH, f"a kernel crashed during timing "
                          f"({timing_stage(exc)}): {exc}", restart=True) from None
        self.wait("timing")
        work, out_dtypes = self.work(buffers[0])
        candidate, eager = run.timings["candidate"], run.timings["eager"]
        if beats_floor(candidate.median_us, eager.median_us, work.hard_floor_us):
            raise Verdict(EvalStatus.CHEAT, f"timed at {candidate.median_us:.1f} us, below the "
                          f"physical floor of {work.hard_floor_us:.1f} us for the bytes this op "
                          "must move: work done elsewhere or skipped when timed")
        for check in checks:
            self.judge_timed_call(check)
        work = replace(work, checked_timed_calls=len(checks), timing_notes=tuple(run.notes))
        return candidate, eager, work, out_dtypes

    def keep_timed_call(self, r: int, inputs: InputSet, used: Allocation,
                        result: Any) -> TimedCheck:
        """Copies of timed call ``r`` as it returned, queued on the stream right behind it (the
        stream may be held: nothing here waits for the GPU)."""
        label = f"timed call {r}"
        # The snapshot taken before the call: the next call's prepare takes a new one.
        given = replace(inputs, label=label, snapshot=inputs.snapshot)
        differences = inputs.differences()
        fences = used
        if isinstance(used, FencedAllocation):
            fences = FencedAllocation([], [], used.fences.copy(), used.labels)
        observed = observe(result, inputs, self.written, candidate=True)
        observed.tensors[:] = [t.clone() for t in observed.tensors]
        return TimedCheck(label, given, differences, fences, observed)

    def judge_timed_call(self, check: TimedCheck) -> None:
        self.check_inputs(check.inputs, check.label, check.differences)
        self.check_fences(check.fences, check.label)
        try:
            self.judge(check.observed, self.reference(check.inputs), check.inputs, check.label)
        except Verdict as v:
            raise Verdict(EvalStatus.CHEAT, f"{v.summary}: the candidate computes otherwise "
                          "when timed") from None

    def timing_sets(self, sets: list[InputSet]) -> list[InputSet]:
        """A few sets to rotate while timing, as many as memory comfortably allows, each where
        production's tensors sit: a plan's path for aligned pointers is the one timed, as in a
        model (its timed calls' outputs sit there too); the other placements are the checks'.
        A set placed elsewhere is made again there (its values are drawn anew each call)."""
        per_set = max(sets[0].nbytes(), 1)
        fit = max(1, int(self.runtime.free_bytes() // (8 * per_set)))
        return [s if s.shift == PRODUCTION else self.factory.random_set(i, shift=PRODUCTION)
                for i, s in enumerate(sets[:max(1, min(self.settings.timing_sets, fit,
                                                       len(sets)))])]

    def host_cost(self, inputs: InputSet) -> HostCost:
        """Host time per call of the op patched with the candidate, as integration runs it (the
        guard in front of the op, the plan's allocation and launches), and of eager's call.
        Where the patched calls do not all reach the kernel (an input the guard cannot match),
        the launch path alone is timed."""
        op = self.op
        card = self.card
        guarded = resolve_op(card.op)  # the operator itself, which the guard patches

        def per_call(call: Callable[[], Any]) -> float:
            samples = []
            for _ in range(self.settings.host_reps):
                start = time.perf_counter()
                call()
                samples.append((time.perf_counter() - start) * 1e6)
                self.runtime.sync()
            samples.sort()
            return round(samples[len(samples) // 2], 2)

        runner = self.calls.runner
        # The guard matches the call as the evaluation makes it (``decode_call``: on this device,
        # a device given where the card names none), which is the entry's variant here.
        args_spec, kwargs_spec = encode_call(guarded, inputs.args, inputs.kwargs)
        entry = Entry(card.op, args_spec, kwargs_spec, runner, runner.device, label="host cost")
        with Patch(KernelTable([entry])):
            patched = per_call(lambda: guarded(*inputs.args, **inputs.kwargs))
        if entry.counts()[0] != self.settings.host_reps:
            patched = per_call(lambda: runner(inputs.args, inputs.kwargs))
        return HostCost(patched, per_call(lambda: op(*inputs.args, **inputs.kwargs)))

    def work(self, inputs: InputSet) -> tuple[Work, set[torch.dtype]]:
        """Bytes moved, FLOPs and the floors of one call (from eager's results), and the dtypes
        of its results. An index op's table (its first tensor: an embedding's weight) counts as
        read only through what the op writes: a lookup need not read the rest."""
        ref = self.reference(inputs)
        fresh = [t for t, alias in zip(ref.tensors, ref.aliases) if alias is None]
        views = [b.view for b in inputs.buffers]
        if card_family(self.card) == INDEX:  # a lookup reads only what it gathers of its table
            views = views[1:]
        read = traffic_bytes(views)
        write = traffic_bytes(fresh + [inputs.buffers[i].view for i in self.written])
        bandwidth = self.gpu.bandwidth_gbs
        l2 = int(self.gpu.l2_mb * (1 << 20))
        work = Work(read, write, memory_floor_us(read, write, bandwidth),
                    hard_floor_us(read, write, bandwidth, l2, self.gpu.peak_bandwidth_gbs),
                    flop_count(self.card.op, inputs.args, ref.tensors))
        return work, {t.dtype for t in ref.tensors}


# ----- start to verdict -----


def outcome_from(status: EvalStatus, summary: str, started: float, compiled: CompileResult | None,
                 **fields_: Any) -> EvalOutcome:
    facts = None if compiled is None else CompileFacts(
        round(compiled.seconds, 4), compiled.cached,
        {k: v.registers for k, v in compiled.resources.items()}, compiled.spills)
    return EvalOutcome(status=status, summary=summary[:2000],
                       compile_log=compiled.log if compiled is not None else "",
                       wall_s=round(time.perf_counter() - started, 4), compile=facts, **fields_)


def plan_runner(card: OpCard, candidate: Candidate, backend: KernelLauncher,
                compiled: CompileResult, device: torch.device) -> PlanRunner:
    """The candidate's plan resolved for the card and checked against the compiled kernels."""
    try:
        plan = resolve_plan(candidate.plan, card.op, card.args, card.kwargs)
        check_kernels(plan, backend.has_kernel, sorted(compiled.resources))
        check_widths(plan, backend.param_widths)
        return PlanRunner(plan, card.op, backend, device)
    except PlanNotApplicable as exc:
        raise Verdict(EvalStatus.LAUNCH_ERROR, f"the launch plan does not cover this op "
                      f"variant: {exc}") from None
    except PlanError as exc:
        raise Verdict(EvalStatus.LAUNCH_ERROR, f"launch plan: {exc}") from None


def evaluate_variant(card: OpCard, candidate: Candidate, *, runtime: Runtime,
                     loader: KernelLoader, gpu: GpuInfo, samples_dir: Path | None = None,
                     settings: EvalSettings | None = None) -> EvalOutcome:
    """The full verdict on ``candidate`` for ``card``'s one exact variant. Never raises for a
    bad candidate."""
    settings = settings or EvalSettings()
    started = time.perf_counter()
    compiled: CompileResult | None = None
    try:
        # Host work (the call sized on meta tensors, whose first use in a process imports
        # seconds of PyTorch; NVRTC): a timed section elsewhere need not wait for it
        with runtime.idle():
            admit(card, runtime)
            compiled = loader.compile(candidate)
        if not compiled.ok:
            first = next((ln for ln in compiled.log.splitlines() if "error" in ln),
                         compiled.log.splitlines()[0] if compiled.log else "no log")
            return outcome_from(EvalStatus.COMPILE_ERROR, f"NVRTC: {first.strip()}", started,
                                compiled)
        loading = time.perf_counter()
        backend = loader.load(compiled)
        runner = plan_runner(card, candidate, backend, compiled, runtime.device)
        with runtime.scope():
            calls = CandidateCalls(runner, runtime)
            evaluation = Evaluation(card, calls, runtime, gpu, samples_dir, settings)
            load_s = round(time.perf_counter() - loading, 4)
            correctness, timing, eager, work, host, counters = evaluation.run()
    except Verdict as v:
        return outcome_from(v.status, v.summary, started, compiled, restart=v.restart,
                            failure=v.evidence)
    except KforgeError as exc:
        return outcome_from(EvalStatus.INFRA, str(exc), started, compiled)
    except Exception as exc:  # our own failure, or a GPU fault that surfaced in our code
        if not runtime.alive():
            return outcome_from(EvalStatus.CRASH, f"the GPU context died: {exc}", started, compiled,
                                restart=True)
        return outcome_from(EvalStatus.INFRA, f"evaluator error: {type(exc).__name__}: {exc}",
                            started, compiled,
                            failure=FailureEvidence(traceback=traceback.format_exc()[-4000:]))
    speedup = eager.device_us / timing.device_us if timing.device_us > 0 else None
    held = held_reason(speedup)
    work = replace(work, launches=len(runner.plan.launches),
                   tflops=work.flops / (timing.median_us * 1e6) if work.flops else None)
    floor = work.floor_us
    return outcome_from(
        EvalStatus.OK,
        f"{speedup:.2f}x eager (device {timing.device_us:.1f} us vs {eager.device_us:.1f} us)"
        if speedup else "ok", started, compiled,
        correctness=correctness, timing=timing, eager=eager, speedup=speedup,
        bandwidth_gbs=work.moved / (timing.median_us * 1e3) if timing.median_us > 0 else None,
        floor_fraction=floor / timing.median_us if floor and timing.median_us > 0 else None,
        work=work, host=host, counters=counters,
        placement=Placement(str(runtime.device),
                            steps_s={"load": load_s, **evaluation.steps_s}),
        confirmation=Confirmation(held=held) if held else None)
