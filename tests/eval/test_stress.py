"""Stress input sets: kernels that pass "nice" samples and random sets fail here, honest ones
pass, and every set keeps its tensors' geometry, canaries and valid indices."""

from __future__ import annotations

import math

import pytest
import torch

from kforge.core.opcard import OpCard
from kforge.errors import KforgeError
from kforge.eval.verify.compare import compare_values
from kforge.eval.verify.inputs import InputFactory, InputSet
from kforge.eval.verify.ops import resolve_op
from kforge.eval.verify.stress import (
    card_family,
    op_family,
    stress_kinds,
    stress_set,
    usable_stress_sets,
)
from tests.eval.candidates import (
    add_card,
    layer_norm_card,
    relu_card,
    softmax_card,
    tensor,
)
from tests.eval.redteam import region_card
from tests.eval.standins import (
    add,
    layer_norm_one_pass_variance,
    layer_norm_two_pass,
    layer_norm_welford,
    layer_norm_without_eps,
    relu,
    softmax_fp32_accumulation,
    softmax_without_max_subtraction,
)

CPU = torch.device("cpu")


def first_result(value):
    return value[0] if isinstance(value, tuple) else value


def matches_eager(card: OpCard, kernel, inputs: InputSet) -> bool:
    eager = first_result(resolve_op(card.op)(*inputs.args, **inputs.kwargs))
    return compare_values(kernel(*inputs.args, **inputs.kwargs), eager).ok


def save_sample(folder, card: OpCard, *tensors: torch.Tensor) -> None:
    (folder / card.key).mkdir()
    torch.save({"args": list(tensors), "kwargs": {}}, folder / card.key / "0.pt")


@pytest.mark.parametrize("op, family", [
    ("aten._softmax.default", "softmax"), ("aten._log_softmax.default", "softmax"),
    ("aten.native_layer_norm.default", "norm"), ("aten.native_group_norm.default", "norm"),
    ("aten.rms_norm.default", "norm"), ("aten._native_batch_norm_legit.default", "norm"),
    ("aten.relu_.default", "activation"), ("aten.gelu.default", "activation"),
    ("aten.threshold_backward.default", "activation"), ("aten.add.Tensor", "elementwise"),
    ("aten.where.self", "elementwise"), ("aten.sum.dim_IntList", "reduction"),
    ("aten.amax.default", "reduction"), ("aten.max_pool2d_with_indices.default", "pooling"),
    ("aten.embedding.default", "index"), ("aten.gather.default", "index"),
    ("aten.mm.default", "generic"), ("aten.native_layer_norm_backward.default", "generic"),
])
def test_families_come_from_the_op_name(op, family):
    assert op_family(op) == family


def r(name: str) -> dict:
    return {"t": "ref", "v": name}


@pytest.mark.parametrize("nodes, family", [
    ([("aten.pow.Tensor_Scalar", r("x1"), 2), ("aten.mean.dim", r("n0"), [-1], True),
      ("aten.add.Tensor", r("n1"), 1e-6), ("aten.rsqrt.default", r("n2")),
      ("aten.mul.Tensor", r("x1"), r("n3")), ("aten.mul.Tensor", r("x0"), r("n4"))], "norm"),
    ([("aten.pow.Tensor_Scalar", r("x1"), 2), ("aten.mean.dim", r("n0"), [-1], True),
      ("aten.add.Tensor", r("n1"), 1e-6), ("aten.pow.Tensor_Scalar", r("n2"), -0.5),
      ("aten.mul.Tensor", r("x1"), r("n3"))], "norm"),
    ([("aten.add.Tensor", r("x1"), r("x0")), ("aten._softmax.default", r("n0"), -1, False)],
     "softmax"),
    ([("aten.amax.default", r("x1"), [-1], True), ("aten.sub.Tensor", r("x1"), r("n0")),
      ("aten.exp.default", r("n1")), ("aten.sum.dim_IntList", r("n2"), [-1], True),
      ("aten.div.Tensor", r("n2"), r("n3"))], "softmax"),
    ([("aten.silu.default", r("x1")), ("aten.mul.Tensor", r("n0"), r("x0"))], "activation"),
    ([("aten.mean.dim", r("x1"), [-1], True), ("aten.mul.Tensor", r("n0"), 2.0)], "reduction"),
    ([("aten.mul.Tensor", r("x1"), r("x0")), ("aten.add.Tensor", r("n0"), 1.0)], "elementwise"),
    ([("aten.mm.default", r("x1"), r("x0")), ("aten.gelu.default", r("n0"))],
     "generic"),  # a fused linear: no extremes that overflow
])
def test_a_region_takes_the_family_of_what_it_fuses(nodes, family):
    # x0 is a [64] weight (a [64, 1] matrix for the matmul), x1 the [4, 64] activations the
    # family's stress values go to.
    weight = [64, 1] if nodes[0][0] == "aten.mm.default" else [64]
    card = region_card(nodes, [tensor(weight), tensor([4, 64])])
    assert card_family(card) == family
    stress = usable_stress_sets(InputFactory(card, CPU), 11)[0]
    assert stress, "no stress set"
    if family in ("norm", "softmax"):  # only the activations are stressed, the weight is not
        large = next(s for s in stress if "large magnitudes" in s.label)
        weight, activations = large.args
        assert activations.abs().mean() > 100 and weight.abs().mean() < 10


