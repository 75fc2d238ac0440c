"""The whole evaluation on the CPU: reference candidates pass, the device-side cheats of
tests.eval.candidates are rejected, outcomes carry what the search needs. Kernels are Python
stand-ins (tests.eval.fakes) for the CUDA ones; tests/eval/test_redteam_cpu.py holds the red-team
suite, launch plan abuse included."""

from __future__ import annotations

import contextlib
import dataclasses
import json

import pytest
import torch

from kforge.core.candidate import Candidate, EvalOutcome, EvalStatus
from kforge.errors import KforgeError
from kforge.eval.verify.baseline import measure_baseline
from kforge.eval.verify.evaluate import evaluate_candidate
from kforge.eval.verify.pipeline import EvalSettings, Evaluation
from kforge.runtime.device import CpuRuntime
from kforge.runtime.plan import PlanRunner, resolve_for
from kforge.runtime.timing import TimingPlan
from tests.eval import candidates as C
from tests.eval.fakes import CPU_GPU, PyLoader
from tests.eval.redteam import FAST, calls_before_timing


def run(card, candidate, *, loader=None, gpu=CPU_GPU, settings=FAST, samples_dir=None):
    return evaluate_candidate(card, candidate, runtime=CpuRuntime(), loader=loader or PyLoader(),
                              gpu=gpu, samples_dir=samples_dir, settings=settings)


@pytest.mark.parametrize("card", [
    C.softmax_card(),
    C.softmax_card(16, 4096, "bfloat16"),
    C.layer_norm_card(),
    C.layer_norm_card(affine=False),
    C.layer_norm_card(16, 512, "bfloat16"),
    C.add_card(),
    C.add_inplace_card(),
    C.relu_card(),
    C.relu_card([8, 333], "float16"),
], ids=["softmax", "softmax-bf16", "layer_norm", "layer_norm-plain", "layer_norm-bf16", "add",
        "add_", "relu", "relu-f16"])
def test_reference_candidates_pass(card):
    outcome = run(card, C.reference(card, "cpu"))
    assert outcome.status is EvalStatus.OK, outcome.summary
    assert outcome.speedup == pytest.approx(outcome.eager.median_us / outcome.timing.median_us)
    assert outcome.timing.reps >= 5 and outcome.timing.p10_us <= outcome.timing.p90_us
    sets = outcome.correctness.sets
    assert [s.inputs for s in sets] == ["seed 1", "seed 2", "seed 3"]
    assert sets[0].address_check is True
    assert outcome.correctness.after_timing.inputs == f"seed {1_000_003}"
    assert outcome.work.launches >= 1
    assert outcome.work.read_bytes > 0 and outcome.work.write_bytes > 0


def test_an_outcome_keeps_the_seconds_of_each_step_of_its_evaluation():
    card = C.relu_card()
    run(card, C.reference(card, "cpu"))  # the process's one-time costs (imports) paid
    outcome = run(card, C.reference(card, "cpu"))
    assert outcome.status is EvalStatus.OK, outcome.summary
    steps = outcome.placement.steps_s
    assert set(steps) == {"load", "inputs", "checks", "stress", "timing", "recheck",
                          "host cost"}
    # with the compile, the steps are most of the evaluation's time: little lies between them
    covered = sum(steps.values()) + outcome.compile.seconds
    assert 0.5 * outcome.wall_s < covered <= outcome.wall_s


def test_the_counters_are_measured_in_the_timings_exclusive_hold(monkeypatch):
    class Holding(CpuRuntime):
        holds = 0  # exclusive holds taken, outermost only
        depth = 0

        @contextlib.contextmanager
        def exclusive(self):
            self.holds += self.depth == 0
            self.depth += 1
            try:
                yield
            finally:
                self.depth -= 1

    runtime, seen = Holding(), []
    monkeypatch.setattr(Evaluation, "counter_figures",
                        lambda self: seen.append(self.runtime.depth) or None)
    card = C.relu_card()
    outcome = evaluate_candidate(card, C.reference(card, "cpu"), runtime=runtime,
                                 loader=PyLoader(), gpu=CPU_GPU, settings=FAST)
    assert outcome.status is EvalStatus.OK, outcome.summary
    assert seen == [1] and runtime.holds == 1  # one hold: the others' checks drain once


