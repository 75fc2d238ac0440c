"""The library's kernels on a GPU: every variant of every family, in every dtype, launched through
its plan by the evaluator, passes the evaluator's verification (captured-style and random inputs,
NaN/Inf positions, layouts, poisoned outputs, untouched inputs) at shapes with odd sizes, widths
that are no multiple of a vector, broadcast operands and strided views."""

from __future__ import annotations

import pytest
import torch

from kforge.core.opcard import OpCard
from kforge.propose.library.examples import DTYPES, channels_last, example_cards, tensor
from kforge.propose.library.proposer import build_candidate, make_plan

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def extra_cards(dtype: str) -> dict[str, OpCard]:
    """Shapes beyond the examples: larger, odd, strided, broadcast."""
    t = lambda shape, **kw: tensor(shape, dtype, **kw)
    half = "float16"  # half_to_float exists for float16 input only (eager refuses bfloat16)
    return {
        "softmax_odd": OpCard("aten._softmax.default", [t([3, 1001]), -1, False]),
        "softmax_attention": OpCard("aten._softmax.default", [t([1, 4, 256, 256]), -1, False]),
        "softmax_sliced_rows": OpCard("aten._softmax.default", [t([4, 8, 96], stride=[1024, 128, 1]), -1, False]),
        "softmax_trailing_one": OpCard("aten._softmax.default", [t([8, 77, 1]), 1, False]),
        "softmax_half_to_float_odd": OpCard("aten._softmax.default", [tensor([5, 333], half), -1, True]),
        "layer_norm_odd": OpCard("aten.native_layer_norm.default", [t([3, 1001]), [1001], t([1001]), None, 1e-5]),
        "layer_norm_wide": OpCard("aten.native_layer_norm.default",
                                  [t([2, 64, 1536]), [1536], None, None, 1e-6]),
        "layer_norm_sliced_rows": OpCard("aten.native_layer_norm.default",
                                         [t([6, 96], stride=[128, 1]), [96], t([96]), t([96]), 1e-5]),
        "layer_norm_two_dims": OpCard("aten.native_layer_norm.default",
                                      [t([4, 6, 10]), [6, 10], t([6, 10]), t([6, 10]), 1e-5]),
        "rms_norm_no_weight_no_eps": OpCard("aten._fused_rms_norm.default", [t([3, 1537]), [1537], None, None]),
        "rms_norm_heads": OpCard("aten._fused_rms_norm.default", [t([1, 128, 24, 64]), [64], t([64]), 1e-6]),
        "group_norm_odd_hw": OpCard("aten.native_group_norm.default",
                                    [t([3, 32, 7, 7]), t([32]), t([32]), 3, 32, 49, 8, 1e-5]),
        "group_norm_vae": OpCard("aten.native_group_norm.default",
                                 [t([1, 128, 128, 128]), t([128]), t([128]), 1, 128, 16384, 32, 1e-6]),
        "relu_channels_last": OpCard("aten.relu.default", [channels_last([2, 16, 9, 9], dtype)]),
        "sigmoid_odd": OpCard("aten.sigmoid.default", [t([1001])]),
        "sub_alpha_scalar": OpCard("aten.sub.Tensor", [t([7, 33]), 3.0], {"alpha": 2}),
        "div_broadcast": OpCard("aten.div.Tensor", [t([4, 1, 30]), t([5, 1])]),
        "mul_zero_dim": OpCard("aten.mul.Tensor", [t([6, 40]), tensor([], "float32")]),
        "add_modulation": OpCard("aten.add.Tensor", [t([2, 50, 64]), t([2, 1, 64])]),
        "mul__sliced": OpCard("aten.mul_.Tensor", [t([6, 40], stride=[64, 1]), t([40])]),
        "pow_generic": OpCard("aten.pow.Tensor_Scalar", [t([5, 17]), 1.5]),
        "pow_rsqrt": OpCard("aten.pow.Tensor_Scalar", [t([5, 1]), -0.5]),
        "to_half": OpCard("aten._to_copy.default", [tensor([6, 30], "float32")],
                          {"dtype": {"t": "dtype", "v": dtype}}),
        "sum_columns": OpCard("aten.sum.dim_IntList", [t([4, 77, 96]), [1]]),
        "mean_odd_rows": OpCard("aten.mean.dim", [t([7, 1537]), [-1], True]),
        "mean_to_float": OpCard("aten.mean.dim", [t([3, 40]), [1]], {"dtype": {"t": "dtype", "v": "float32"}}),
        "mean_all": OpCard("aten.mean.dim", [t([9, 11]), None]),
        "adaptive_channels_last": OpCard("aten._adaptive_avg_pool2d.default",
                                         [channels_last([2, 32, 7, 7], dtype), [1, 1]]),
        "max_pool_channels_last": OpCard("aten.max_pool2d_with_indices.default",
                                         [channels_last([2, 16, 11, 11], dtype), [3, 3], [2, 2], [1, 1]]),
        "max_pool_ceil_dilated": OpCard("aten.max_pool2d_with_indices.default",
                                        [t([2, 3, 13, 10]), [3, 2], [2, 1], [1, 0], [2, 1], True]),
        "embedding_int32": OpCard("aten.embedding.default", [t([500, 96]), tensor([4, 9], "int32")]),
        "embedding_wide": OpCard("aten.embedding.default", [t([1000, 1536]), tensor([64], "int64")]),
        "conv1d_contiguous_bias": OpCard("aten.convolution.default",
                                         [t([2, 64, 50]), t([64, 1, 3]), t([64]), [2], [1], [1], False, [0], 64]),
        "conv1d_causal": OpCard("aten.convolution.default",
                                [t([1, 256, 100], stride=[25600, 1, 256]), t([256, 1, 4]), None,
                                 [1], [3], [1], False, [0], 256]),
        # Views one element in: vector kernels hand over to their scalar twins, which run under
        # the same grid and must still cover every output.
        "softmax_misaligned": OpCard("aten._softmax.default", [t([6, 200], offset=1), -1, False]),
        "add_misaligned": OpCard("aten.add.Tensor", [t([6, 64], offset=1), t([64])]),
        "mean_channels_last_misaligned": OpCard(
            "aten.mean.dim", [t([2, 64, 7, 7], stride=[3136, 1, 448, 64], offset=1), [-1, -2], True]),
        "embedding_misaligned": OpCard("aten.embedding.default",
                                       [t([50, 64], offset=1), tensor([3, 7], "int64")]),
        **coverage_cards(dtype),
    }


