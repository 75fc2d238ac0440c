"""The evaluator on a real GPU: reference kernels and honest controls pass, the cheats of
tests.eval.candidates and the red-team suite (tests.eval.redteam, as CUDA) are rejected for the
reason their class names, races and out-of-bounds accesses that leave results right are caught by
compute-sanitizer, and crashes and hangs cost only a worker."""

from __future__ import annotations

import asyncio
import re
import time
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from kforge.core import settings as config
from kforge.core.candidate import Candidate, EvalStatus
from kforge.core.protocols import SearchContext
from kforge.core.settings import TimingPlan
from kforge.eval import make_gpu_evaluator
from kforge.eval.process.local import baseline_local, device_context, evaluate_local
from kforge.eval.verify.inputs import Geometry, allocate
from kforge.eval.verify.pipeline import EvalSettings
from kforge.runtime.cubin import KernelModule
from kforge.runtime.gpuinfo import arch_name, detect_gpu
from kforge.runtime.plan import PlanRunner, resolve_for
from kforge.runtime.timing import time_interleaved
from tests.eval import candidates as C
from tests.eval import redteam as R

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

GPU_SETTINGS = EvalSettings()


def gpu_settings(case: R.Case) -> EvalSettings:
    """A case's settings on the GPU: production's, with the timing plan and timed-call checks
    of a case that sets its own (a case built to be caught on every timed call must have every
    one checked, or its verdict depends on the draw)."""
    if case.settings is R.FAST:
        return GPU_SETTINGS
    return replace(GPU_SETTINGS, timing=case.settings.timing,
                   checked_timed_calls=case.settings.checked_timed_calls)


def test_gpu_is_detected_with_its_measured_copy_rate():
    gpu = detect_gpu(0)
    major, minor = torch.cuda.get_device_capability(0)
    assert gpu.arch == arch_name(major, minor)
    assert gpu.sm_count > 0 and gpu.memory_gb > 1 and gpu.l2_mb > 0
    assert gpu.bandwidth_gbs is not None and gpu.bandwidth_gbs > 100
    print(gpu)


def test_a_host_slow_to_enqueue_the_call_is_not_timed_as_gpu_time():
    runtime = device_context(0).runtime
    x = torch.ones(1024, device=runtime.device)

    def late_add(r: int) -> torch.Tensor:
        until = time.perf_counter() + 40e-6  # a Python dispatch under load
        while time.perf_counter() < until:
            pass
        return x + 1

    with runtime.scope():
        timed = time_interleaved({"late": late_add}, runtime,
                                 TimingPlan(warmup=2, min_reps=20, max_reps=20, budget_s=0.01))
    assert timed.timings["late"].median_us < 25, timed.timings["late"]


def test_inputs_keep_their_storage_offset_and_canaries_on_the_gpu():
    buf = allocate(Geometry((8, 16), (16, 1), 3, torch.bfloat16), torch.device("cuda", 0))
    assert buf.view.storage_offset() == 3 and buf.view.is_cuda
    assert buf.view.untyped_storage().data_ptr() > buf.base.data_ptr()  # canary before it too


def test_a_resolved_plan_runs_its_kernels_on_the_evaluation_stream():
    ctx = device_context(0)
    card = C.softmax_card(4, 64)
    candidate = C.softmax()
    compiled = ctx.loader.compile(candidate)
    module = ctx.loader.load(compiled)
    assert isinstance(module, KernelModule) and module.has_kernel("softmax_f32")
    assert module.param_widths("softmax_f32") in ([8, 8, 4], None)
    runner = PlanRunner(resolve_for(candidate.plan, card.op, card.args, card.kwargs), card.op,
                        module, ctx.runtime.device)
    with ctx.runtime.scope():
        x = torch.randn(4, 64, device=ctx.runtime.device)
        out = runner((x, -1, False), {})
        ctx.runtime.sync()
    torch.testing.assert_close(out, torch.softmax(x, -1))