def test_kinds_follow_the_family_and_the_tensors():
    assert stress_kinds(softmax_card(4, 8)) == ["large_magnitudes", "constant", "moving_mask",
                                                "extremes", "special_values"]
    assert stress_kinds(relu_card([8])) == ["large_magnitudes", "mixed_signs", "extremes",
                                            "special_values"]
    assert stress_kinds(layer_norm_card(4, 8)) == ["large_magnitudes", "constant", "extremes",
                                                   "special_values"]
    matmul = OpCard("aten.mm.default", [tensor([8, 8]), tensor([8, 8])])
    assert "special_values" not in stress_kinds(matmul)
    embedding = OpCard("aten.embedding.default", [tensor([50, 8]), tensor([64], "int64")])
    assert "full_range" in stress_kinds(embedding)
    assert stress_kinds(OpCard("aten.add.Tensor", [tensor([8], "int32"), tensor([8], "int32")])
                        ) == ["full_range"]


def test_sets_are_deterministic_per_seed_labelled_and_differ_between_seeds():
    factory = InputFactory(softmax_card(8, 64), CPU)
    a, b = stress_set(factory, "moving_mask", 7), stress_set(factory, "moving_mask", 7)
    assert a.label == "stress: moving mask (seed 7)"
    assert torch.equal(a.buffers[0].base.view(torch.uint8), b.buffers[0].base.view(torch.uint8))
    c = stress_set(factory, "moving_mask", 8)
    assert not torch.equal(torch.isinf(a.args[0]), torch.isinf(c.args[0]))
    assert stress_set(factory, "large_magnitudes", 7).label == "stress: large magnitudes (seed 7)"


def test_unknown_kinds_are_refused():
    with pytest.raises(KforgeError, match="unknown stress kind 'huge'"):
        stress_set(InputFactory(relu_card([8]), CPU), "huge", 0)


def test_every_set_keeps_strides_offsets_and_canaries():
    spec = tensor([4, 6], stride=[1, 8], offset=3)  # transposed-like, with gaps and an offset
    cards = [OpCard("aten._softmax.default", [spec, 0, False]),
             OpCard("aten.add.Tensor", [tensor([4, 8]), tensor([4, 8], stride=[0, 1])])]
    for card in cards:
        factory = InputFactory(card, CPU)
        for kind in stress_kinds(card):
            inputs = stress_set(factory, kind, 1)
            for buf, g in zip(inputs.buffers, factory.geometries):
                assert tuple(buf.view.stride()) == g.stride
                assert buf.view.storage_offset() == g.offset
                outside = buf.base[~buf.view_mask()]
                assert torch.isnan(outside).all(), f"{kind}: canary overwritten"
                if kind != "special_values":  # which holds NaN on purpose
                    assert not torch.isnan(buf.region()).any(), f"{kind}: a gap left unfilled"
            assert inputs.changed(set()) == []
    strided = stress_set(InputFactory(cards[0], CPU), "constant", 0).args[0]
    assert bool((strided == strided[:1]).all())  # constant along dim 0, the softmax dim


def test_large_magnitudes_break_softmax_without_max_subtraction():
    for dtype in ("float32", "bfloat16", "float16"):
        card = softmax_card(8, 256, dtype)
        factory = InputFactory(card, CPU)
        assert matches_eager(card, softmax_without_max_subtraction, factory.random_set(0))
        stress = stress_set(factory, "large_magnitudes", 0)
        eager = resolve_op(card.op)(*stress.args)
        assert torch.isfinite(eager).all()
        report = compare_values(softmax_without_max_subtraction(*stress.args), eager)
        assert not report.ok and "NaN positions" in report.reason


