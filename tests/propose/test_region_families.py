"""Kernel families for fusion regions, on the CPU: regions of the tiny models and of small
hand-made modules are matched by their structure into programs that compute what the region's
operator computes; what the matcher does not understand is declined with its reason; every
rendered kernel compiles with NVRTC and its launch plan resolves for its card; and the kernels
themselves, compiled for the host and run one thread after another, give eager's results."""

from __future__ import annotations

import ctypes
import hashlib
import json
import math
import os
import re
import shutil
import struct
import subprocess
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given
from hypothesis import strategies as st

from kforge.capture.recorder import ModuleTracker
from kforge.capture.regions import TraceRecorder, region_cards
from kforge.core.argspec import torch_dtype
from kforge.core.candidate import Candidate
from kforge.core.gpu import GpuInfo
from kforge.core.opcard import OpCard
from kforge.core.region import Region
from kforge.propose.library.cards import Declined
from kforge.propose.library.examples import tensor as example_tensor
from kforge.propose.library.families.base import cuda_text
from kforge.propose.library.proposer import build_candidate, make_plan, supports
from kforge.propose.library.regions.families import CUDA_FILES
from kforge.propose.library.regions.match import match_region, memory_order
from kforge.propose.library.regions.program import leaves
from kforge.propose.library.regions.reference import evaluate
from kforge.propose.library.regions.render import literal
from kforge.propose.llm.prompt import card_section
from kforge.runtime.plan import resolve_for
from kforge.runtime.regions import register

GPU = GpuInfo(name="H200", arch="sm_90", sm_count=132)
SAMPLES: dict[str, dict] = json.loads((Path(__file__).parent / "region_samples.json").read_text())

# What the library makes of every region of the tiny models (as profiled on the CPU).
EXPECTED = {
    "gemma4-tiny/r_06abf04f5777": "region_rotary",  # k: rotary, transpose, cat to the cache
    "gemma4-tiny/r_199769d20a2a": "region_elementwise",  # final logit soft-capping
    "gemma4-tiny/r_273550225d97": "region_cat",  # rotary_emb: cos and sin of cat(freqs, freqs)
    "gemma4-tiny/r_32ab17664eea": "region_rms_norm",  # v_norm, no weight
    "gemma4-tiny/r_7cbbc93c6ef6": "declined: outputs share the memory of n10",
    "gemma4-tiny/r_be4ac16fa8ed": "region_rms_norm",  # input_layernorm
    "gemma4-tiny/r_c29163eab333": "region_rotary",
    "gemma4-tiny/r_c3d4b87ba394": "region_rotary",  # q: rotary, then transpose
    "gemma4-tiny/r_ff7b1a566946": "region_cat",
    "qwen35-tiny/r_0cf7dbeb2abe": "region_elementwise",  # sigmoid, transpose, cast
    "qwen35-tiny/r_0de626019101": "region_elementwise",  # -exp(a) * softplus(x + dt_bias)
    "qwen35-tiny/r_25f09e7d3719": "region_softmax",  # router: cast, softmax
    "qwen35-tiny/r_3def0e938e66": "region_elementwise",  # sigmoid gate times expert, plus
    "qwen35-tiny/r_3eb342cf0c3b": "declined: output 0 is a view of input x0",
    "qwen35-tiny/r_599d70c59d28": "region_elementwise",
    "qwen35-tiny/r_69ac9e68bf25": "region_elementwise",
    "qwen35-tiny/r_a30019366f7d": "declined: output 0 is a view of input x0",
    "qwen35-tiny/r_a648075d7e35": "declined: input x0 cannot be read through aten.view.default",
    "qwen35-tiny/r_ad0fe7732a83": "declined: aten.masked_fill.Scalar (node n4) is not an op",
    "qwen35-tiny/r_d057a081b6ee": "region_rms_norm",  # gated: weight * norm(x) * silu(z)
    "qwen35-tiny/r_d827bbddd858": "region_rotary",  # partial rotary of q and k, k to the cache
    "qwen35-tiny/r_df1caee43b02": "region_rms_norm",  # (1 + weight)
    "sd35-tiny/r_1ad2239b2c21": "region_elementwise",
    "sd35-tiny/r_1ff8c6ba9b77": "region_elementwise",
    "sd35-tiny/r_530a2cf15708": "region_elementwise",  # adaLN modulation x * (1 + scale) + shift
    "sd35-tiny/r_55a0a7abc364": "region_rms_norm",  # q/k norm of a strided view
    "sd35-tiny/r_5f041ce18baf": "declined: input x1 cannot be read through aten.view.default",
    "sd35-tiny/r_634b56384af9": "region_cat",  # timestep embedding
    "sd35-tiny/r_9bf82dc63426": "region_group_norm",  # channels-last input: clone, group norm
    "sd35-tiny/r_e0d400ea958a": "region_elementwise",
    "sd35-tiny/r_ee9afd764460": "region_elementwise",
    "sd35-tiny/r_f4e83fce7bac": "region_elementwise",
}
MATCHED = sorted(name for name, expected in EXPECTED.items() if not expected.startswith("declined"))


