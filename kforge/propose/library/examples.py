"""Small example cards, one or more per family and main variant, in any float dtype, at uneven
sizes: the cards the library's own checks compile, launch and verify."""

from __future__ import annotations

from kforge.core.opcard import OpCard
from kforge.propose.library.cards import contiguous_strides

DTYPES = ("float32", "float16", "bfloat16")


def tensor(shape: list[int], dtype: str, stride: list[int] | None = None, offset: int = 0) -> dict:
    """A tensor arg spec; packed row-major unless ``stride`` says otherwise."""
    return {"t": "tensor", "shape": list(shape),
            "stride": list(stride) if stride is not None else list(contiguous_strides(shape)),
            "dtype": dtype, "offset": offset}


def channels_last(shape: list[int], dtype: str) -> dict:
    _, c, h, w = shape
    return tensor(shape, dtype, [h * w * c, 1, w * c, c])


def example_cards(dtype: str) -> dict[str, OpCard]:
    """Named cards covering every family (and its main variants) at small, uneven sizes."""
    t = lambda shape, **kw: tensor(shape, dtype, **kw)
    half = "float16"  # half_to_float exists for float16 input only (eager refuses bfloat16)
    return {
        "softmax": OpCard("aten._softmax.default", [t([6, 200]), -1, False]),
        "softmax_long": OpCard("aten._softmax.default", [t([3, 40000]), -1, False]),
        "softmax_half_to_float": OpCard("aten._softmax.default", [tensor([4, 8, 96], half), -1, True]),
        "layer_norm": OpCard("aten.native_layer_norm.default",
                             [t([2, 7, 96]), [96], t([96]), t([96]), 1e-5]),
        "layer_norm_plain": OpCard("aten.native_layer_norm.default", [t([5, 130]), [130], None, None, 1e-6]),
        "rms_norm": OpCard("aten._fused_rms_norm.default", [t([3, 4, 64]), [64], t([64]), 1e-6]),
        "group_norm": OpCard("aten.native_group_norm.default",
                             [t([2, 64, 6, 6]), t([64]), t([64]), 2, 64, 36, 32, 1e-6]),
        "group_norm_split": OpCard("aten.native_group_norm.default",
                                   [t([1, 32, 64, 64]), None, None, 1, 32, 4096, 8, 1e-5]),
        "relu_": OpCard("aten.relu_.default", [t([2, 3, 17, 9])]),
        "silu": OpCard("aten.silu.default", [t([5, 333])]),
        "gelu_tanh": OpCard("aten.gelu.default", [t([4, 100])], {"approximate": "tanh"}),
        "gelu_erf": OpCard("aten.gelu.default", [t([4, 100])]),
        "add_bias": OpCard("aten.add.Tensor", [t([6, 64]), t([64])], {"alpha": 0.5}),
        "add_": OpCard("aten.add_.Tensor", [t([2, 8, 5, 5]), t([2, 8, 5, 5])]),
        "mul_rows": OpCard("aten.mul.Tensor", [t([6, 64]), t([6, 1])]),
        "mul_scalar": OpCard("aten.mul.Tensor", [t([3, 50]), 1.5]),
        "add_transposed": OpCard("aten.add.Tensor", [t([16, 24], stride=[1, 16]), t([16, 24])]),
        "pow": OpCard("aten.pow.Tensor_Scalar", [t([4, 64]), 2]),
        "to_float": OpCard("aten._to_copy.default", [t([4, 33])], {"dtype": {"t": "dtype", "v": "float32"}}),
        "addcmul": OpCard("aten.addcmul.default", [t([3, 5, 8]), t([5, 1]), t([8])], {"value": 0.5}),
        "mean_rows": OpCard("aten.mean.dim", [t([4, 10, 7, 7]), [-1, -2], True]),
        "mean_channels_last": OpCard("aten.mean.dim", [channels_last([2, 64, 7, 7], dtype), [-1, -2], True]),
        "sum_rows": OpCard("aten.sum.dim_IntList", [t([6, 100]), [1]]),
        "adaptive_avg_pool": OpCard("aten._adaptive_avg_pool2d.default", [t([2, 8, 7, 7]), [1, 1]]),
        "adaptive_avg_pool_window": OpCard("aten._adaptive_avg_pool2d.default", [t([2, 3, 10, 9]), [4, 3]]),
        "max_pool": OpCard("aten.max_pool2d_with_indices.default", [t([2, 4, 15, 15]), [3, 3], [2, 2], [1, 1]]),
        "embedding": OpCard("aten.embedding.default", [t([50, 64]), tensor([3, 7], "int64")]),
        "conv1d_depthwise": OpCard("aten.convolution.default",
                                   [t([2, 48, 40], stride=[1920, 1, 48]), t([48, 1, 4]), t([48]),
                                    [1], [3], [1], False, [0], 48]),
        "batch_norm": OpCard("aten.native_batch_norm.default",
                             [t([2, 12, 5, 5]), t([12]), t([12]), t([12]), t([12]), False, 0.1, 1e-5]),
        "batch_norm_channels_last": OpCard("aten._native_batch_norm_legit_no_training.default",
                                           [channels_last([2, 16, 3, 3], dtype), None, None,
                                            t([16]), t([16]), 0.1, 1e-5]),
        "cat": OpCard("aten.cat.default", [[t([2, 3, 8]), t([2, 5, 8])], 1]),
        # rotate_half's cat: a negated half and a sliced view, along the last dimension.
        "cat_rotary": OpCard("aten.cat.default", [[t([2, 3, 4, 8]), t([2, 3, 4, 8], stride=[192, 16, 48, 1])], -1]),
        "sum_interleaved": OpCard("aten.sum.dim_IntList", [t([5, 3, 7]), [0, 2]]),
        "sum_all": OpCard("aten.sum.default", [t([64, 777])]),
        "amax": OpCard("aten.amax.default", [t([4, 33, 9]), [1]]),
        "layer_norm_columns": OpCard("aten.native_layer_norm.default",
                                     [t([2, 48, 32], stride=[1536, 1, 48]), [32], t([32]), t([32]), 1e-5]),
        "softmax_middle": OpCard("aten._softmax.default", [t([2, 8, 40]), 1, False]),
        # nn.Linear's weight arrives as a transposed view: the second operand is K-major.
        "mm": OpCard("aten.mm.default", [t([40, 72]), t([72, 48], stride=[1, 72])]),
        "mm_decode": OpCard("aten.mm.default", [t([2, 96]), t([96, 80], stride=[1, 96])]),
        "addmm": OpCard("aten.addmm.default", [t([48]), t([33, 64]), t([64, 48], stride=[1, 64])],
                        {"beta": 0.5, "alpha": 2.0}),
        "bmm": OpCard("aten.bmm.default", [t([3, 20, 40]), t([3, 40, 24])]),
    }