def test_mixed_signs_catch_relu_that_zeroes_where_the_sample_was_negative(tmp_path):
    card = relu_card([16, 64])
    sample = torch.randn(16, 64) - 6  # mostly negative, as after a large negative bias
    save_sample(tmp_path, card, sample)
    negative_in_sample = sample < 0

    def cheat(x):
        return torch.where(negative_in_sample, torch.zeros_like(x), relu(x))

    factory = InputFactory(card, CPU, tmp_path)
    assert all(matches_eager(card, cheat, s) for s in factory.sets(seeds=(0, 1)))
    assert not matches_eager(card, cheat, stress_set(factory, "mixed_signs", 0))


def test_mixed_signs_catch_relu_that_leaves_half_its_output_zero(tmp_path):
    card = relu_card([16, 64])
    save_sample(tmp_path, card, torch.randn(16, 64) - 6)

    def half_done(x):
        out = torch.zeros_like(x)
        out.view(-1)[::2] = relu(x).view(-1)[::2]
        return out

    factory = InputFactory(card, CPU, tmp_path)
    assert all(matches_eager(card, half_done, s) for s in factory.sets(seeds=(0, 1)))
    assert not matches_eager(card, half_done, stress_set(factory, "mixed_signs", 3))


def test_mixed_signs_are_half_negative_with_zeros_and_tiny_values_in_a_moving_pattern():
    factory = InputFactory(relu_card([40, 50]), CPU)
    x = stress_set(factory, "mixed_signs", 0).args[0]
    y = stress_set(factory, "mixed_signs", 1).args[0]
    assert int(torch.signbit(x).sum()) == x.numel() // 2
    assert int((x == 0).sum()) > 0
    tiny = torch.finfo(torch.float32).smallest_normal
    assert int(((x.abs() > 0) & (x.abs() < 8 * tiny)).sum()) > 0
    assert not torch.equal(torch.signbit(x), torch.signbit(y))


def test_a_moving_mask_catches_a_hard_coded_mask_position(tmp_path):
    card = softmax_card(8, 16)
    logits = torch.randn(8, 16)
    logits[:, 12:] = -math.inf  # the sample's padding: always the last four columns
    save_sample(tmp_path, card, logits)

    def fixed_mask(x, dim, half_to_float):
        out = torch.zeros_like(x)
        out[:, :12] = torch.softmax(x[:, :12], -1)
        return out

    factory = InputFactory(card, CPU, tmp_path)
    assert all(matches_eager(card, fixed_mask, s) for s in factory.sets(seeds=(0, 1)))
    moved = stress_set(factory, "moving_mask", 0).args[0]
    assert int(torch.isinf(moved).sum()) == int(torch.isinf(logits).sum())  # count kept
    assert bool(torch.isfinite(moved).any(-1).all())  # never a whole row
    assert not matches_eager(card, fixed_mask, stress_set(factory, "moving_mask", 0))


def test_without_a_sample_a_quarter_is_masked_and_every_row_keeps_a_finite_value():
    factory = InputFactory(softmax_card(64, 3), CPU)
    for seed in range(4):
        x = stress_set(factory, "moving_mask", seed).args[0]
        assert bool(torch.isfinite(x).any(-1).all())
        assert bool(torch.isneginf(x).any())


def test_large_magnitudes_catch_one_pass_variance_and_constant_rows_a_missing_eps():
    card = layer_norm_card(16, 512)
    factory = InputFactory(card, CPU)
    assert matches_eager(card, layer_norm_one_pass_variance, factory.random_set(0))
    assert not matches_eager(card, layer_norm_one_pass_variance,
                             stress_set(factory, "large_magnitudes", 0))
    assert matches_eager(card, layer_norm_without_eps, factory.random_set(0))
    constant = stress_set(factory, "constant", 0)
    x = constant.args[0]
    assert bool((x == x[:, :1]).all())  # variance 0 in every row
    assert not matches_eager(card, layer_norm_without_eps, constant)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_honest_kernels_pass_every_stress_set(dtype):
    honest = [(softmax_card(8, 300, dtype), softmax_fp32_accumulation),
              (layer_norm_card(8, 512, dtype), layer_norm_two_pass),
              (layer_norm_card(8, 512, dtype), layer_norm_welford),
              (relu_card([8, 100], dtype), relu),
              (add_card([8, 100], dtype), add)]
    for card, kernel in honest:
        factory = InputFactory(card, CPU)
        for seed in (0, 1):
            sets, dropped = usable_stress_sets(factory, seed)
            for inputs in sets:
                assert matches_eager(card, kernel, inputs), f"{card.op} {inputs.label}"
            assert dropped == {}


