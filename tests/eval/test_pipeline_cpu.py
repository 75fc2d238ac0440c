"""The whole evaluation on the CPU: reference candidates pass, every cheat is rejected, launcher
mistakes are reported. Kernels are Python stand-ins (tests.eval.fakes) for the CUDA ones."""

from __future__ import annotations

import dataclasses
import json
import time

import pytest
import torch

from kforge.core.candidate import Candidate, EvalOutcome, EvalStatus
from kforge.errors import KforgeError
from kforge.eval.pipeline import EvalSettings, evaluate_candidate, measure_baseline
from kforge.eval.runtime import CpuRuntime
from kforge.eval.timing import TimingPlan
from tests.eval import candidates as C
from tests.eval.fakes import CPU_GPU, PyLoader

FAST = EvalSettings(timing=TimingPlan(warmup=1, min_reps=5, max_reps=10, budget_s=0.01),
                    compile_baseline=False)


def run(card, candidate, *, loader=None, gpu=CPU_GPU, settings=FAST, samples_dir=None):
    return evaluate_candidate(card, candidate, runtime=CpuRuntime(), loader=loader or PyLoader(),
                              gpu=gpu, samples_dir=samples_dir, settings=settings)


@pytest.mark.parametrize("card, candidate", [
    (C.softmax_card(), C.softmax()),
    (C.softmax_card(16, 4096, "bfloat16"), C.softmax()),
    (C.layer_norm_card(), C.layer_norm()),
    (C.layer_norm_card(affine=False), C.layer_norm()),
    (C.add_card(), C.add()),
    (C.add_inplace_card(), C.add_inplace()),
    (C.relu_card(), C.relu()),
], ids=["softmax", "softmax-bf16", "layer_norm", "layer_norm-plain", "add", "add_", "relu"])
def test_reference_candidates_pass(card, candidate):
    outcome = run(card, candidate)
    assert outcome.status is EvalStatus.OK, outcome.summary
    assert outcome.speedup == pytest.approx(outcome.eager.median_us / outcome.timing.median_us)
    assert outcome.timing.reps >= 5 and outcome.timing.p10_us <= outcome.timing.p90_us
    sets = outcome.correctness["sets"]
    assert [s["inputs"] for s in sets] == ["seed 1", "seed 2", "seed 3"]
    assert sets[0]["address_check"] is True
    assert outcome.correctness["after_timing"]["inputs"] == f"seed {1_000_003}"
    assert outcome.extra["launches"] >= 1
    assert outcome.extra["read_bytes"] > 0 and outcome.extra["write_bytes"] > 0


@pytest.mark.parametrize("name, card, candidate, expected", C.CHEATS,
                         ids=[c[0] for c in C.CHEATS])
def test_every_cheat_is_rejected(name, card, candidate, expected):
    outcome = run(card(), candidate())
    assert outcome.status is expected, f"{name}: {outcome.status} {outcome.summary}"
    assert outcome.summary


def test_work_skipped_while_timed_is_caught_by_the_physical_floor():
    card = C.softmax_card(512, 4096)
    honest_calls = 2 * len(FAST.seeds) + 1  # two runs per set, one with new values
    bytes_moved = 2 * 512 * 4096 * 4
    # A copy rate that puts the floor at 0.5 ms: far below eager on a CPU, far above a no-op.
    gpu = dataclasses.replace(CPU_GPU, bandwidth_gbs=bytes_moved / (500 * 1e3 * 1.25))
    outcome = run(card, C.cheat_skip_when_timed(honest_calls), gpu=gpu)
    assert outcome.status is EvalStatus.CHEAT, outcome.summary
    assert "physical floor" in outcome.summary


def test_the_same_cheat_without_a_known_floor_fails_on_its_last_timed_result():
    outcome = run(C.softmax_card(), C.cheat_skip_when_timed(2 * len(FAST.seeds) + 1))
    assert outcome.status is EvalStatus.CHEAT
    assert "timed call" in outcome.summary and "otherwise when timed" in outcome.summary


