"""The evaluator on a real GPU: reference kernels pass, the cheat suite is rejected in full,
crashes and hangs cost only a worker."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest
import torch

from kforge.core.candidate import Candidate, EvalStatus
from kforge.core.protocols import SearchContext
from kforge.eval import make_gpu_evaluator
from kforge.eval.gpuinfo import arch_name, detect_gpu
from kforge.eval.inputs import Geometry, allocate
from kforge.eval.kernels import Kernels
from kforge.eval.local import baseline_local, device_context, evaluate_local
from kforge.eval.sandbox import Violation
from tests.eval import candidates as C

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def test_gpu_is_detected_with_its_measured_copy_rate():
    gpu = detect_gpu(0)
    major, minor = torch.cuda.get_device_capability(0)
    assert gpu.arch == arch_name(major, minor)
    assert gpu.sm_count > 0 and gpu.memory_gb > 1 and gpu.l2_mb > 0
    assert gpu.bandwidth_gbs is not None and gpu.bandwidth_gbs > 100
    print(gpu)


def test_inputs_keep_their_storage_offset_and_canaries_on_the_gpu():
    buf = allocate(Geometry((8, 16), (16, 1), 3, torch.bfloat16), torch.device("cuda", 0))
    assert buf.view.storage_offset() == 3 and buf.view.is_cuda
    assert buf.view.untyped_storage().data_ptr() > buf.base.data_ptr()  # canary before it too


def test_kernels_launch_on_the_evaluation_stream_only():
    ctx = device_context(0)
    compiled = ctx.loader.compile(C.softmax())
    kernels = Kernels(ctx.loader.load(compiled), ctx.runtime.device, ctx.runtime.stream_problem)
    with ctx.runtime.scope():
        x = torch.randn(4, 64, device=ctx.runtime.device)
        out = torch.empty_like(x)
        kernels.softmax_f32(4, 256, x, out, np.int32(64))
        ctx.runtime.sync()
        torch.testing.assert_close(out, torch.softmax(x, -1))
        with torch.cuda.stream(torch.cuda.Stream()), pytest.raises(Violation, match="stream"):
            kernels.softmax_f32(4, 256, x, out, np.int32(64))
    assert kernels._launches() == 1


REFERENCE_CASES = [
    ("softmax-f32", C.softmax_card(4096, 1024), C.softmax),
    ("softmax-bf16", C.softmax_card(2048, 4096, "bfloat16"), C.softmax),
    ("softmax-f16", C.softmax_card(512, 2048, "float16"), C.softmax),
    ("softmax-64KiB-shared", C.softmax_card(256, 16384), C.softmax_shared_memory),
    ("layer_norm-bf16", C.layer_norm_card(4096, 1536, "bfloat16"), C.layer_norm),
    ("layer_norm-f32-plain", C.layer_norm_card(1024, 1536, affine=False), C.layer_norm),
    ("add-f16", C.add_card([32, 256, 56, 56], "float16"), C.add),
    ("add_-f32", C.add_inplace_card([64, 4096]), C.add_inplace),
    ("relu-f16", C.relu_card([32, 64, 112, 112], "float16"), C.relu),
]


@pytest.mark.parametrize("name, card, build", REFERENCE_CASES, ids=[c[0] for c in REFERENCE_CASES])
def test_reference_candidates_pass_on_the_gpu(name, card, build):
    outcome = evaluate_local(card, build())
    assert outcome.status is EvalStatus.OK, f"{outcome.summary}\n{outcome.extra.get('traceback', '')}"
    assert outcome.speedup and outcome.speedup > 0
    assert outcome.bandwidth_gbs and outcome.floor_fraction
    assert outcome.floor_fraction < 1.5, "faster than the memory floor allows"
    print(f"{name}: {outcome.summary}, {outcome.bandwidth_gbs:.0f} GB/s, "
          f"{outcome.floor_fraction:.2f} of floor, turnaround {outcome.wall_s:.3f} s")


def test_captured_samples_with_masks_are_replayed_and_mimicked(tmp_path):
    card = C.softmax_card(64, 128)
    scores = torch.randn(64, 128) * 3
    scores[:, 100:] = float("-inf")  # a padding mask
    scores[5] = float("-inf")  # a fully masked row: NaN in eager and candidate alike
    (tmp_path / card.key).mkdir()
    torch.save({"args": [scores, -1, False], "kwargs": {}}, tmp_path / card.key / "0.pt")
    outcome = evaluate_local(card, C.softmax(), samples_dir=tmp_path)
    assert outcome.ok, outcome.summary
    assert outcome.correctness["sets"][0]["inputs"] == "sample 0"


@pytest.mark.parametrize("name, card, build, expected", C.CHEATS, ids=[c[0] for c in C.CHEATS])
def test_the_cheat_suite_is_rejected_on_the_gpu(name, card, build, expected):
    outcome = evaluate_local(card(), build())
    assert outcome.status is expected, f"{name}: {outcome.status} {outcome.summary}"


def test_work_skipped_while_timed_is_flagged_below_the_physical_floor():
    honest_calls = 2 * 3 + 1  # default settings: 3 seeds, two runs each, one with new values
    outcome = evaluate_local(C.softmax_card(8192, 4096), C.cheat_skip_when_timed(honest_calls))
    assert outcome.status is EvalStatus.CHEAT, outcome.summary
    assert "physical floor" in outcome.summary


@pytest.mark.parametrize("launcher, needle", [
    (C.SOFTMAX_LAUNCHER.replace("np.int32(cols)", "np.int64(cols)"), "bytes wide"),
    (C.SOFTMAX_LAUNCHER.replace("(rows, 256,", "(rows, 2048,"), "failed"),
])
def test_bad_launches_are_launch_errors_and_leave_the_context_usable(launcher, needle):
    outcome = evaluate_local(C.softmax_card(), Candidate(C.softmax().source, launcher))
    assert outcome.status is EvalStatus.LAUNCH_ERROR, outcome.summary
    assert needle in outcome.summary
    assert evaluate_local(C.softmax_card(), C.softmax()).ok


def test_baseline_times_eager_and_torch_compile():
    base = baseline_local(C.softmax_card(4096, 4096))
    assert base.eager.median_us > 0 and base.floor_us and base.floor_us > 0
    assert base.compiled is not None and base.compile_s and base.compile_s > 0, base.note
    print(base)


def test_crashes_and_hangs_cost_only_a_worker():
    asyncio.run(crashes_and_hangs())


async def crashes_and_hangs() -> None:
    ctx = SearchContext(session_id=1, samples_dir=Path("."), settings={"eval": {"timeout_s": 10}})
    evaluator = make_gpu_evaluator(ctx)
    assert evaluator.capacity == torch.cuda.device_count()
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