def test_indices_stay_valid_and_the_full_range_reaches_both_ends():
    card = OpCard("aten.embedding.default", [tensor([50, 8]), tensor([256], "int64")])
    factory = InputFactory(card, CPU)
    for inputs in usable_stress_sets(factory, 2)[0]:
        ids = inputs.args[1]
        assert 0 <= int(ids.min()) and int(ids.max()) < 50, inputs.label
    ids = stress_set(factory, "full_range", 2).args[1]
    assert int(ids.min()) == 0 and int(ids.max()) == 49
    gather = OpCard("aten.gather.default", [tensor([7, 3]), -1, tensor([7, 3], "int64")])
    index = stress_set(InputFactory(gather, CPU), "full_range", 0).args[2]
    assert 0 <= int(index.min()) and int(index.max()) <= 2


def test_integer_arithmetic_gets_the_dtypes_whole_range_and_booleans_both_values():
    ints = OpCard("aten.add.Tensor", [tensor([64], "int32"), tensor([64], "int32")])
    x = stress_set(InputFactory(ints, CPU), "full_range", 0).args[0]
    info = torch.iinfo(torch.int32)
    assert int(x.min()) == info.min and int(x.max()) == info.max
    where = OpCard("aten.where.self", [tensor([64], "bool"), tensor([64]), tensor([64])])
    condition = stress_set(InputFactory(where, CPU), "full_range", 0).args[0]
    assert int(condition.sum()) == 32


def test_extremes_reach_the_dtypes_edges_and_eager_stays_finite():
    # An activation takes values near the maximum; a product of two operands must stay finite.
    for card, largest in ((relu_card([64, 64], "bfloat16"), lambda m: m / 32),
                          (add_card([64, 64], "float16"), lambda m: math.sqrt(m) / 4)):
        inputs = stress_set(InputFactory(card, CPU), "extremes", 0)
        x = inputs.args[0].float()
        info = torch.finfo(inputs.args[0].dtype)
        assert bool(((x.abs() > 0) & (x.abs() < info.smallest_normal)).any())  # subnormals
        assert float(x.abs().max()) >= largest(info.max)
        assert bool(torch.isfinite(resolve_op(card.op)(*inputs.args)).all())


def test_a_kind_that_makes_eager_all_nan_is_dropped_with_its_reason():
    card = OpCard("aten.acos.default", [tensor([32, 32])])  # NaN beyond [-1, 1]
    factory = InputFactory(card, CPU)
    sets, dropped = usable_stress_sets(factory, 0)
    assert "large_magnitudes" in dropped
    assert "all NaN" in dropped["large_magnitudes"]
    assert "large magnitudes" not in " ".join(s.label for s in sets)
    assert any(s.label.startswith("stress: mixed signs") for s in sets)


def test_special_values_leave_most_rows_of_a_row_family_answerable():
    factory = InputFactory(softmax_card(16, 64), CPU)
    x = stress_set(factory, "special_values", 3).args[0]
    touched = (~torch.isfinite(x) | ((x == 0) & x.signbit())).any(-1)
    assert 1 <= int(touched.sum()) <= 4
    assert bool(torch.isnan(x).any()) and bool(torch.isposinf(x).any())


def test_special_values_scatter_nan_inf_and_signed_zeros_elsewhere():
    x = stress_set(InputFactory(relu_card([64, 64]), CPU), "special_values", 3).args[0]
    for test in (torch.isnan, torch.isposinf, torch.isneginf):
        assert int(test(x).sum()) >= 64
    assert int(((x == 0) & x.signbit()).sum()) >= 64 and int(((x == 0) & ~x.signbit()).sum()) >= 64


def test_a_norm_gets_nan_only():
    x = stress_set(InputFactory(layer_norm_card(16, 64), CPU), "special_values", 3).args[0]
    assert bool(torch.isnan(x).any()) and not bool(torch.isinf(x).any())