def on_gpu(region: dict) -> dict:
    """The region as a capture on the GPU records it: copies stay on cuda:0 (the samples were
    captured on the CPU)."""
    text = json.dumps(region).replace('{"t": "device", "v": "cpu"}', '{"t": "device", "v": "cuda:0"}')
    return json.loads(text)


def region_card(region: dict) -> OpCard:
    """The card of ``region`` at its inputs, its operator defined."""
    found = Region.from_dict(region)
    register(found)
    return OpCard(op=found.op, args=list(found.inputs), region=region)


def sample(name: str) -> tuple[dict, OpCard]:
    """A tiny model's region as captured (on the CPU) and its card as on the GPU."""
    region = SAMPLES[name]["region"]
    return region, region_card(on_gpu(region))


def random_inputs(region: dict, seed: int = 0, offset: int = 0) -> list[torch.Tensor]:
    """CPU tensors with the region's input layouts, ``offset`` elements into their storage."""
    generator = torch.Generator().manual_seed(seed)
    found = []
    for spec in region["inputs"]:
        shape, stride = spec["shape"], spec["stride"]
        span = 1 + sum((n - 1) * s for n, s in zip(shape, stride)) if all(shape) else 0
        storage = torch.randn(offset + span, generator=generator).to(torch_dtype(spec["dtype"]))
        found.append(storage.as_strided(shape, stride, offset))
    return found


def eager(region: dict, inputs: list[torch.Tensor]) -> tuple[torch.Tensor, ...]:
    with torch.no_grad():
        result = register(region)(*inputs)
    return result if isinstance(result, tuple) else (result,)


def assert_matches(got: list[torch.Tensor], want: tuple[torch.Tensor, ...], label: str) -> None:
    """Eager's layouts, and values within the evaluator's tolerances (relative to each output's
    RMS), here with two ulps of slack for eager's CPU kernels rounding differently."""
    assert len(got) == len(want), label
    for i, (g, w) in enumerate(zip(got, want)):
        assert (g.shape, g.dtype) == (w.shape, w.dtype), f"{label} output {i}"
        assert all(a == b for a, b, n in zip(g.stride(), w.stride(), w.shape) if n != 1), \
            f"{label} output {i}: strides {g.stride()} for eager's {w.stride()}"
        tol = 1e-4 if w.dtype == torch.float32 else 2e-2
        rms = float(w.float().pow(2).mean().sqrt()) if w.numel() else 0.0
        torch.testing.assert_close(g.float(), w.float(), rtol=tol, atol=tol * max(rms, 1e-3),
                                   equal_nan=True, msg=f"{label} output {i}")


# ----- hand-made modules, traced as a model's regions are -----


class LlamaRMSNorm(torch.nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6)
        return self.weight * h.to(x.dtype)