REFERENCE_CASES = [
    ("softmax-f32", C.softmax_card(4096, 1024)),
    ("softmax-bf16", C.softmax_card(2048, 4096, "bfloat16")),
    ("softmax-f16", C.softmax_card(512, 2048, "float16")),
    ("layer_norm-bf16", C.layer_norm_card(4096, 1536, "bfloat16")),
    ("layer_norm-f32-plain", C.layer_norm_card(1024, 1536, affine=False)),
    ("add-f16", C.add_card([32, 256, 56, 56], "float16")),
    ("add_-f32", C.add_inplace_card([64, 4096])),
    ("relu-f16", C.relu_card([32, 64, 112, 112], "float16")),
]


@pytest.mark.parametrize("name, card", REFERENCE_CASES, ids=[c[0] for c in REFERENCE_CASES])
def test_reference_candidates_pass_on_the_gpu(name, card):
    outcome = evaluate_local(card, C.reference(card))
    trace = outcome.failure.traceback if outcome.failure else ""
    assert outcome.status is EvalStatus.OK, f"{outcome.summary}\n{trace}"
    assert outcome.speedup and outcome.speedup > 0
    assert outcome.bandwidth_gbs and outcome.floor_fraction
    assert outcome.floor_fraction < 1.5, "faster than the memory floor allows"
    print(f"{name}: {outcome.summary}, {outcome.bandwidth_gbs:.0f} GB/s, "
          f"{outcome.floor_fraction:.2f} of floor, turnaround {outcome.wall_s:.3f} s")


def test_the_64_kib_shared_memory_softmax_passes():
    outcome = evaluate_local(C.softmax_card(256, 16384), C.softmax_shared_memory())
    assert outcome.status is EvalStatus.OK, outcome.summary


def test_captured_samples_with_masks_are_replayed_and_mimicked(tmp_path):
    card = C.softmax_card(64, 128)
    scores = torch.randn(64, 128) * 3
    scores[:, 100:] = float("-inf")  # a padding mask
    scores[5] = float("-inf")  # a fully masked row: NaN in eager and candidate alike
    (tmp_path / card.key).mkdir()
    torch.save({"args": [scores, -1, False], "kwargs": {}}, tmp_path / card.key / "0.pt")
    outcome = evaluate_local(card, C.softmax(), samples_dir=tmp_path)
    assert outcome.ok, outcome.summary
    assert outcome.correctness.sets[0].inputs == "sample 0"


@pytest.mark.parametrize("name, card, build, expected", C.CHEATS, ids=[c[0] for c in C.CHEATS])
def test_the_cheats_are_rejected_on_the_gpu(name, card, build, expected):
    outcome = evaluate_local(card(), build())
    assert outcome.status is expected, f"{name}: {outcome.status} {outcome.summary}"


LAUNCH_BOUNDS = C.CONVERT + C.REDUCE + C.SOFTMAX_BODY + r"""
extern "C" __global__ void __launch_bounds__(256) softmax_bounded(const float* x, float* y, int cols) {
    softmax_row<float>(x, y, cols);
}
"""


def test_a_launch_the_gpu_refuses_is_a_launch_error_and_leaves_the_context_usable():
    plan = C.softmax_plan("softmax_bounded", block=1024)  # the kernel allows 256 threads
    outcome = evaluate_local(C.softmax_card(), Candidate(LAUNCH_BOUNDS, plan=plan))
    assert outcome.status is EvalStatus.LAUNCH_ERROR, outcome.summary
    assert "launching the plan failed" in outcome.summary
    assert evaluate_local(C.softmax_card(), C.softmax()).ok


def test_baseline_times_eager_and_torch_compile():
    base = baseline_local(C.softmax_card(4096, 4096))
    assert base.eager.median_us > 0 and base.floor_us and base.floor_us > 0
    assert base.compiled is not None and base.compile_s and base.compile_s > 0, base.note
    print(base)


def test_crashes_and_hangs_cost_only_a_worker():
    asyncio.run(crashes_and_hangs())


