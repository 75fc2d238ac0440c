"""What the model is told: the candidate format, the op card as a launch plan sees it, the GPU,
the parent, the search's history, per action."""

from __future__ import annotations

import json

import pytest

from kforge.core.candidate import Candidate, EvalOutcome, EvalStatus
from kforge.core.mcts import Action
from kforge.core.opcard import OpCard
from kforge.propose.llm.parse import parse_reply
from kforge.propose.llm.prompt import (
    EXAMPLE_PLAN,
    EXAMPLE_SOURCE,
    SYSTEM_PROMPT,
    build_messages,
    card_section,
    effective_action,
    plan_json,
    user_prompt,
)
from kforge.runtime.plan import resolve_for
from tests.fakes.llm_replies import node, ok_outcome, request, softmax_card


def test_system_prompt_teaches_the_format_with_an_example_that_parses():
    for rule in ('extern "C" __global__', "Do not #include", "physical floor", "Approach:",
                 "```json block with the complete launch plan", '"requires"', '"outputs"',
                 '"launches"', '{"ptr": NAME}', '"i32" (int)', "ceil_div(a, b)",
                 "x.shape[i]", "x.is_contiguous", "no method calls", "at most 1024 threads",
                 "launches[0].grid[0]"):
        assert rule in SYSTEM_PROMPT
    for gone in ("launch(kernels", "np.int32", "```python"):
        assert gone not in SYSTEM_PROMPT
    example = SYSTEM_PROMPT.split("# Example", 1)[1]
    parsed = parse_reply(example)
    assert parsed.kernels == ["softmax_rows_bf16"] and parsed.source == EXAMPLE_SOURCE


def test_the_example_plan_resolves_for_its_own_task():
    card = softmax_card()
    plan = resolve_for(EXAMPLE_PLAN, card.op, card.args, card.kwargs)
    (launch,) = plan.launches
    assert (launch.kernel, launch.grid, launch.block) == ("softmax_rows_bf16", (8192, 1, 1),
                                                           (256, 1, 1))
    assert [p.value for p in launch.params[2:]] == [8192, 4096]
    (out,) = plan.outputs
    assert (out.shape, out.stride, out.dtype) == ((8192, 4096), (4096, 1), "bfloat16")


def test_plans_are_shown_as_json_one_item_a_line():
    text = plan_json(EXAMPLE_PLAN)
    assert json.loads(text) == EXAMPLE_PLAN
    assert '    {"name": "out", "like": "self"}' in text.splitlines()


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
    assert "schema: aten::_softmax(Tensor self, int dim, bool half_to_float) -> Tensor" in text
    assert ("- self: tensor bfloat16, shape [8192, 4096], stride [4096, 1], storage offset 0, "
            "contiguous\n- dim = -1\n- half_to_float = False\n") in text
    assert ("eager returns (the plan's outputs, in this order):\n"
            "- output 0: bfloat16, shape [8192, 4096], stride [4096, 1]") in text
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
    parent = text.split("# The parent kernel")[1]
    assert "extern \"C\" __global__ void softmax_rows_bf16" in parent
    assert f"launch plan:\n```json\n{plan_json(EXAMPLE_PLAN)}\n```" in parent
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


def test_a_parent_without_a_plan_is_asked_for_one():
    legacy = node(6, Action.NEW, ok_outcome(1.1), Candidate(EXAMPLE_SOURCE, meta={"approach": "x"}))
    text = user_prompt(request(Action.REFINE, parent=legacy))
    assert "launch plan: none; write one" in text


def test_a_repair_after_a_refused_plan_points_at_the_plan():
    outcome = EvalOutcome(EvalStatus.LAUNCH_ERROR,
                          summary="launch plan: launches[0].params: softmax_rows_bf16 takes 4 "
                                  "parameters, the plan passes 3")
    text = user_prompt(request(Action.REPAIR, parent=node(5, Action.NEW, outcome)))
    assert "launches[0].params: softmax_rows_bf16 takes 4 parameters" in text
    assert "the summary names the plan field at fault" in text


def test_list_arguments_are_shown_by_element_and_outputs_by_position():
    def tensor(shape, stride):
        return {"t": "tensor", "shape": shape, "stride": stride, "dtype": "float32", "offset": 0}

    card = OpCard(op="aten.cat.default",
                  args=[{"t": "list", "items": [tensor([2, 3], [3, 1]), tensor([4, 3], [1, 4])]}])
    text = card_section(card)
    assert ("- tensors[0]: tensor float32, shape [2, 3], stride [3, 1], storage offset 0, "
            "contiguous") in text
    assert ("- tensors[1]: tensor float32, shape [4, 3], stride [1, 4], storage offset 0, "
            "NOT contiguous") in text
    assert "- dim = 0" in text  # the schema's default, as the plan sees it
    assert "- output 0: float32, shape [6, 3], stride [3, 1]" in text


def test_scalar_lists_and_dtypes_are_shown_as_plan_expressions_see_them():
    x = {"t": "tensor", "shape": [6, 512], "stride": [512, 1], "dtype": "bfloat16", "offset": 0}
    card = OpCard(op="aten.native_layer_norm.default",
                  args=[x, {"t": "list", "items": [512]}, None, None, 1e-5])
    text = card_section(card)
    assert "- normalized_shape = [512]\n- weight = None\n- bias = None\n- eps = 1e-05" in text
    assert "- output 1: float32, shape [6, 1], stride [1, 1]" in text


def test_when_eager_rejects_the_arguments_the_prompt_says_so():
    x = {"t": "tensor", "shape": [4, 4], "stride": [4, 1], "dtype": "float32", "offset": 0}
    card = OpCard(op="aten.add.Tensor", args=[x, {**x, "shape": [3, 4]}])  # not broadcastable
    text = card_section(card)
    assert "eager's outputs could not be derived (eager PyTorch rejects these arguments" in text
    assert "- alpha = 1" in text
