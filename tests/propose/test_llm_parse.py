"""Reading a candidate (CUDA source and launch plan) out of a model's reply, however it is laid
out; a plan that is malformed or reaches for anything outside its grammar is refused by field."""

from __future__ import annotations

import json

import pytest

from kforge.core.launch_plan import parse_plan
from kforge.propose.llm.parse import (
    UnusableReply,
    extern_c_kernels,
    parse_reply,
    split_blocks,
    strip_reasoning,
)
from kforge.propose.llm.prompt import EXAMPLE_PLAN
from tests.fakes.llm_replies import (
    BROKEN_CODE_REPLY,
    BROKEN_SOURCE,
    GOOD_REPLY,
    INJECTION_REPLY,
    MISSPELT_PLAN_REPLY,
    NO_CODE_REPLY,
    with_launch,
)

SOURCE = 'extern "C" __global__ void k(float* x) { x[0] = 1.0f; }\n'
PLAN = {"outputs": [{"name": "out", "arg": "self"}],
        "launches": [{"kernel": "k", "grid": [1], "block": [1], "params": [{"ptr": "self"}]}]}
PLAN_TEXT = json.dumps(PLAN) + "\n"


def test_a_well_formed_reply():
    parsed = parse_reply(GOOD_REPLY)
    assert parsed.kernels == ["softmax_rows_bf16"]
    assert parsed.source.startswith("// Warp-level reductions")
    assert parsed.plan == parse_plan(EXAMPLE_PLAN).to_dict()
    assert parsed.approach == "one block per row, two-pass reductions"
    assert "expf for accuracy" in parsed.notes


def test_the_plan_is_kept_in_canonical_form():
    parsed = parse_reply(f"```cuda\n{SOURCE}```\n```json\n{PLAN_TEXT}```")
    assert parsed.plan["returns"] == "single"  # the default, filled in
    assert parse_plan(parsed.plan).to_dict() == parsed.plan


def test_broken_code_is_still_a_candidate():
    parsed = parse_reply(BROKEN_CODE_REPLY)
    assert parsed.source == BROKEN_SOURCE
    assert parsed.kernels == ["copy_bf16"]


def test_no_code_block():
    with pytest.raises(UnusableReply, match="no code block"):
        parse_reply(NO_CODE_REPLY)
    with pytest.raises(UnusableReply, match="the reply is empty"):
        parse_reply(" \n")


def test_untagged_fences_are_told_apart_by_content():
    reply = f"Here it is.\n```\n{SOURCE}```\nand\n```\n{PLAN_TEXT}```\n"
    parsed = parse_reply(reply)
    assert (parsed.source, parsed.kernels) == (SOURCE, ["k"])


@pytest.mark.parametrize("source_tag,plan_tag",
                         [("cpp", "json"), ("c++", "JSON"), ("cu", "jsonc"), ("CUDA", "")])
def test_language_tags(source_tag, plan_tag):
    parsed = parse_reply(f"```{source_tag}\n{SOURCE}```\n```{plan_tag}\n{PLAN_TEXT}```")
    assert parsed.kernels == ["k"]


def test_an_unterminated_last_fence_runs_to_the_end():
    parsed = parse_reply(f"```cuda\n{SOURCE}```\n```json\n{PLAN_TEXT}")
    assert parsed.kernels == ["k"]


def test_reasoning_is_ignored_even_when_it_holds_drafts():
    draft = "```cuda\nextern \"C\" __global__ void draft(float* x) {}\n```"
    final = f"```cuda\n{SOURCE}```\n```json\n{PLAN_TEXT}```"
    assert parse_reply(f"<think>First try:\n{draft}\nno, better:</think>\n{final}").kernels == ["k"]
    # A chat template that swallowed the opening tag leaves only the closing one.
    assert parse_reply(f"thinking {draft} </think>\n{final}").kernels == ["k"]


def test_a_reply_cut_inside_its_reasoning():
    with pytest.raises(UnusableReply, match="<think>"):
        parse_reply("<think>Let me consider the memory layout ```cuda\n__global__ void")


def test_the_last_complete_draft_wins():
    old = SOURCE.replace("1.0f", "2.0f")
    reply = f"Before:\n```cuda\n{old}```\nAfter:\n```cuda\n{SOURCE}```\n```json\n{PLAN_TEXT}```"
    assert parse_reply(reply).source == SOURCE