async def crashes_and_hangs() -> None:
    ctx = SearchContext(session_id=1, samples_dir=Path("."),
                        settings=config.SessionSettings(eval=config.EvalSettings(timeout_s=10)))
    evaluator = make_gpu_evaluator(ctx)
    assert evaluator.capacity == torch.cuda.device_count() * config.EvalSettings.workers
    await evaluator.start()
    try:
        assert evaluator.gpu.arch.startswith("sm_")
        card = C.softmax_card()
        assert (await evaluator.evaluate(card, C.softmax())).ok
        for kind, expected in (("illegal_address", EvalStatus.CRASH), ("trap", EvalStatus.CRASH),
                               ("hang", EvalStatus.TIMEOUT)):
            outcome = await evaluator.evaluate(card, C.crasher(kind))
            assert outcome.status is expected, f"{kind}: {outcome.status} {outcome.summary}"
            print(f"{kind}: {outcome.status} {outcome.summary}")
        after = await evaluator.evaluate(card, C.softmax())
        assert after.ok, after.summary
        assert evaluator.restarts == 3
        baseline = await evaluator.baseline(card)
        assert baseline.eager.median_us > 0
    finally:
        await evaluator.close()


# ----- the red-team suite as CUDA -----


def samples_for(case: R.Case | R.Control, card, tmp_path: Path) -> Path | None:
    if case.sample is None:
        return None
    R.save_sample(tmp_path, card, case.sample())
    return tmp_path


def sanitize(card, candidate: Candidate, samples_dir: Path | None):
    """compute-sanitizer's report on ``candidate`` (skips where it cannot run)."""
    sanitizer = pytest.importorskip("kforge.eval.process.sanitize",
                                    reason="kforge.eval.process.sanitize is not there yet")
    report = sanitizer.sanitize_candidate(card, candidate, samples_dir=samples_dir, device=0)
    if not getattr(report, "ran", True):
        pytest.skip(f"compute-sanitizer could not run: {report.message}")
    return report


EVALUATED = [case for case in R.CASES if case.by == "pipeline"]
SANITIZED = [case for case in R.CASES if case.by == "sanitizer"]


@pytest.mark.parametrize("case", EVALUATED, ids=[case.id for case in EVALUATED])
def test_every_red_team_case_is_rejected_for_its_class_on_the_gpu(case, tmp_path):
    card = (case.gpu_card or case.card)()
    settings = gpu_settings(case)
    candidate = case.candidate(settings, "cuda")
    outcome = evaluate_local(card, candidate, samples_dir=samples_for(case, card, tmp_path),
                             settings=settings)
    assert case.rejects(outcome.status, outcome.summary, gpu=True), (
        f"{case.id}: {outcome.status} {outcome.summary}")
    print(f"{case.id}: {outcome.status} {outcome.summary[:200]}")


@pytest.mark.parametrize("case", SANITIZED, ids=[case.id for case in SANITIZED])
def test_races_and_out_of_bounds_accesses_are_rejected_by_the_sanitizer(case, tmp_path):
    card = (case.gpu_card or case.card)()
    report = sanitize(card, case.candidate(GPU_SETTINGS, "cuda"),
                      samples_for(case, card, tmp_path))
    assert not report.ok, f"{case.id} ({case.notes}): the sanitizer found nothing"
    assert re.search(case.gpu_needle or case.needle, report.message), report.message
    print(f"{case.id}: {report.tool}: {report.message[:200]}")


@pytest.mark.parametrize("control", R.CONTROLS, ids=[c.name for c in R.CONTROLS])
def test_every_honest_control_passes_on_the_gpu(control, tmp_path):
    card = control.card()
    outcome = evaluate_local(card, control.candidate("cuda"), settings=GPU_SETTINGS,
                             samples_dir=samples_for(control, card, tmp_path))
    assert outcome.status is EvalStatus.OK, f"{control.name}: {outcome.summary}"
    print(f"{control.name}: {outcome.summary}")


# One control per kind of kernel: the sanitizer takes tens of seconds a candidate.
UNDER_SANITIZER = [c for c in R.CONTROLS if c.name in (
    "softmax-two-launches-scratch", "layer-norm-bf16", "add-in-place", "relu-vectorized-unaligned",
    "relu-through-a-device-function")]


@pytest.mark.parametrize("control", UNDER_SANITIZER, ids=[c.name for c in UNDER_SANITIZER])
def test_honest_controls_are_clean_under_the_sanitizer(control, tmp_path):
    card = control.card()
    report = sanitize(card, control.candidate("cuda"), samples_for(control, card, tmp_path))
    assert report.ok, f"{control.name}: {report.tool}: {report.message}"
