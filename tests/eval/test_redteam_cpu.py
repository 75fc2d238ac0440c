"""The red-team suite on the CPU: every case is rejected for the reason its class names, every
honest control passes, and every source compiles to the kernels its plan launches. Kernels are
Python stand-ins (tests.eval.fakes); cases only a GPU can judge run in tests/eval/test_gpu.py."""

from __future__ import annotations

import dataclasses
import inspect
import re
from collections import Counter
from functools import cache

import pytest

from kforge.core.candidate import Candidate, EvalStatus
from kforge.core.launch_plan import PlanError
from kforge.eval.verify.evaluate import evaluate_candidate
from kforge.eval.verify.inputs import InputFactory, InputSet
from kforge.eval.verify.pipeline import CandidateCalls
from kforge.runtime.nvrtc import PRELUDE, cuda_include_dirs
from kforge.runtime.plan import check_kernels, check_widths, resolve_for
from kforge.runtime.timing import TimingPlan
from tests.eval import candidates as C
from tests.eval import redteam as R
from tests.eval.fakes import (
    CPU_GPU,
    STANDINS,
    ContendedCpuRuntime,
    ContendedModelledRuntime,
    PyLoader,
)

BANDWIDTH_GBS = 100.0
CPU_CASES = [case for case in R.CASES if case.where != "gpu"]


def evaluate(card, candidate, *, settings=R.FAST, sample=None, modelled=False, samples_dir=None):
    if sample is not None:
        R.save_sample(samples_dir, card, sample())
    runtime = ContendedModelledRuntime(BANDWIDTH_GBS) if modelled else ContendedCpuRuntime()
    gpu = dataclasses.replace(CPU_GPU, bandwidth_gbs=BANDWIDTH_GBS) if modelled else CPU_GPU
    loader = PyLoader(clock=runtime.clock if modelled else None)
    return evaluate_candidate(card, candidate, runtime=runtime, loader=loader, gpu=gpu,
                              samples_dir=samples_dir if sample is not None else None,
                              settings=settings)


@pytest.mark.parametrize("case", CPU_CASES, ids=[case.id for case in CPU_CASES])
def test_every_red_team_case_is_rejected_for_its_class(case, tmp_path):
    card = case.card()
    outcome = evaluate(card, case.candidate(case.settings, "cpu"), settings=case.settings,
                       sample=case.sample, modelled=case.modelled, samples_dir=tmp_path)
    assert case.rejects(outcome.status, outcome.summary), (
        f"{case.id} ({case.notes}): {outcome.status} {outcome.summary}")
    if case.status is EvalStatus.LAUNCH_ERROR:
        assert outcome.status.repairable  # the summary names the field to fix


@pytest.mark.parametrize("control", R.CONTROLS, ids=[c.name for c in R.CONTROLS])
def test_every_honest_control_passes(control, tmp_path):
    card = control.card()
    outcome = evaluate(card, control.candidate("cpu"), sample=control.sample,
                       samples_dir=tmp_path)
    assert outcome.status is EvalStatus.OK, f"{control.name}: {outcome.summary}"
    assert outcome.correctness.stress, "no stress set was tried"


def test_honest_kernels_respect_the_physical_floor():
    card = C.softmax_card()
    outcome = evaluate(card, C.reference(card, "cpu"), modelled=True)
    assert outcome.status is EvalStatus.OK, outcome.summary
    assert outcome.timing.median_us >= outcome.work.hard_floor_us


def test_every_class_has_several_cases():
    counts = Counter(case.klass for case in R.CASES)
    assert set(counts) == set(R.CLASSES)
    assert all(n >= 3 for n in counts.values()), counts
    assert len({case.id for case in R.CASES}) == len(R.CASES), "case ids repeat"


def test_timed_calls_are_prepared_alike_whether_checked_or_not(monkeypatch):
    # A kernel sees the allocator through the addresses it gets: what happens between a timed
    # call's new values and its launch must not depend on whether the call gets checked.
    events: list[str] = []

    def logged(event, function):
        def call(*args, **kwargs):
            events.append(event)
            return function(*args, **kwargs)

        return call

    monkeypatch.setattr(InputFactory, "refill", logged("refill", InputFactory.refill))
    monkeypatch.setattr(InputSet, "take_snapshot", logged("snapshot", InputSet.take_snapshot))
    monkeypatch.setattr(InputSet, "fresh_copy", logged("copy", InputSet.fresh_copy))
    monkeypatch.setattr(CandidateCalls, "memory", logged("memory", CandidateCalls.memory))
    monkeypatch.setitem(STANDINS, "softmax_f32", logged("launch", STANDINS["softmax_f32"]))
    rounds = 8
    settings = dataclasses.replace(R.FAST, checked_timed_calls=3,
                                   timing=TimingPlan(warmup=1, min_reps=rounds, max_reps=rounds))
    card = C.softmax_card(8, 64)
    outcome = evaluate(card, C.softmax(), settings=settings)
    assert outcome.ok and outcome.work.checked_timed_calls == 3, outcome.summary

    timing = events[events.index("refill"):]
    preparations = []
    for _ in range(settings.timing.warmup + rounds):
        launch = timing.index("launch")
        before = timing[:launch]
        last_refill = len(before) - 1 - before[::-1].index("refill")
        preparations.append(tuple(before[last_refill:]))
        timing = timing[launch + 1:]
    assert set(preparations) == {("refill", "snapshot", "memory")}, preparations


