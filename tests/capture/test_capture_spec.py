"""The arg-spec encoder: the format of kforge.core.opcard, and keys that tell variants apart."""

from __future__ import annotations

import torch

from kforge.core.argspec import encode_call, encode_value
from kforge.core.opcard import variant_key

aten = torch.ops.aten


def test_tensor_spec_keeps_shape_strides_dtype_and_offset():
    base = torch.zeros(4, 10, dtype=torch.bfloat16)
    view = base[:, 3:7]
    assert encode_value(view) == {"t": "tensor", "shape": [4, 4], "stride": [10, 1],
                                  "dtype": "bfloat16", "offset": 3}


def test_lists_dtypes_devices_and_scalars():
    x = torch.ones(2, 3)
    args, kwargs = encode_call(aten.cat.default, ([x, x.t()], 1), {
        "dtype": torch.half, "device": torch.device("cpu"), "layout": torch.strided,
        "memory_format": torch.channels_last, "alpha": 0.5, "flag": True, "none": None,
        "reduce": "sum"})
    assert args[0] == {"t": "list", "items": [
        {"t": "tensor", "shape": [2, 3], "stride": [3, 1], "dtype": "float32", "offset": 0},
        {"t": "tensor", "shape": [3, 2], "stride": [1, 3], "dtype": "float32", "offset": 0}]}
    assert args[1] == 1
    assert kwargs == {"dtype": {"t": "dtype", "v": "float16"},
                      "device": {"t": "device", "v": "cpu"},
                      "layout": {"t": "layout", "v": "strided"},
                      "memory_format": {"t": "memory_format", "v": "channels_last"},
                      "alpha": 0.5, "flag": True, "none": None, "reduce": "sum"}


def test_key_ignores_values_but_not_layout_or_scalars():
    def key(*args):
        args_spec, kwargs_spec = encode_call(aten._softmax.default, args, {})
        return variant_key("aten._softmax.default", args_spec, kwargs_spec)

    a, b = torch.randn(4, 8), torch.randn(4, 8)
    assert key(a, -1, False) == key(b, -1, False)
    assert key(a, -1, False) != key(a, 0, False)
    assert key(a, -1, False) != key(torch.randn(8, 4).t(), -1, False)
    assert key(a, -1, False) != key(a.half(), -1, False)


def test_unknown_objects_are_named_not_crashed_on():
    assert encode_value(object()) == {"t": "other", "v": "object"}