def test_the_check_after_timing_catches_what_timing_did_not_see():
    # Honest for the verification and the timed calls, then skips: the run after timing fails.
    settings = dataclasses.replace(FAST, timing=TimingPlan(warmup=1, min_reps=6, max_reps=6))
    honest = 2 * len(settings.seeds) + 1 + 1 + 6
    outcome = run(C.softmax_card(), C.cheat_skip_when_timed(honest), settings=settings)
    assert outcome.status is EvalStatus.MISMATCH
    assert "seed 1000003" in outcome.summary


def escape(kernel: str) -> Candidate:
    return Candidate(C.NOOP, f"""
def launch(kernels, x, dim, half_to_float):
    out = torch.empty_like(x)
    kernels.softmax_f32(x.numel() // x.shape[-1], 256, x, out, np.int32(x.shape[-1]))
    kernels.{kernel}(1, 1, out)
    return out
""")


def test_threads_left_running_are_caught():
    outcome = run(C.softmax_card(), escape("start_thread"))
    assert outcome.status is EvalStatus.CHEAT and "threads" in outcome.summary
    assert outcome.extra["restart"] is True


def test_a_replaced_clock_is_caught(monkeypatch):
    monkeypatch.setattr(time, "perf_counter", time.perf_counter)  # restores it afterwards
    outcome = run(C.softmax_card(), escape("patch_clock"))
    assert outcome.status is EvalStatus.CHEAT and "time.perf_counter" in outcome.summary


@pytest.mark.parametrize("launcher, needle", [
    (("def launch(kernels, x, dim, h):\n    out = torch.empty_like(x)\n"
      "    kernels.softmax_f32(4, 256, x, out, 1000)\n    return out\n"), "bare Python int"),
    (("def launch(kernels, x, dim, h):\n    out = torch.empty_like(x)\n"
      "    kernels.missing(4, 256, x, out)\n    return out\n"), "no kernel named 'missing'"),
    ("def launch(kernels, x, dim, h):\n    return x.shape[5]\n", "launcher line 2"),
    ("def launch(kernels, x, dim, h):\n    y = x.t().contiguous()\n    return y\n", "copied data"),
    ("def launch(kernels, x, dim, h)\n    return x\n", "launcher line 1"),
    ("x = 1\n", "defines no top-level launch"),
])
def test_launcher_mistakes_are_launch_errors(launcher, needle):
    outcome = run(C.softmax_card(), Candidate(C.softmax().source, launcher))
    assert outcome.status is EvalStatus.LAUNCH_ERROR
    assert needle in outcome.summary
    assert outcome.status.repairable


def test_wrong_output_strides_are_a_mismatch():
    launcher = C.SOFTMAX_LAUNCHER.replace(
        "out = torch.empty_like(x)",
        "out = torch.empty_strided(tuple(x.shape), (1, x.shape[0]), dtype=x.dtype, device=x.device)")
    outcome = run(C.softmax_card(), Candidate(C.softmax().source, launcher))
    assert outcome.status is EvalStatus.MISMATCH and "strides" in outcome.summary


def test_returning_an_input_where_eager_returns_a_new_tensor_is_a_mismatch():
    launcher = """
def launch(kernels, x):
    kernels.relu_f32(1, 256, x, x, np.int64(x.numel()))
    return x
"""
    outcome = run(C.relu_card(), Candidate(C.relu().source, launcher))
    assert outcome.status in (EvalStatus.MISMATCH, EvalStatus.CHEAT)


def test_an_in_place_op_must_write_its_argument():
    outcome = run(C.add_inplace_card(), C.add())
    assert outcome.status is EvalStatus.MISMATCH
    assert "tensor argument 0 itself" in outcome.summary


def test_compile_errors_come_back_with_nvrtc_log():
    broken = Candidate('extern "C" __global__ void k(float* x) { x[0] = undefined_name; }',
                       C.RELU_LAUNCHER)
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
    assert [s["inputs"] for s in outcome.correctness["sets"]][:2] == ["sample 0", "seed 1"]


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
    with pytest.raises(KforgeError, match="eager aten.add.Tensor fails"):
        measure_baseline(card, runtime=CpuRuntime(), gpu=CPU_GPU, settings=FAST)
