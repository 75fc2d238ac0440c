"""Reading a candidate out of a model's reply, however it is laid out."""

from __future__ import annotations

import pytest

from kforge.propose.llm.parse import (
    UnusableReply,
    extern_c_kernels,
    launcher_kernel_calls,
    parse_reply,
    split_blocks,
    strip_reasoning,
)
from tests.fakes.llm_replies import (
    BROKEN_CODE_REPLY,
    BROKEN_SOURCE,
    GOOD_REPLY,
    NO_CODE_REPLY,
)

SOURCE = 'extern "C" __global__ void k(float* x) { x[0] = 1.0f; }\n'
LAUNCHER = "def launch(kernels, *args, **kwargs):\n    kernels.k(1, 1, args[0])\n    return args[0]\n"


def test_a_well_formed_reply():
    parsed = parse_reply(GOOD_REPLY)
    assert parsed.kernels == ["softmax_rows_f32"]
    assert parsed.source.startswith("// Warp-level reductions")
    assert parsed.launcher.startswith("def launch(kernels")
    assert parsed.approach == "one block per row, two-pass reductions"
    assert "expf for accuracy" in parsed.notes


def test_broken_code_is_still_a_candidate():
    parsed = parse_reply(BROKEN_CODE_REPLY)
    assert parsed.source == BROKEN_SOURCE
    assert parsed.kernels == ["relu_f32"]


def test_no_code_block():
    with pytest.raises(UnusableReply, match="no code block"):
        parse_reply(NO_CODE_REPLY)
    with pytest.raises(UnusableReply, match="the reply is empty"):
        parse_reply(" \n")


def test_untagged_fences_are_told_apart_by_content():
    reply = f"Here it is.\n```\n{SOURCE}```\nand\n```\n{LAUNCHER}```\n"
    parsed = parse_reply(reply)
    assert (parsed.source, parsed.launcher) == (SOURCE, LAUNCHER)


@pytest.mark.parametrize("source_tag,launcher_tag",
                         [("cpp", "py"), ("c++", "python3"), ("cu", "python"), ("CUDA", "Python")])
def test_language_tags(source_tag, launcher_tag):
    parsed = parse_reply(f"```{source_tag}\n{SOURCE}```\n```{launcher_tag}\n{LAUNCHER}```")
    assert parsed.kernels == ["k"]


def test_an_unterminated_last_fence_runs_to_the_end():
    parsed = parse_reply(f"```cuda\n{SOURCE}```\n```python\n{LAUNCHER}")
    assert parsed.launcher == LAUNCHER


def test_reasoning_is_ignored_even_when_it_holds_drafts():
    draft = "```cuda\nextern \"C\" __global__ void draft(float* x) {}\n```"
    final = f"```cuda\n{SOURCE}```\n```python\n{LAUNCHER}```"
    assert parse_reply(f"<think>First try:\n{draft}\nno, better:</think>\n{final}").kernels == ["k"]
    # A chat template that swallowed the opening tag leaves only the closing one.
    assert parse_reply(f"thinking {draft} </think>\n{final}").kernels == ["k"]


def test_a_reply_cut_inside_its_reasoning():
    with pytest.raises(UnusableReply, match="<think>"):
        parse_reply("<think>Let me consider the memory layout ```cuda\n__global__ void")


def test_the_last_complete_draft_wins():
    old = SOURCE.replace("1.0f", "2.0f")
    reply = f"Before:\n```cuda\n{old}```\nAfter:\n```cuda\n{SOURCE}```\n```python\n{LAUNCHER}```"
    assert parse_reply(reply).source == SOURCE


def test_source_must_declare_the_kernel_the_launcher_calls():
    other = LAUNCHER.replace("kernels.k(", "kernels.missing(")
    with pytest.raises(UnusableReply, match='launcher calls missing.*declared: k'):
        parse_reply(f"```cuda\n{SOURCE}```\n```python\n{other}```")


def test_a_kernel_without_c_linkage_is_not_usable():
    mangled = SOURCE.replace('extern "C" ', "")
    with pytest.raises(UnusableReply, match='extern "C" __global__'):
        parse_reply(f"```cuda\n{mangled}```\n```python\n{LAUNCHER}```")


def test_launcher_problems():
    with pytest.raises(UnusableReply, match="no Python launcher"):
        parse_reply(f"```cuda\n{SOURCE}```")
    with pytest.raises(UnusableReply, match="not valid Python"):
        parse_reply(f"```cuda\n{SOURCE}```\n```python\ndef launch(kernels:\n```")
    with pytest.raises(UnusableReply, match="does not define launch"):
        parse_reply(f"```cuda\n{SOURCE}```\n```python\ndef run(kernels):\n    kernels.k(1, 1)\n```")
    with pytest.raises(UnusableReply, match="never launches a kernel"):
        parse_reply(f"```cuda\n{SOURCE}```\n```python\ndef launch(kernels, x):\n    return x\n```")


def test_the_launcher_is_never_executed():
    evil = "import os\nos.system('touch /tmp/pwned')\n" + LAUNCHER
    assert launcher_kernel_calls(evil) == ["k"]


def test_getattr_launches_count():
    assert launcher_kernel_calls("def launch(ks, x):\n    getattr(ks, 'a')(1, 1, x)\n") == ["a"]


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