def coverage_cards(dtype: str) -> dict[str, OpCard]:
    """Inference batch_norm, reductions over any dimensions, cat and clone, rotary pieces,
    transposed norms, max_pool's unrolled kernel, decode embeddings and group_norm on chip."""
    t = lambda shape, **kw: tensor(shape, dtype, **kw)
    f32 = lambda shape, **kw: tensor(shape, "float32", **kw)
    params = lambda c: [t([c]), t([c]), t([c]), t([c])]
    return {
        "batch_norm_resnet": OpCard("aten.native_batch_norm.default",
                                    [t([4, 64, 14, 14]), *params(64), False, 0.1, 1e-5]),
        "batch_norm_7x7": OpCard("aten.native_batch_norm.default",
                                 [t([3, 256, 7, 7]), *params(256), False, 0.1, 1e-5]),
        "batch_norm_channels_last_mixed": OpCard(
            "aten._native_batch_norm_legit_no_training.default",
            [channels_last([2, 48, 9, 9], dtype), f32([48]), f32([48]), f32([48]), f32([48]), 0.1, 1e-3]),
        "batch_norm_wide": OpCard("aten.native_batch_norm.default",
                                  [t([2, 5000, 3, 3]), *params(5000), False, 0.1, 1e-5]),
        "cat_attention": OpCard("aten.cat.default",
                                [[t([2, 4, 64, 16], stride=[4096, 16, 64, 1]),
                                  t([2, 4, 13, 16], stride=[832, 16, 64, 1])], 2]),
        "cat_rotary_halves": OpCard("aten.cat.default",
                                    [[t([2, 8, 5, 32]), t([2, 8, 5, 32], stride=[2560, 64, 512, 1],
                                                          offset=32)], -1]),
        "cat_empty_cache": OpCard("aten.cat.default", [[t([0]), t([2, 1, 33, 64])], -2]),
        "cat_int64": OpCard("aten.cat.default", [[tensor([3, 5], "int64"), tensor([3, 2], "int64")], 1]),
        "clone_transposed": OpCard("aten.clone.default", [t([6, 40, 24], stride=[960, 1, 40])],
                                   {"memory_format": {"t": "memory_format", "v": "contiguous_format"}}),
        "cos_rotary": OpCard("aten.cos.default", [f32([1, 32, 64])]),
        "sin_rotary": OpCard("aten.sin.default", [f32([3, 2, 32, 4], stride=[256, 128, 4, 1])]),
        "mean_norm_q": OpCard("aten.mean.dim", [f32([2, 4, 64, 16], stride=[4096, 16, 64, 1]), [-1], True]),
        "sum_interleaved": OpCard("aten.sum.dim_IntList", [t([5, 30, 7]), [0, 2]]),
        "sum_all_split": OpCard("aten.sum.default", [t([256, 4099])]),
        "mean_all_dtype": OpCard("aten.mean.default", [t([33, 77])],
                                 {"dtype": {"t": "dtype", "v": "float32"}}),
        "amax_rows": OpCard("aten.amax.default", [t([8, 3000]), [-1], True]),
        "amin_columns": OpCard("aten.amin.default", [t([4, 33, 96]), [1]]),
        "layer_norm_unet": OpCard("aten.native_layer_norm.default",
                                  [t([2, 576, 320], stride=[184320, 1, 576]), [320], t([320]), t([320]), 1e-5]),
        "rms_norm_transposed": OpCard("aten._fused_rms_norm.default",
                                      [t([2, 100, 64], stride=[6400, 1, 100]), [64], t([64]), 1e-6]),
        "softmax_dim1": OpCard("aten._softmax.default", [t([4, 77, 49]), 1, False]),
        "max_pool_resnet": OpCard("aten.max_pool2d_with_indices.default",
                                  [t([4, 64, 56, 56]), [3, 3], [2, 2], [1, 1]]),
        "embedding_decode": OpCard("aten.embedding.default", [t([8192, 1536]), tensor([1, 1], "int64"), 0]),
        "embedding_decode_batch": OpCard("aten.embedding.default", [t([4096, 2304]), tensor([8, 1], "int32")]),
        # Groups of 16 KiB (one block), 256 KiB (a cluster, or chained blocks), 2 MiB (chained).
        "group_norm_resident": OpCard("aten.native_group_norm.default",
                                      [t([2, 64, 32, 32]), t([64]), t([64]), 2, 64, 1024, 8, 1e-5]),
        "group_norm_cluster": OpCard("aten.native_group_norm.default",
                                     [t([1, 128, 64, 64]), t([128]), t([128]), 1, 128, 4096, 4, 1e-6]),
        "group_norm_chained": OpCard("aten.native_group_norm.default",
                                     [t([1, 128, 256, 256]), None, None, 1, 128, 65536, 8, 1e-6]),
    }


