"""What the model is told: the op card, the GPU, the parent, the search's history, per action."""

from __future__ import annotations

import pytest

from kforge.core.candidate import EvalOutcome, EvalStatus
from kforge.core.mcts import Action
from kforge.propose.llm.parse import parse_reply
from kforge.propose.llm.prompt import (
    EXAMPLE_SOURCE,
    SYSTEM_PROMPT,
    build_messages,
    effective_action,
    user_prompt,
)
from tests.fakes.llm_replies import node, ok_outcome, request


def test_system_prompt_teaches_the_format_with_an_example_that_parses():
    for rule in ('extern "C" __global__', "launch(kernels, *args, **kwargs)", "np.int32",
                 "Do not #include", "physical floor", "Approach:"):
        assert rule in SYSTEM_PROMPT
    example = SYSTEM_PROMPT.split("# Example", 1)[1]
    assert parse_reply(example).kernels == ["softmax_rows_f32"]


def test_the_example_kernel_compiles_with_nvrtc():
    pytest.importorskip("cuda.core")
    from kforge.errors import KforgeError
    from kforge.runtime.nvrtc import Compiler

    try:
        result = Compiler().compile(EXAMPLE_SOURCE, "sm_90")
    except KforgeError as exc:
        pytest.skip(str(exc))
    assert result.ok, result.log


def test_new_request_carries_the_op_card_and_gpu():
    tried = [{"family": "softmax", "approach": "online", "params": {"block": 256}}]
    failed = ["warp-per-row: mismatch on rows of -inf"]
    text = user_prompt(request(Action.NEW, failed=failed, tried=tried))
    assert "# Task: new" in text
    assert "aten._softmax.default(bf16[8192,4096], -1, False)" in text
    assert ("args[0]: bfloat16, shape [8192, 4096], stride [4096, 1], storage offset 0, contiguous"
            in text)
    assert "24 calls, 5.9% of the model's operator time" in text
    assert "eager PyTorch: 115 us per call; torch.compile: 148 us; physical floor: 62 us" in text
    assert ("NVIDIA H200, architecture sm_90: 132 SMs, 141 GB memory, 50 MB L2, "
            "measured copy bandwidth 4300 GB/s") in text
    assert "warp-per-row: mismatch on rows of -inf" in text
    assert '"softmax/online block=256"' in text
    assert "# The parent kernel" not in text


def test_refine_carries_parent_code_metrics_and_lineage():
    first = node(3, Action.NEW, ok_outcome(1.10, 100.0))
    better = node(7, Action.REFINE, ok_outcome(1.40, 82.0))
    worse = node(9, Action.REFINE, ok_outcome(1.20, 95.0))
    text = user_prompt(request(Action.REFINE, parent=worse, lineage=[first, better, worse], best=better))
    assert "# Task: refine" in text
    assert "# The parent kernel (node 9, refine)" in text
    assert "ok, 1.20x over eager, 95 us per call" in text
    assert "Used 16 registers" in text  # the compiler report
    assert "extern \"C\" __global__ void softmax_rows_f32" in text.split("# The parent kernel")[1]
    assert '- node 7 (refine) "variant 7": ok, 1.40x over eager' in text and "(improvement)" in text
    assert ("1.20x over eager, 95 us per call (p10 93.1 us, p90 97.9 us), "
            "runs at 65% of the physical floor's speed (regression)") in text
    assert "# Best so far for this operator\nnode 7" in text


def test_repair_after_a_compile_error_carries_the_log():
    log = "candidate.cu(12): error: identifier \"x\" is undefined\n1 error detected"
    outcome = EvalOutcome(EvalStatus.COMPILE_ERROR, summary="1 error", compile_log=log)
    failed = node(4, Action.NEW, outcome)
    text = user_prompt(request(Action.REPAIR, parent=failed))
    assert "# Task: repair" in text
    assert "result: compile_error: 1 error" in text
    assert "NVRTC rejected the source" in text
    assert f"compiler log:\n```text\n{log}\n```" in text


def test_repair_after_a_mismatch_carries_the_summary():
    outcome = EvalOutcome(EvalStatus.MISMATCH, summary="max abs error 0.5 at [3, 17]",
                          correctness={"max_abs": 0.5, "worst_index": [3, 17], "seed": 1})
    text = user_prompt(request(Action.REPAIR, parent=node(5, Action.REFINE, outcome)))
    assert "mismatch: max abs error 0.5 at [3, 17]" in text
    assert "correctness details:\n```json" in text and '"max_abs": 0.5' in text
    assert "accumulate in float" in text


def test_a_huge_compile_log_is_cut_keeping_both_ends():
    log = "error: first\n" + "noise\n" * 5000 + "42 errors detected"
    text = user_prompt(request(Action.REPAIR, parent=node(5, Action.NEW, EvalOutcome(
        EvalStatus.COMPILE_ERROR, compile_log=log))))
    assert "error: first" in text and "42 errors detected" in text and "characters left out" in text
    assert len(text) < 12_000


def test_refine_without_parent_code_falls_back_to_new():
    req = request(Action.REFINE, parent=None)
    assert effective_action(req) is Action.NEW
    assert "# Task: new" in build_messages(req)[1]["content"]


def test_messages_are_system_then_user():
    messages = build_messages(request())
    assert [m["role"] for m in messages] == ["system", "user"]
    assert messages[0]["content"] == SYSTEM_PROMPT
