"""A call read from data, learned on meta tensors: what it returns and the bytes of every tensor
it makes, without allocating anything of its size or making a tensor anywhere but on meta."""

from __future__ import annotations

import math

import pytest

from kforge.core.argspec import ArgSpecError
from kforge.core.meta import ValuesDecide, meta_call


def t(shape: list[int], dtype: str = "float32", stride: list[int] | None = None,
      offset: int = 0) -> dict:
    if stride is None:  # contiguous
        stride = [math.prod(shape[i + 1:]) for i in range(len(shape))]
    return {"t": "tensor", "shape": shape, "stride": stride, "dtype": dtype, "offset": offset}


@pytest.mark.parametrize("op, args, kwargs, shape, made", [
    ("aten.mm.default", [t([64, 8]), t([8, 32])], {}, (64, 32), 64 * 32 * 4),
    ("aten.expand.default", [t([1, 8]), [16, 8]], {}, (16, 8), 0),  # a view makes nothing
    ("aten.add_.Tensor", [t([8]), t([8])], {}, (8,), 0),  # nor does a write in place
    # factories: no device, the host's, or None; every one made on meta
    ("aten.full.default", [[1 << 30, 1 << 30], 1.0], {}, (1 << 30, 1 << 30), 1 << 62),
    ("aten.ones.default", [[4, 4]], {"device": {"t": "device", "v": "cpu"}}, (4, 4), 64),
    ("aten.arange.default", [16], {"device": None}, (16,), 128),
    ("aten._to_copy.default", [t([8])], {"device": {"t": "device", "v": "cpu"}}, (8,), 32),
    # a composite op: every tensor its steps make counts (einsum's product and its reshapes)
    ("aten.einsum.default", ["ij,jk->ik", {"t": "list", "items": [t([64, 8]), t([8, 32])]}],
     {}, (64, 32), 64 * 32 * 4),
    ("aten.index.Tensor", [t([8, 4]), {"t": "list", "items": [t([3], "int64")]}], {}, (3, 4),
     48),
    # growth in place counts as what it grows by (an input is the evaluator's to count)
    ("aten.resize_.default", [t([4]), [1 << 39]], {}, (1 << 39,), (1 << 41) - 16),
    ("aten.add.out", [t([4]), t([4])], {"out": t([0])}, (4,), 16),
], ids=["mm", "view", "in-place", "full-4EiB", "ones-cpu", "arange-device-none", "to-cpu",
        "einsum", "index-by-position", "resize-2TiB", "out-resized"])
def test_what_a_call_makes_is_learned_on_meta(op, args, kwargs, shape, made):
    found = meta_call(op, args, kwargs)
    (result,) = found.results
    assert result.device.type == "meta" and tuple(result.shape) == shape
    assert found.made_bytes == made


def test_a_step_that_would_make_a_tensor_elsewhere_is_refused_before_it_runs():
    """``_to_cpu`` names the host inside its implementation, whatever device the call runs on."""
    with pytest.raises(ArgSpecError, match="aten._to_copy.default would make a tensor on cpu"):
        meta_call("aten._to_cpu.default", [{"t": "list", "items": [t([1 << 40])]}], {})


@pytest.mark.parametrize("op, args", [
    ("aten.nonzero.default", [t([64])]),
    ("aten.index.Tensor", [t([8, 4]), {"t": "list", "items": [t([8], "bool")]}]),
])
def test_a_result_whose_size_depends_on_values_is_told_apart(op, args):
    with pytest.raises(ValuesDecide, match="depends on its inputs' values"):
        meta_call(op, args, {})


@pytest.mark.parametrize("op, args, needle", [
    ("aten.add.Tensor", [t([4, 4]), t([5, 4])], "eager PyTorch rejects"),
    ("aten.relu.default", [t([4], stride=[-1], offset=3)], "Negative strides"),
    ("aten.relu.default", [t([1 << 62, 1 << 62])], "eager PyTorch rejects"),  # no size holds it
    ("aten.relu.default", [{"t": "tensor", "shape": [4], "dtype": "float32",
                            "layout": "sparse_coo"}], "has no strides"),
])
def test_a_call_eager_refuses_is_an_argspec_error(op, args, needle):
    with pytest.raises(ArgSpecError, match=needle):
        meta_call(op, args, {})