def test_the_admission_and_the_compile_give_the_gpu_up_meanwhile(monkeypatch):
    class Idling(CpuRuntime):
        idling = False

        @contextlib.contextmanager
        def idle(self):
            self.idling = True
            try:
                yield
            finally:
                self.idling = False

    class Watching(PyLoader):
        compiled_idle: list[bool] = []

        def compile(self, candidate):
            self.compiled_idle.append(runtime.idling)
            return super().compile(candidate)

    import kforge.eval.verify.pipeline as pipeline

    admitted_idle: list[bool] = []
    admit = pipeline.admit
    monkeypatch.setattr(pipeline, "admit", lambda card, rt: (
        admitted_idle.append(rt.idling), admit(card, rt))[1])
    runtime, loader = Idling(), Watching()
    card = C.relu_card()
    outcome = evaluate_candidate(card, C.reference(card, "cpu"), runtime=runtime,
                                 loader=loader, gpu=CPU_GPU, settings=FAST)
    assert outcome.status is EvalStatus.OK, outcome.summary
    # host work (meta tensors, NVRTC): timed sections elsewhere go on beside it
    assert loader.compiled_idle == [True] and admitted_idle == [True]


def test_timed_calls_run_where_productions_memory_sits(monkeypatch):
    """A plan with a fallback for misaligned pointers is timed on its aligned path, as a model's
    tensors (on 512-byte boundaries) run it; the checks try the other placements."""
    from tests.eval.redteam import ODD, vectorized_relu

    backends = []

    class Keeping(PyLoader):
        def load(self, compiled):
            backends.append(super().load(compiled))
            return backends[-1]

    timed: list[str] = []
    time_against_eager = Evaluation.time_against_eager

    def watched(self, buffers):
        before = len(backends[0].launched)
        try:
            return time_against_eager(self, buffers)
        finally:
            timed.extend(backends[0].launched[before:])

    monkeypatch.setattr(Evaluation, "time_against_eager", watched)
    card = C.relu_card(ODD)
    outcome = evaluate_candidate(card, vectorized_relu(), runtime=CpuRuntime(), loader=Keeping(),
                                 gpu=CPU_GPU, settings=FAST)
    assert outcome.status is EvalStatus.OK, outcome.summary
    assert timed and set(timed) == {"relu_vec4"}
    assert "relu_scalar" in set(backends[0].launched)  # the checks ran the fallback too


def test_the_two_runs_of_a_set_run_the_same_kernels(monkeypatch):
    """A set's two runs put their memory at one placement, so a plan's align branch picks the
    same kernel for both (a scalar twin's honest order may differ from the vector kernel's beyond
    tolerance on ill-conditioned values, which is no race); the sets still vary the placement."""
    from tests.eval.redteam import ODD, vectorized_relu

    backends = []

    class Keeping(PyLoader):
        def load(self, compiled):
            backends.append(super().load(compiled))
            return backends[-1]

    runs: dict[str, list[str]] = {}
    run_candidate = Evaluation.run_candidate

    def watched(self, inputs, what, contended=False, shift=None):
        before = len(backends[0].launched)
        try:
            return run_candidate(self, inputs, what, contended, shift)
        finally:
            runs[what] = backends[0].launched[before:]

    monkeypatch.setattr(Evaluation, "run_candidate", watched)
    outcome = evaluate_candidate(C.relu_card(ODD), vectorized_relu(), runtime=CpuRuntime(),
                                 loader=Keeping(), gpu=CPU_GPU, settings=FAST)
    assert outcome.status is EvalStatus.OK, outcome.summary
    pairs = [(runs[what], runs[what.replace("run 1", "run 2")])
             for what in runs if what.endswith("run 1")]
    assert pairs and all(first == second for first, second in pairs), runs
    assert {"relu_vec4", "relu_scalar"} <= {k for first, _ in pairs for k in first}


@pytest.mark.parametrize("name, card, candidate, expected", C.CHEATS,
                         ids=[c[0] for c in C.CHEATS])
def test_every_cheat_is_rejected(name, card, candidate, expected):
    outcome = run(card(), candidate())
    assert outcome.status is expected, f"{name}: {outcome.status} {outcome.summary}"
    assert outcome.summary


def test_stand_ins_take_what_the_plan_runner_passes():
    card = C.layer_norm_card(4, 16, affine=False)
    candidate = C.layer_norm()
    loader = PyLoader()
    backend = loader.load(loader.compile(candidate))
    assert backend.has_kernel("layer_norm_f32") and not backend.has_kernel("layer_norm")
    assert backend.param_widths("layer_norm_f32") is None
    runner = PlanRunner(resolve_for(candidate.plan, card.op, card.args, card.kwargs), card.op,
                        backend, torch.device("cpu"))
    x = torch.randn(4, 16)
    out, mean, rstd = runner((x, (16,), None, None, 1e-6), {})  # weight and bias: null pointers
    expected = torch.ops.aten.native_layer_norm.default(x, [16], None, None, 1e-6)
    for got, want in zip((out, mean, rstd), expected):
        torch.testing.assert_close(got, want)
    assert backend.launched == ["layer_norm_f32"]


