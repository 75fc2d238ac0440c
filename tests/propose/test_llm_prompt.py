"""What the model is told: the candidate format, the op card as a launch plan sees it, the GPU,
the parent, the search's history, per action."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from kforge.core.candidate import Baseline, Candidate, EvalOutcome, EvalStatus, Timing
from kforge.core.gpu import GpuInfo
from kforge.core.mcts import Action
from kforge.core.opcard import OpCard
from kforge.core.outcome import (
    Comparison,
    CompileFacts,
    Confirmation,
    Correctness,
    CounterFigures,
    Element,
    FailureEvidence,
    LaunchCounters,
    Mismatch,
    NonFinite,
    SanitizerReport,
    SetCheck,
)
from kforge.core.region import Region
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
from kforge.runtime.regions import register
from tests.fakes.llm_replies import h200, node, ok_outcome, request, softmax_card


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
                          correctness=Correctness((SetCheck("seed 1", max_abs=0.5),)))
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
    assert "- output 1 (mean): float32, shape [6, 1], stride [1, 1]" in text


def test_when_eager_rejects_the_arguments_the_prompt_says_so():
    x = {"t": "tensor", "shape": [4, 4], "stride": [4, 1], "dtype": "float32", "offset": 0}
    card = OpCard(op="aten.add.Tensor", args=[x, {**x, "shape": [3, 4]}])  # not broadcastable
    text = card_section(card)
    assert "eager's outputs could not be derived (eager PyTorch rejects these arguments" in text
    assert "- alpha = 1" in text


# ----- the op's meaning, the machine, the evidence of a failure, the profile of a kernel -----


def group_norm_card() -> OpCard:
    def t(shape):
        stride, step = [], 1
        for size in reversed(shape):
            stride.insert(0, step)
            step *= size
        return {"t": "tensor", "shape": shape, "stride": stride, "dtype": "bfloat16", "offset": 0}

    return OpCard(op="aten.native_group_norm.default",
                  args=[t([1, 128, 64, 64]), t([128]), t([128]), 1, 128, 4096, 32, 1e-06],
                  calls=6, share=0.05, eager_us=30.0, floor_us=4.0)


def h200_from_the_driver() -> GpuInfo:
    return replace(h200(), smem_per_block_kb=48.0, smem_per_block_optin_kb=227.0,
                   smem_per_sm_kb=228.0, regs_per_sm=65536, regs_per_block=65536,
                   max_threads_per_sm=2048, max_blocks_per_sm=32, sm_clock_mhz=1980,
                   mem_clock_mhz=3201, bus_width_bits=6144, cluster_launch=True,
                   tensor_maps=True)


def test_the_prompt_says_what_the_op_computes_and_names_its_outputs():
    text = user_prompt(replace(request(), card=group_norm_card()))
    assert ("- input: tensor bfloat16, shape [1, 128, 64, 64], stride [524288, 4096, 64, 1]"
            in text and "- HxW = 4096\n- group = 32\n- eps = 1e-06" in text)
    assert "- output 0 (out): bfloat16, shape [1, 128, 64, 64]" in text
    assert "- output 1 (mean): bfloat16, shape [1, 32], stride [32, 1]" in text
    assert "- output 2 (rstd): bfloat16, shape [1, 32], stride [32, 1]" in text
    meaning = text.split("# What the operator computes\n", 1)[1].split("\n#", 1)[0]
    assert "rstd = 1 / sqrt(var + eps)" in meaning and "g = c // (C / group)" in meaning
    assert "Returns (out, mean, rstd)" in meaning


def test_an_op_without_a_statement_gets_no_meaning_section():
    assert "# What the operator computes" in user_prompt(request())  # softmax has one
    card = replace(softmax_card(), op="aten.special_bessel_j0.default", args=[
        softmax_card().args[0]])
    assert "# What the operator computes" not in user_prompt(replace(request(), card=card))


def test_the_gpu_section_gives_the_limits_clocks_and_architecture():
    text = user_prompt(replace(request(), gpu=h200_from_the_driver()))
    gpu = text.split("# The GPU\n", 1)[1].split("\n\n", 1)[0]
    assert "- per SM: 228 KiB shared memory, 65536 32-bit registers, 2048 threads" in gpu
    assert "- per block: 48 KiB shared memory, up to 227 KiB with a plan's shared_mem" in gpu
    assert ("- clocks: SM up to 1980 MHz, memory 3201 MHz over a 6144-bit bus (theoretical "
            "4917 GB/s") in gpu
    assert "thread block clusters (__cluster_dims__)" in gpu and "need sm_90a" in gpu
    assert "unified memory" not in gpu


def test_an_integrated_gpu_is_said_to_share_its_memory_with_the_cpu():
    gb10 = GpuInfo(name="NVIDIA GB10", arch="sm_121", sm_count=48, bandwidth_gbs=230.0,
                   integrated=True, pageable_memory_access=True)
    text = user_prompt(replace(request(), gpu=gb10))
    assert ("unified memory: an integrated GPU sharing one physical memory (LPDDR) with the "
            "CPU") in text
    assert "Blackwell (consumer/GB10)" in text and "no wgmma or tcgen05" in text


def test_the_eager_kernels_and_their_times_are_shown():
    base = Baseline(eager=Timing(30.0, 29.0, 31.0, 100), eager_kernels=[
        {"name": "void at::native::(anonymous namespace)::RowwiseMomentsCUDAKernel<c10::BFloat16>",
         "us": 14.2, "calls": 1.0},
        {"name": "void at::native::elementwise_kernel<128, 2>", "us": 11.9, "calls": 2.0}])
    text = user_prompt(replace(request(), card=group_norm_card(), baseline=base))
    eager = text.split("# Eager PyTorch's kernels for this call", 1)[1].split("\n\n", 1)[0]
    assert "the timed eager call takes 30 us" in eager
    assert ("- void at::native::(anonymous namespace)::RowwiseMomentsCUDAKernel<c10::BFloat16>: "
            "14.2 us") in eager
    assert "- void at::native::elementwise_kernel<128, 2> x2: 11.9 us" in eager


def test_a_refine_gets_the_parents_registers_and_hardware_counters():
    outcome = replace(
        ok_outcome(1.4, 21.0), compile=CompileFacts(registers={"softmax_rows_bf16": 40},
                                                    spills=False),
        counters=CounterFigures("CUPTI range profiler", passes=1, kernels=(LaunchCounters(
            "softmax_rows_bf16", duration_ns=20500.0, dram_read_bytes=67.1e6,
            dram_write_bytes=67.1e6, dram_gbs=6546.0, dram_peak_pct=71.0, occupancy_pct=43.5,
            sm_peak_pct=22.0),)))
    text = user_prompt(replace(request(Action.REFINE, parent=node(3, Action.NEW, outcome)),
                               gpu=h200_from_the_driver()))
    parent = text.split("# The parent kernel", 1)[1]
    assert ("ptxas: softmax_rows_bf16 40 registers/thread (registers allow at most 80% "
            "occupancy); no spills") in parent
    assert ("- softmax_rows_bf16: 20.5 us, DRAM 67.1 MB read + 67.1 MB written = 6546 GB/s, "
            "71% of peak DRAM throughput, achieved occupancy 44%, 22% of peak SM throughput"
            ) in parent


def test_a_parent_whose_spills_went_unreported_is_not_said_to_have_none():
    outcome = replace(ok_outcome(1.4, 21.0),
                      compile=CompileFacts(registers={"softmax_rows_bf16": 40}, spills=None))
    text = user_prompt(replace(request(Action.REFINE, parent=node(3, Action.NEW, outcome)),
                               gpu=h200_from_the_driver()))
    assert "softmax_rows_bf16 40 registers/thread" in text
    assert "spills not reported" in text and "no spills" not in text


def test_a_refine_is_told_when_counters_are_not_permitted():
    note = ("counters not available: not permitted: the driver restricts GPU performance "
            "counters to administrators (NVreg_RestrictProfilingToAdminUsers=1)")
    outcome = replace(ok_outcome(1.2), counters=CounterFigures("CUPTI range profiler", note))
    text = user_prompt(request(Action.REFINE, parent=node(3, Action.NEW, outcome)))
    assert f"hardware counters (CUPTI range profiler): {note}" in text


def test_a_mismatch_repair_gets_the_worst_elements_spans_and_norms_per_input_set():
    evidence = FailureEvidence(
        Mismatch("random seed 2, run 1", 0, (8192, 4096), "bfloat16", 8192, 0.75, 0.031,
                 ((0, 8191), (4032, 4095)), {"nan": NonFinite(0, 3)},
                 (Element((17, 4095), 0.5, "nan"), Element((3, 4032), 0.25, 1.0))),
        (SetCheck("captured sample 0", 0.0039, 0.0012),), Comparison(False))
    outcome = EvalOutcome(EvalStatus.MISMATCH, summary="random seed 2, run 1, result 0: NaN "
                          "positions differ from eager's at 3 elements, first at [17, 4095]",
                          failure=evidence)
    text = user_prompt(request(Action.REPAIR, parent=node(5, Action.NEW, outcome)))
    assert "mismatch evidence, random seed 2, run 1, result 0 (bfloat16 [8192, 4096]):" in text
    assert "- 8192 elements at fault; max abs error 0.75, relative error norm 0.031" in text
    assert "- faults lie within indices 0..8191 x 4032..4095 of shape [8192, 4096]" in text
    assert "- NaN/inf counts (eager vs candidate): nan 0 vs 3" in text
    assert ("- worst elements (index: eager -> candidate): [17, 4095]: 0.5 -> nan; "
            "[3, 4032]: 0.25 -> 1") in text
    assert ("- passed before it: captured sample 0 (max abs error 0.0039, relative error norm "
            "0.0012)") in text


def test_a_compile_repair_quotes_the_lines_the_log_points_at():
    log = ('candidate.cu(30): error: identifier "row_max" is undefined\n'
           'candidate.cu(12): warning: variable "v" was declared but never referenced')
    outcome = EvalOutcome(EvalStatus.COMPILE_ERROR, summary="NVRTC: error", compile_log=log)
    text = user_prompt(request(Action.REPAIR, parent=node(5, Action.NEW, outcome)))
    lines = EXAMPLE_SOURCE.splitlines()
    assert f"   30 | {lines[29]}" in text and f"   12 | {lines[11]}" in text
    assert text.index(f"   30 | {lines[29]}") < text.index(f"   12 | {lines[11]}")


def test_a_sanitizer_rejection_and_a_long_plan_error_reach_the_repair_in_full():
    message = ("compute-sanitizer racecheck: Race reported between Write access at "
               "softmax_rows_bf16+0x1f0 and Read access at softmax_rows_bf16+0x2a0")
    outcome = EvalOutcome(EvalStatus.MISMATCH, summary=message, confirmation=Confirmation(
        sanitizer=SanitizerReport(False, "racecheck", message)))
    text = user_prompt(request(Action.REPAIR, parent=node(5, Action.NEW, outcome)))
    assert f"compute-sanitizer (racecheck) report: {message}" in text
    field = "launches[2].params[7]"
    long = f"launch plan: {field}: " + "the plan passes a pointer where the kernel takes " * 8
    outcome = EvalOutcome(EvalStatus.LAUNCH_ERROR, summary=long)
    text = user_prompt(request(Action.REPAIR, parent=node(5, Action.NEW, outcome)))
    assert f"full message: {long.strip()}" in text and field in text


def test_a_crash_repair_gets_the_workers_last_output():
    outcome = EvalOutcome(EvalStatus.CRASH, summary="the worker died", failure=FailureEvidence(
        stderr="CUDA error: an illegal memory access was encountered\nat softmax_rows_bf16"))
    text = user_prompt(request(Action.REPAIR, parent=node(5, Action.NEW, outcome)))
    assert "the worker's last output:\n```text\nCUDA error: an illegal memory access" in text


def test_a_region_card_says_what_each_family_of_its_ops_computes_once():
    samples = json.loads(Path(__file__).with_name("region_samples.json").read_text())
    region = samples["gemma4-tiny/r_06abf04f5777"]["region"]  # rotary embedding: mul, neg, cat
    found = Region.from_dict(region)
    register(found)
    card = OpCard(op=found.op, args=list(found.inputs), region=region)
    text = user_prompt(replace(request(), card=card))
    meaning = text.split("# What the chain's ops compute\n", 1)[1].split("\n\n", 1)[0]
    assert "- aten.mul.Tensor, aten.add.Tensor: Elementwise over operands broadcast" in meaning
    assert "\n  aten.add.Tensor: self + alpha * other." in meaning
    assert meaning.count("Elementwise over operands broadcast") == 1
    assert "# What the operator computes" not in text