class GemmaRMSNorm(torch.nn.Module):
    """(1 + weight), applied in float before the cast back."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(width) * 0.1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x.float()
        h = h * torch.pow(h.pow(2).mean(-1, keepdim=True) + 1e-6, -0.5)
        return (h * (1.0 + self.weight.float())).type_as(x)


class ResidualRMSNorm(LlamaRMSNorm):
    def forward(self, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        return super().forward(x + residual)


class LayerNormChain(torch.nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(width))
        self.bias = torch.nn.Parameter(torch.randn(width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x.float()
        mean = h.mean(-1, keepdim=True)
        variance = (h - mean).pow(2).mean(-1, keepdim=True)
        h = (h - mean) * torch.rsqrt(variance + 1e-5)
        return (h * self.weight.float() + self.bias.float()).to(x.dtype)


class MaskedSoftmax(torch.nn.Module):
    def forward(self, scores: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return torch.softmax(scores.float() * 0.125 + mask, dim=-1).to(scores.dtype)


class GatedActivation(torch.nn.Module):
    def __init__(self, kind: str) -> None:
        super().__init__()
        self.kind = kind

    def forward(self, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
        if self.kind == "silu":
            return F.silu(gate) * up
        if self.kind == "gelu_tanh":
            return F.gelu(gate, approximate="tanh") * up
        return (F.gelu(gate.float()) * up.float()).to(gate.dtype)  # erf, in float


class BiasActivation(torch.nn.Module):
    def __init__(self, width: int, activation) -> None:
        super().__init__()
        self.bias = torch.nn.Parameter(torch.randn(width))
        self.activation = activation

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.activation(x + self.bias)


class Rotary(torch.nn.Module):
    """transformers' apply_rotary_pos_emb on q of shape (batch, seq, heads, dim)."""

    def forward(self, q: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        q = q.transpose(1, 2)
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
        half = q.shape[-1] // 2
        rotated = torch.cat((-q[..., half:], q[..., :half]), dim=-1)
        return q * cos + rotated * sin


class GroupNormSiLU(torch.nn.Module):
    def __init__(self, channels: int, groups: int) -> None:
        super().__init__()
        self.groups = groups
        self.weight = torch.nn.Parameter(torch.randn(channels))
        self.bias = torch.nn.Parameter(torch.randn(channels))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.silu(F.group_norm(x, self.groups, self.weight, self.bias, 1e-6))


def handmade(dtype: torch.dtype, scale: int = 1) -> dict[str, tuple[torch.nn.Module, tuple, str]]:
    """Modules, their inputs and the family their region gets; ``scale`` grows the sizes."""
    torch.manual_seed(0)
    w, rows = 64 * scale, 6 * scale

    def x(*shape: int) -> torch.Tensor:
        return torch.randn(*shape).to(dtype)

    positions = 16 * scale
    return {
        "llama_rms_norm": (LlamaRMSNorm(w), (x(2, rows, w),), "region_rms_norm"),
        "gemma_rms_norm": (GemmaRMSNorm(w), (x(2, rows, w),), "region_rms_norm"),
        "residual_rms_norm": (ResidualRMSNorm(w), (x(rows, w), x(rows, w)), "region_rms_norm"),
        "layer_norm": (LayerNormChain(w), (x(rows, w),), "region_layer_norm"),
        "masked_softmax": (MaskedSoftmax(), (x(2, 4, positions, positions),
                                             torch.randn(1, 1, positions, positions)),
                           "region_softmax"),
        "gated_silu": (GatedActivation("silu"), (x(rows, 2 * w), x(rows, 2 * w)),
                       "region_gated_activation"),
        "gated_gelu_tanh": (GatedActivation("gelu_tanh"), (x(rows, 2 * w), x(rows, 2 * w)),
                            "region_gated_activation"),
        "gated_gelu_erf": (GatedActivation("gelu_erf"), (x(rows, 2 * w), x(rows, 2 * w)),
                           "region_gated_activation"),
        "bias_gelu": (BiasActivation(w, F.gelu), (x(rows, w),), "region_bias_activation"),
        "bias_silu": (BiasActivation(w, F.silu), (x(rows, w),), "region_bias_activation"),
        "bias_relu": (BiasActivation(w, F.relu), (x(rows, w),), "region_bias_activation"),
        "rotary": (Rotary(), (x(2, positions, 4, 32), x(2, positions, 32), x(2, positions, 32)),
                   "region_rotary"),
        "group_norm_silu": (GroupNormSiLU(32, 8), (
            x(2, 32, 4 * scale, 4 * scale).to(memory_format=torch.channels_last),),
            "region_group_norm"),
    }


def traced_region(module: torch.nn.Module, inputs: tuple) -> dict:
    """The one region of one forward of ``module``, as captured where its inputs are."""
    tracker = ModuleTracker(module)
    recorder = TraceRecorder(tracker)
    with torch.no_grad(), tracker, recorder:
        module(*inputs)
    (card,) = region_cards(recorder.trace, [], total_us=1.0).cards
    return card.region


@pytest.fixture(scope="module")
def handmade_cards() -> dict[str, tuple[OpCard, str, dict]]:
    """Each hand-made module's region card (module in bfloat16) as on the GPU, its expected
    family, and its region as captured on the CPU."""
    found = {}
    for name, (module, inputs, family) in handmade(torch.bfloat16).items():
        region = traced_region(module.to(torch.bfloat16), inputs)
        found[name] = (region_card(on_gpu(region)), family, region)
    return found


# ----- matching -----


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_each_tiny_model_region_gets_its_family_or_its_reason(name):
    _, card = sample(name)
    found = supports(card)
    expected = EXPECTED[name]
    if expected.startswith("declined: "):
        assert found.family is None and expected.removeprefix("declined: ") in found.reason
    else:
        assert found.family == expected, found.reason
        assert found.approaches


@pytest.mark.parametrize("name", MATCHED)
def test_a_matched_program_computes_what_the_region_computes(name):
    region, card = sample(name)
    program = match_region(card.region)
    for seed, offset in ((0, 0), (1, 3)):
        inputs = random_inputs(region, seed, offset)
        assert_matches(evaluate(program, inputs), eager(region, inputs), f"{name} seed {seed}")


@pytest.mark.parametrize("name", sorted(handmade(torch.float32)))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_hand_made_regions_are_matched_by_structure_in_every_dtype(name, dtype):
    module, inputs, family = handmade(dtype)[name]
    region = traced_region(module.to(dtype), inputs)
    card = region_card(on_gpu(region))
    assert supports(card).family == family
    program = match_region(card.region)
    fresh = random_inputs(region, seed=2)
    assert_matches(evaluate(program, fresh), eager(region, fresh), f"{name} {dtype}")


def test_the_rms_norm_program_reads_its_input_once_per_row_and_weights_per_column(handmade_cards):
    program = match_region(handmade_cards["llama_rms_norm"][0].region)
    (stage,) = program.stages
    assert stage.kind == "sum" and program.cols == 64 and program.rows == 12
    (output,) = program.outputs
    (piece,) = output.pieces
    assert output.dtype == "bfloat16" and output.stride == (384, 64, 1)
    weight = next(leaf for leaf in leaves(piece.expr) if leaf.input == 1)
    assert weight.stride == (0, 0, 1)  # broadcast over rows


def test_rotary_pieces_read_the_other_half_of_the_row(handmade_cards):
    program = match_region(handmade_cards["rotary"][0].region)
    (output,) = program.outputs
    assert [p.box[-1] for p in output.pieces] == [(0, 16), (16, 32)]
    q_offsets = {p.box[-1]: sorted(leaf.offset for leaf in leaves(p.expr) if leaf.input == 0)
                 for p in output.pieces}
    assert q_offsets == {(0, 16): [0, 16], (16, 32): [-16, 0]}


def test_outputs_permuted_in_memory_are_computed_in_memory_order():
    _, card = sample("qwen35-tiny/r_0de626019101")  # returns a transpose of its result
    (output,) = match_region(card.region).outputs
    assert output.shape == (2, 32, 4) and output.stride[-1] == 1
    assert output.eager.shape == (2, 4, 32)


# ----- declining -----


def ref(name: str) -> dict:
    return {"t": "ref", "v": name}


def tensor(shape: list[int], dtype: str = "bfloat16", stride: list[int] | None = None) -> dict:
    return example_tensor(shape, dtype, stride)


def node(op: str, *args, **kwargs) -> dict:
    return {"op": op, "args": list(args), "kwargs": kwargs}


def to_float(source: str, device: str = "cuda:0") -> dict:
    return node("aten._to_copy.default", ref(source), dtype={"t": "dtype", "v": "float32"},
                device={"t": "device", "v": device})


DECLINED = {
    "a mean over another dimension": (
        [tensor([4, 8, 16])],
        [node("aten.mean.dim", ref("x0"), [1], True), node("aten.sub.Tensor", ref("x0"), ref("n0"))],
        ["n1"], "reduces dimensions [1], not only the last"),
    "softmax over the first dimension": (
        [tensor([4, 16])],
        [to_float("x0"), node("aten._softmax.default", ref("n0"), 0, False)],
        ["n1"], "over dimension 0, not the last"),
    "an op no kernel computes": (
        [tensor([4, 16]), tensor([4, 16], "bool")],
        [node("aten.exp.default", ref("x0")), node("aten.masked_fill.Scalar", ref("n0"), ref("x1"), 0.0)],
        ["n1"], "aten.masked_fill.Scalar (node n1) is not an op the region kernels compute"),
    "an output that is a view of an input": (
        [tensor([4, 16])],
        [node("aten.exp.default", ref("x0")), node("aten.transpose.int", ref("x0"), 0, 1)],
        ["n0", "n1"], "output 1 is a view of input x0"),
    "outputs sharing memory": (
        [tensor([4, 16])],
        [node("aten.exp.default", ref("x0")), node("aten.transpose.int", ref("n0"), 0, 1)],
        ["n0", "n1"], "outputs share the memory of n0"),
    "a copy to the CPU": (
        [tensor([4, 16])],
        [to_float("x0", device="cpu"), node("aten.exp.default", ref("n0"))],
        ["n1"], "a copy to cpu is not a GPU kernel"),
    "an integer input": (
        [tensor([4, 16], "float32"), tensor([4, 16], "int64")],
        [node("aten.add.Tensor", ref("x0"), ref("x1")), node("aten.exp.default", ref("n0"))],
        ["n1"], "x1, read by aten.add.Tensor is int64"),
    "float64": (
        [tensor([4, 16], "float64")],
        [node("aten.exp.default", ref("x0")), node("aten.neg.default", ref("n0"))],
        ["n1"], "is float64"),
    "a view no strided read can express": (  # rows of a slice, copied, then flattened
        [tensor([4, 8], stride=[16, 1])],
        [node("aten.clone.default", ref("x0")), node("aten.view.default", ref("n0"), [32]),
         node("aten.exp.default", ref("n1")), node("aten.neg.default", ref("n2"))],
        ["n3"], "input x0 cannot be read through aten.view.default as a strided view"),
    "a cat read through a view that mixes its dimension": (
        [tensor([4, 8]), tensor([4, 8])],
        [node("aten.cat.default", {"t": "list", "items": [ref("x0"), ref("x1")]}, -1),
         node("aten.view.default", ref("n0"), [4, 4, 4]), node("aten.exp.default", ref("n1"))],
        ["n2"], "mixes its dimension with others"),
    "a row statistic read at other rows": (
        [tensor([4, 4, 16])],
        [node("aten.mean.dim", ref("x0"), [-1], True), node("aten.transpose.int", ref("n0"), 0, 1),
         node("aten.sub.Tensor", ref("x0"), ref("n1"))],
        ["n2"], "is read at other coordinates than it is computed at"),
    "a group norm with float32 weights on bfloat16": (
        [tensor([2, 8, 4, 4]), tensor([8], "float32"), tensor([8], "float32")],
        [node("aten.native_group_norm.default", ref("x0"), ref("x1"), ref("x2"), 2, 8, 16, 2, 1e-5),
         node("aten.silu.default", ref("n0.0"))],
        ["n1"], "the group norm's weight is not a bfloat16 tensor"),
}


@pytest.mark.parametrize("case", sorted(DECLINED))
def test_what_the_matcher_does_not_understand_is_declined_with_the_reason(case):
    inputs, nodes, outputs, reason = DECLINED[case]
    region = {"nodes": nodes, "inputs": inputs, "outputs": outputs}
    card = region_card(region)
    with pytest.raises(Declined, match=re.escape(reason)):
        make_plan(card, GPU)
    assert supports(card).family is None


def test_a_card_is_matched_at_its_own_arguments(handmade_cards):
    card, _, _ = handmade_cards["llama_rms_norm"]
    other = card.with_(args=[tensor([3, 5, 64], stride=[640, 128, 1]), card.args[1]])
    program = make_plan(other, GPU).problem.program
    assert (program.rows, program.cols) == (15, 64)
    (leaf,) = [leaf for leaf in leaves(program.stages[0].expr)]
    assert leaf.stride == (640, 128, 1)  # rows of a wider tensor, read in place


def test_range_cards_are_declined_and_exact_cards_keep_their_families(handmade_cards):
    card, _, _ = handmade_cards["llama_rms_norm"]
    ranges = {"symbols": [{"name": "L", "lo": 1, "hi": 8, "at": 6}], "laws": []}
    assert "exact variant" in supports(card.with_(ranges=ranges)).reason
    x = tensor([4, 64])
    softmax = OpCard("aten._softmax.default", [x, -1, False])
    assert supports(softmax).family == "softmax"
    assert "llm proposer writes range kernels" in supports(softmax.with_(ranges=ranges)).reason


# ----- kernels: compiled, planned, and run on the host -----


def candidates_of(card: OpCard) -> list[tuple[str, Candidate]]:
    """Every available variant of the card's family at its default point, and the reference
    at its safe point."""
    plan = make_plan(card, GPU)
    points = [(v, v.space.default) for v in plan.available]
    points.append((plan.reference, plan.reference.space.safe))
    return [(f"{plan.family.name}/{v.approach} {p}", build_candidate(plan, v, p, GPU, card, ""))
            for v, p in points]


def all_cards(handmade_cards) -> list[tuple[str, OpCard, dict]]:
    """(name, card as on the GPU, region as captured) of every region the library matches."""
    return ([(name, sample(name)[1], sample(name)[0]) for name in MATCHED]
            + [(name, card, region) for name, (card, _, region) in sorted(handmade_cards.items())])


def compile_and_check(jobs: list[tuple[str, Candidate, str]]) -> None:
    pytest.importorskip("cuda.core", reason="NVRTC through cuda.core is not installed")
    from kforge.runtime.nvrtc import Compiler
    from tests.propose.test_library_compile import assert_clean, compile_all

    for label, candidate, result in compile_all(Compiler(), jobs):
        assert_clean(label, candidate, result)


def test_each_region_family_compiles_for_sm90_without_spills(handmade_cards):
    """The first variant of each family, at its default point, on the first card it serves."""
    jobs, families = [], set()
    for name, card, _ in all_cards(handmade_cards):
        label, candidate = candidates_of(card)[0]
        if label.split("/")[0] not in families:
            families.add(label.split("/")[0])
            jobs.append((f"{name}: {label}", candidate, "sm_90"))
    assert len(families) >= 8
    compile_and_check(jobs)


@pytest.mark.slow
def test_every_region_kernel_compiles_for_sm90(handmade_cards):
    compile_and_check([(f"{name}: {label}", candidate, "sm_90")
                       for name, card, _ in all_cards(handmade_cards)
                       for label, candidate in candidates_of(card)])


def test_plans_allocate_eager_outputs_and_launch_the_kernels_the_source_defines(handmade_cards):
    for name, card, _ in all_cards(handmade_cards):
        eager_outputs = [o.eager for o in match_region(card.region).outputs]
        for label, candidate in candidates_of(card):
            resolved = resolve_for(candidate.plan, card.op, card.args, card.kwargs)
            assert [(tuple(o.shape), o.dtype) for o in resolved.outputs] == [
                (t.shape, t.dtype) for t in eager_outputs], f"{name}: {label}"
            for launch in candidate.plan["launches"]:
                for kernel in (launch["kernel"], launch.get("unaligned_kernel")):
                    assert kernel is None or f" {kernel}(" in candidate.source, f"{name}: {label}"


# The host: CUDA's spellings of the C++ a kernel uses, and a loop that runs a kernel's threads one
# after another. Rows kernels run with one thread per row, where no thread waits for another.
HOST_PRELUDE = r"""
#include <cmath>
#include <cstdint>
#include <utility>
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#define __global__
#define __device__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __shared__ static
struct HostDim { unsigned x = 0, y = 0, z = 0; };
static HostDim threadIdx, blockIdx, blockDim, gridDim;
inline float rsqrtf(float x) { return 1.f / std::sqrt(x); }
inline float __expf(float x) { return std::exp(x); }
inline float __shfl_xor_sync(unsigned, float v, int) { return v; }
inline void __syncthreads() {}
template <class... A, std::size_t... I>
void host_call(void (*kernel)(A...), void** args, std::index_sequence<I...>) {
  kernel(reinterpret_cast<A>(args[I])...);
}
template <class... A>
void host_run(void (*kernel)(A...), unsigned grid, unsigned block, void** args) {
  blockDim.x = block;
  gridDim.x = grid;
  for (unsigned b = 0; b < grid; ++b)
    for (unsigned t = 0; t < block; ++t) {
      blockIdx.x = b;
      threadIdx.x = t;
      host_call(kernel, args, std::index_sequence_for<A...>{});
    }
}
"""
KERNEL = re.compile(r'(extern "C" __global__ void __launch_bounds__\(\d+\) )(\w+)\(')


def host_headers() -> str | None:
    """A CUDA toolkit's headers, complete enough for host code (a runtime wheel's are not)."""
    from kforge.runtime.nvrtc import cuda_include_dirs

    homes = [os.environ.get("CUDA_HOME", ""), "/usr/local/cuda"]
    for folder in [*cuda_include_dirs(), *(os.path.join(h, "include") for h in homes if h)]:
        if os.path.exists(os.path.join(folder, "crt", "host_defines.h")):
            return folder
    return None


def host_library(candidates: list[Candidate], folder: Path, headers: str) -> ctypes.CDLL:
    """The candidates' kernels compiled for the host, candidate i's kernel K run by
    ``run_c<i>_<K>(grid, block, pointers)``."""
    shared = "\n".join(cuda_text(f) for f in ("common.cuh", *CUDA_FILES))
    parts = [HOST_PRELUDE, shared]
    for i, candidate in enumerate(candidates):
        assert candidate.source.startswith(shared)
        tail = candidate.source[len(shared):]
        parts.append(f"namespace c{i} {{\n"
                     + KERNEL.sub(lambda m: f"{m.group(1)}{m.group(2)}_c{i}(", tail) + "\n}")
        kernels = {name for launch in candidate.plan["launches"]
                   for name in (launch["kernel"], launch.get("unaligned_kernel")) if name}
        parts += [f'extern "C" void run_c{i}_{k}(unsigned g, unsigned b, void** a) '
                  f"{{ host_run(c{i}::{k}_c{i}, g, b, a); }}" for k in sorted(kernels)]
    text = "\n".join(parts)
    library = folder / f"regions_{hashlib.sha256(text.encode()).hexdigest()[:12]}.so"
    source = library.with_suffix(".cpp")
    source.write_text(text)
    done = subprocess.run(["g++", "-std=c++17", "-O1", "-w", "-shared", "-fPIC", f"-I{headers}",
                           str(source), "-o", str(library)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[:4000]
    return ctypes.CDLL(str(library))


def run_on_host(library: ctypes.CDLL, index: int, candidate: Candidate,
                inputs: list[torch.Tensor]) -> list[torch.Tensor]:
    """The candidate's plan carried out on the host: outputs allocated (filled with NaN), each
    launch run, its unaligned kernel where a pointer is not aligned for its vectors."""
    tensors = {f"x{i}": t for i, t in enumerate(inputs)}
    outputs = []
    for spec in candidate.plan["outputs"]:
        out = torch.empty_strided(spec["shape"], spec["stride"], dtype=torch_dtype(spec["dtype"]))
        out.fill_(math.nan)
        tensors[spec["name"]] = out
        outputs.append(out)
    for launch in candidate.plan["launches"]:
        pointers = [tensors[p["ptr"]] for p in launch["params"]]
        kernel = launch["kernel"]
        if "align" in launch and any(t.data_ptr() % launch["align"] for t in pointers):
            kernel = launch["unaligned_kernel"]
        args = (ctypes.c_void_p * len(pointers))(*(t.data_ptr() for t in pointers))
        getattr(library, f"run_c{index}_{kernel}")(launch["grid"][0], launch["block"][0], args)
    return outputs


def host_points(card: OpCard) -> list[tuple[str, Candidate]]:
    """Every approach at the widest and the narrowest vectors; rows kernels with one thread per
    row (the host runs threads one after another: none may wait for another)."""
    plan = make_plan(card, GPU)
    found = []
    for variant in plan.available:
        vecs = next(a.values for a in variant.space.axes if a.name == "vec")
        for vec in sorted({vecs[0], vecs[-1]}):
            if "threads_per_row" in variant.space.default:
                params = {"threads_per_row": 1, "rows_per_block": 32, "vec": vec}
            else:
                params = {"block": 64, "vec": vec, "unroll": 2}
            candidate = build_candidate(plan, variant, params, GPU, card, "")
            found.append((f"{plan.family.name}/{variant.approach} {params}", candidate))
    return found


@pytest.mark.slow
def test_the_kernels_run_on_the_host_give_eager_results(handmade_cards, tmp_path):
    headers = host_headers()
    if shutil.which("g++") is None or headers is None:
        pytest.skip("needs g++ and a CUDA toolkit's headers")
    cases = []
    for name, card, region in all_cards(handmade_cards):
        cases += [(f"{name}: {label}", region, candidate) for label, candidate in host_points(card)]
    library = host_library([c for _, _, c in cases], tmp_path, headers)
    for index, (label, region, candidate) in enumerate(cases):
        for offset in (0, 1):  # aligned vectors, then the unaligned kernels
            inputs = random_inputs(region, seed=index, offset=offset)
            got = run_on_host(library, index, candidate, inputs)
            assert_matches(got, eager(region, inputs), f"{label} offset {offset}")


# ----- the LLM's view of a region card -----


def test_the_prompt_shows_a_region_card_as_its_function_with_its_inputs(handmade_cards):
    card, _, _ = handmade_cards["llama_rms_norm"]
    text = card_section(card)
    source = Region.from_dict(card.region).source()
    assert f"```python\n{source}\n```" in text
    assert "schema:" not in text and "n4 = aten.rsqrt(n3)" in text
    assert "- x0: tensor bfloat16, shape [2, 6, 64], stride [384, 64, 1]" in text
    assert "- x1: tensor bfloat16, shape [64], stride [1]" in text
    assert "- output 0: bfloat16, shape [2, 6, 64], stride [384, 64, 1]" in text


# ----- laws -----


@given(st.floats(allow_nan=False, width=32))
def test_literals_are_exactly_the_float_eager_computes_with(value):
    text = literal(value)
    if "INFINITY" in text:
        assert math.isinf(value) and text.startswith("-") == (value < 0)
        return
    parsed = float.fromhex(text.removesuffix("f")) if "p" in text else float(text.removesuffix(".f"))
    single = struct.unpack("f", struct.pack("f", value))[0]
    assert parsed == single and math.copysign(1.0, parsed) == math.copysign(1.0, single)


@given(st.lists(st.integers(0, 1000), min_size=1, max_size=6))
def test_memory_order_runs_from_the_largest_stride_to_the_smallest(strides):
    order = memory_order(tuple(strides))
    assert sorted(order) == list(range(len(strides)))
    moving = [strides[d] for d in order if strides[d]]
    assert moving == sorted(moving, reverse=True)