# ----- every source compiles to the kernels its plan launches -----


@cache
def kernel_signatures(source: str) -> dict[str, list[int]]:
    """The ``extern "C"`` kernels NVRTC finds in ``source``, with their parameters' widths in
    bytes (read from the PTX: no GPU or driver needed)."""
    from cuda.bindings import nvrtc

    _, program = nvrtc.nvrtcCreateProgram((PRELUDE + source).encode(), b"candidate.cu", 0, [], [])
    options = [b"-arch=compute_90", b"-std=c++17",
               *[b"-I" + d.encode() for d in cuda_include_dirs()]]
    (result,) = nvrtc.nvrtcCompileProgram(program, len(options), options)
    assert result == nvrtc.nvrtcResult.NVRTC_SUCCESS, f"NVRTC: {result}"
    _, size = nvrtc.nvrtcGetPTXSize(program)
    ptx = b" " * size
    nvrtc.nvrtcGetPTX(program, ptx)
    nvrtc.nvrtcDestroyProgram(program)
    widths = {"8": 1, "16": 2, "32": 4, "64": 8}
    return {name: [widths[bits] * int(count or 1) for bits, count in re.findall(
                r"\.param\s+(?:\.align\s+\d+\s+)?\.[bfsu](\d+)\s+(?:\.ptr\s+(?:\.\w+\s+)*)?\w+"
                r"(?:\[(\d+)\])?", params)]
            for name, params in re.findall(r"\.entry\s+(\w+)\(([^)]*)\)", ptx.decode())}


def launchable() -> list[tuple[str, object, Candidate, bool]]:
    """Every candidate whose plan is meant to resolve and launch: (id, card, candidate, whether
    it runs on the CPU too)."""
    found = [(f"control-{c.name}", c.card(), c.candidate("cuda"), True) for c in R.CONTROLS]
    found += [(f"cheat-{name}", card(), build(), True) for name, card, build, _ in C.CHEATS]
    found += [(f"crasher-{kind}", C.softmax_card(), C.crasher(kind), False)
              for kind in C.CRASHERS]
    found += [(f"case-{case.id}", case.card(), case.candidate(case.settings, "cuda"),
               case.where != "gpu")
              for case in R.CASES if case.status is not EvalStatus.LAUNCH_ERROR]
    return found


LAUNCHABLE = launchable()
IDS = [entry[0] for entry in LAUNCHABLE]


@pytest.mark.parametrize("name, card, candidate, on_cpu", LAUNCHABLE, ids=IDS)
def test_plans_launch_kernels_their_sources_define_with_matching_parameters(
        name, card, candidate, on_cpu):
    signatures = kernel_signatures(candidate.source)
    plan = resolve_for(candidate.plan, card.op, card.args, card.kwargs)
    check_kernels(plan, signatures.__contains__, sorted(signatures))
    check_widths(plan, signatures.get)


@pytest.mark.parametrize("name, card, candidate, on_cpu", LAUNCHABLE, ids=IDS)
def test_stand_ins_take_the_parameters_their_kernels_declare(name, card, candidate, on_cpu):
    signatures = kernel_signatures(candidate.source)
    plan = resolve_for(candidate.plan, card.op, card.args, card.kwargs)
    for kernel in plan.kernel_names():
        standin = STANDINS.get(kernel)
        assert standin is not None or not on_cpu, f"kernel {kernel} has no stand-in"
        if standin is not None:
            declared = len(inspect.signature(standin).parameters) - 1  # the Launch comes first
            assert declared == len(signatures[kernel]), f"{kernel}: the stand-in takes {declared}"


def test_a_plan_naming_a_width_the_kernel_does_not_take_is_refused():
    card = C.softmax_card()
    case = next(c for c in R.CASES if c.name == "param-wider-than-kernel")
    candidate = case.candidate(case.settings, "cuda")
    plan = resolve_for(candidate.plan, card.op, card.args, card.kwargs)
    with pytest.raises(PlanError, match=case.needle.removeprefix("launch plan: ")):
        check_widths(plan, kernel_signatures(candidate.source).get)