def test_a_well_formed_plan_wins_over_a_later_broken_one():
    broken = '{"launches": '
    reply = f"```cuda\n{SOURCE}```\n```json\n{PLAN_TEXT}```\nor maybe\n```json\n{broken}\n```"
    assert parse_reply(reply).kernels == ["k"]


def test_source_must_declare_the_kernels_the_plan_launches():
    other = json.dumps(with_launch(PLAN, kernel="missing"))
    with pytest.raises(UnusableReply, match="plan launches missing.*declared: k"):
        parse_reply(f"```cuda\n{SOURCE}```\n```json\n{other}\n```")


def test_a_kernel_without_c_linkage_is_not_usable():
    mangled = SOURCE.replace('extern "C" ', "")
    with pytest.raises(UnusableReply, match='extern "C" __global__'):
        parse_reply(f"```cuda\n{mangled}```\n```json\n{PLAN_TEXT}```")


def test_a_missing_plan_says_what_to_send():
    with pytest.raises(UnusableReply, match="no ```json block with the launch plan"):
        parse_reply(f"```cuda\n{SOURCE}```")
    launcher = "def launch(kernels, x):\n    kernels.k(1, 1, x)\n    return x\n"
    with pytest.raises(UnusableReply, match="no ```json block with the launch plan"):
        parse_reply(f"```cuda\n{SOURCE}```\n```python\n{launcher}```")


def test_a_malformed_plan_names_the_field_at_fault():
    with pytest.raises(UnusableReply) as caught:
        parse_reply(MISSPELT_PLAN_REPLY)
    assert str(caught.value).startswith("launch plan: launches[0].blok: unknown field 'blok'")
    assert "did you mean 'block'" in str(caught.value)


def test_a_plan_that_is_not_json_says_where():
    with pytest.raises(UnusableReply, match=r"^launch plan: not valid JSON: .*line 1 column"):
        parse_reply(f"```cuda\n{SOURCE}```\n```json\n{{'outputs': []}}\n```")
    with pytest.raises(UnusableReply, match="^launch plan: the field 'launches' is missing"):
        parse_reply(f"```cuda\n{SOURCE}```\n```json\n{{\"outputs\": []}}\n```")


def test_an_expression_reaching_for_python_is_a_plan_error():
    with pytest.raises(UnusableReply) as caught:
        parse_reply(INJECTION_REPLY)
    message = str(caught.value)
    assert message.startswith("launch plan: launches[0].grid[0]: ")
    assert "only the functions min, max, abs, ceil_div, len, defined may be called" in message


@pytest.mark.parametrize("expression", [
    "self.__class__", "open('/etc/passwd')", "(lambda: 1)()", "[c for c in 'ab']",
    "rows.bit_length()", "2 ** 40"])
def test_nothing_outside_the_grammar_gets_through(expression):
    with pytest.raises(UnusableReply, match=r"^launch plan: launches\[0\]\.grid\[0\]: "):
        parse_reply(f"```cuda\n{SOURCE}```\n```json\n"
                    f"{json.dumps(with_launch(PLAN, grid=[expression]))}\n```")


def test_kernel_declaration_forms():
    source = """
    // extern "C" __global__ void commented_out(float* x) {}
    template <int N> __global__ void templated(float* x) {}
    extern "C" __global__ void __launch_bounds__(256) bounded(float* x) { templated<4>(x); }
    extern "C" __global__ __launch_bounds__(128, 2) void bounds_first(float* x) {}
    __global__ void mangled(float* x) {}
    extern "C" {
    __global__ void in_block_a(float* x) { if (x) { x[0] = 0; } }
    __device__ void helper(float* x) {}
    __global__ void in_block_b(float* x) {}
    }
    """
    assert extern_c_kernels(source) == ["bounded", "bounds_first", "in_block_a", "in_block_b"]


def test_split_keeps_prose_apart_from_code():
    blocks, prose = split_blocks("intro\n~~~cuda\ncode\n~~~\noutro")
    assert [(b.tag, b.code) for b in blocks] == [("cuda", "code\n")]
    assert prose == "intro\noutro"


def test_strip_reasoning_removes_an_unclosed_tail():
    assert strip_reasoning("answer <think> still thinking") == "answer "