def test_the_check_after_timing_catches_what_timing_did_not_see():
    # Honest for the verification and the timed calls, then skips: the run after timing fails.
    settings = dataclasses.replace(FAST, timing=TimingPlan(warmup=1, min_reps=6, max_reps=6))
    honest = calls_before_timing(C.softmax_card(), settings) + 1 + 6  # warm-up, timed rounds
    outcome = run(C.softmax_card(), C.cheat_skip_when_timed(honest), settings=settings)
    assert outcome.status is EvalStatus.MISMATCH
    assert "seed 1000003" in outcome.summary


def test_an_in_place_op_must_write_its_argument():
    outcome = run(C.add_inplace_card(), C.add())
    assert outcome.status is EvalStatus.MISMATCH
    assert "tensor argument 0 itself" in outcome.summary


def test_compile_errors_come_back_with_nvrtc_log():
    broken = Candidate('extern "C" __global__ void k(float* x) { x[0] = undefined_name; }',
                       plan=C.relu().plan)
    outcome = run(C.relu_card(), broken, loader=PyLoader(nvrtc=True))
    assert outcome.status is EvalStatus.COMPILE_ERROR
    assert "undefined_name" in outcome.compile_log
    assert outcome.summary.startswith("NVRTC:")


def test_samples_are_verified_before_random_inputs(tmp_path):
    card = C.softmax_card(8, 64)
    (tmp_path / card.key).mkdir()
    torch.save({"args": [torch.randn(8, 64), -1, False], "kwargs": {}}, tmp_path / card.key / "0.pt")
    outcome = run(card, C.softmax(), samples_dir=tmp_path)
    assert outcome.ok, outcome.summary
    assert [s.inputs for s in outcome.correctness.sets][:2] == ["sample 0", "seed 1"]


def test_outcomes_survive_json():
    outcome = run(C.relu_card(), C.relu())
    again = EvalOutcome.from_dict(json.loads(json.dumps(outcome.to_dict())))
    assert again == outcome


def test_baseline_times_eager_and_gives_the_floor():
    gpu = dataclasses.replace(CPU_GPU, bandwidth_gbs=100.0)
    base = measure_baseline(C.add_card([64, 64]), runtime=CpuRuntime(), gpu=gpu, settings=FAST)
    assert base.eager.median_us > 0 and base.compiled is None
    assert base.floor_us == pytest.approx(3 * 64 * 64 * 4 / (100.0 * 1e3))
    assert "seed 1" in base.note


def test_baseline_of_an_op_eager_cannot_run_is_a_clear_error():
    card = C.add_card([4, 4]).with_(args=[C.tensor([4, 4]), C.tensor([5, 4])], key="")
    with pytest.raises(KforgeError, match="aten.add.Tensor: eager PyTorch rejects these "
                                          "arguments: Attempting to broadcast"):
        measure_baseline(card, runtime=CpuRuntime(), gpu=CPU_GPU, settings=FAST)


def test_a_compiled_subject_that_recompiles_while_timed_leaves_eager_alone_with_the_guard():
    from kforge.eval.verify.baseline import time_subjects

    def recompiles(r: int) -> None:
        raise RuntimeError("Detected recompile when torch.compile stance is 'fail_on_recompile'. "
                           "triggered by the following guard failure(s):\n - 0/0: tensor 'x' "
                           "dtype mismatch. expected Float, actual Double")

    notes: list[str] = []
    settings = EvalSettings(timing=TimingPlan(warmup=1, min_reps=3, max_reps=3, wall_calls=2))
    timings = time_subjects({"eager": lambda r: None, "compiled": recompiles}, CpuRuntime(),
                            settings, notes)
    assert set(timings) == {"eager"} and timings["eager"].reps == 3
    assert "recompiled while timed" in notes[0] and "dtype mismatch" in notes[0]


def test_every_call_gets_its_plans_zeroed_scratch_afresh():
    """A plan's zeroed scratch is zero at each call, the wall-time calls back to back included:
    an honest kernel that takes its rows from a ticket counter there passes."""
    outcome = run(C.softmax_card(), C.softmax_ticketed())
    assert outcome.status is EvalStatus.OK, outcome.summary
    assert outcome.timing.wall_us is not None


class FaultAtRelease(CpuRuntime):
    """A runtime whose first held batch ends in a kernel fault that kills its context."""

    dead = False

    def release(self) -> bool:
        self.dead = True
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    def alive(self) -> bool:
        return not self.dead


def test_a_fault_while_timed_is_a_crash_naming_the_calls_in_flight():
    card = C.softmax_card()
    outcome = evaluate_candidate(card, C.reference(card, "cpu"), runtime=FaultAtRelease(),
                                 loader=PyLoader(), gpu=CPU_GPU, settings=FAST)
    assert outcome.status is EvalStatus.CRASH and outcome.restart
    assert "crashed during timing (timed rounds" in outcome.summary