def all_cards(dtype: str) -> dict[str, OpCard]:
    return {**example_cards(dtype), **extra_cards(dtype)}


NAMES = sorted(all_cards("float32"))


@pytest.fixture(scope="module")
def gpu_eval():
    from kforge.eval.process.local import device_context, evaluate_local
    from kforge.eval.verify.pipeline import EvalSettings
    from kforge.runtime.timing import TimingPlan

    settings = EvalSettings(timing=TimingPlan(warmup=1, min_reps=5, max_reps=20, budget_s=0.02),
                            compile_baseline=False)
    gpu = device_context(0).gpu
    return gpu, lambda card, candidate: evaluate_local(card, candidate, settings=settings)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", NAMES)
def test_every_variant_passes_verification(gpu_eval, name, dtype):
    gpu, evaluate = gpu_eval
    card = all_cards(dtype)[name]
    plan = make_plan(card, gpu)
    points = [(v, v.space.default) for v in plan.available]
    points.append((plan.reference, plan.reference.space.safe))
    failures = []
    for variant, params in points:
        candidate = build_candidate(plan, variant, params, gpu, card, "")
        outcome = evaluate(card, candidate)
        if not outcome.ok:
            failures.append(f"{variant.approach} {params}: {outcome.status.value}: {outcome.summary}")
    assert not failures, f"{name} ({dtype}):\n" + "\n".join(failures)
