"""The arg-spec format: encoding and decoding are inverse, the walker finds every tensor in order,
and ``bind`` names a call's arguments as the aten schema does."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from kforge.core.argspec import (
    ArgSpecError,
    bind,
    decode,
    decode_call,
    encode_call,
    encode_value,
    freeze,
    is_tensor_spec,
    resolve_op,
    storage_span,
    tensor_specs,
    walk,
)
from kforge.core.describe import describe_args

ROOT = Path(__file__).resolve().parents[2]
DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.int64, torch.int32, torch.bool)


@st.composite
def strided_tensors(draw) -> torch.Tensor:
    shape = draw(st.lists(st.integers(0, 4), max_size=3))
    stride = draw(st.lists(st.integers(0, 6), min_size=len(shape), max_size=len(shape)))
    offset = draw(st.integers(0, 3))
    return materialize({"shape": shape, "stride": stride, "offset": offset,
                        "dtype": draw(st.sampled_from(DTYPES))})


def materialize(spec: dict) -> torch.Tensor:
    """A tensor with exactly the spec's shape, strides, storage offset and dtype."""
    dtype = getattr(torch, spec["dtype"]) if isinstance(spec["dtype"], str) else spec["dtype"]
    storage = torch.zeros(spec["offset"] + max(1, storage_span(spec["shape"], spec["stride"])),
                          dtype=dtype)
    return storage.as_strided(spec["shape"], spec["stride"], spec["offset"])


LEAVES = st.one_of(
    strided_tensors(),
    st.none(), st.booleans(), st.integers(-2**40, 2**40), st.floats(allow_nan=True),
    st.text(max_size=6),
    st.sampled_from(DTYPES),
    st.sampled_from([torch.device("cpu"), torch.device("cuda:1"), torch.device("meta")]),
    st.sampled_from([torch.strided, torch.sparse_coo]),
    st.sampled_from([torch.contiguous_format, torch.channels_last, torch.preserve_format]),
)
VALUES = st.recursive(LEAVES, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                      st.tuples(inner, inner)), max_leaves=12)


@settings(max_examples=200, deadline=None)
@given(VALUES)
def test_decoding_an_encoded_value_gives_it_back(value):
    spec = encode_value(value)
    decoded = decode(spec, materialize)
    assert freeze(encode_value(decoded)) == freeze(spec)


@settings(max_examples=100, deadline=None)
@given(VALUES)
def test_lists_decode_to_tuples_and_leaves_to_torch_objects(value):
    decoded = decode(encode_value(value), materialize)

    def same(original, rebuilt) -> bool:
        if isinstance(original, (list, tuple)):
            return type(rebuilt) is tuple and len(original) == len(rebuilt) and all(
                same(a, b) for a, b in zip(original, rebuilt))
        if isinstance(original, torch.Tensor):
            return (rebuilt.shape, rebuilt.stride(), rebuilt.dtype) == (
                original.shape, original.stride(), original.dtype)
        if isinstance(original, float) and math.isnan(original):
            return math.isnan(rebuilt)
        return type(rebuilt) is type(original) and rebuilt == original

    assert same(value, decoded)


@settings(max_examples=100, deadline=None)
@given(VALUES)
def test_the_walker_finds_every_tensor_in_argument_order(value):
    def flatten(v):
        if isinstance(v, torch.Tensor):
            return [v]
        if isinstance(v, (list, tuple)):
            return [t for item in v for t in flatten(item)]
        return []

    args_spec, kwargs_spec = encode_call(None, [value, value], {"k": value})
    expected = [encode_value(t) for t in flatten([value, value, value])]
    assert tensor_specs([args_spec, list(kwargs_spec.values())]) == expected


def test_walk_names_where_each_leaf_is():
    spec = {"t": "list", "items": [1, {"t": "list", "items": [None, "x"]}]}
    assert list(walk([spec, 2.5], "args")) == [
        ("args[0][0]", 1), ("args[0][1][0]", None), ("args[0][1][1]", "x"), ("args[1]", 2.5)]
    assert list(walk(7)) == [("", 7)]
    assert is_tensor_spec(encode_value(torch.ones(2))) and not is_tensor_spec(spec)


def test_decoding_hooks_replace_each_kind():
    spec = [encode_value(torch.ones(2, 3)), {"t": "list", "items": [1, 2]},
            {"t": "dtype", "v": "bfloat16"}, "mean"]
    assert decode(spec, lambda t: t["shape"], make_list=list,
                  make_named=lambda kind, name: f"{kind}:{name}", make_scalar=repr) == [
        [2, 3], ["1", "2"], "dtype:bfloat16", "'mean'"]
    assert describe_args(spec[:2], {"dtype": spec[2]}) == "f32[2,3], [1, 2], dtype=bfloat16"


def test_views_at_different_places_in_one_tensor_are_told_apart():
    """Each step of a loop over ``x[:, t]`` is a variant of its own (its storage offset)."""
    x = torch.randn(2, 24, 8)
    first, later = encode_value(x[:, 0]), encode_value(x[:, 3])
    assert describe_args([first], {}) == "f32[2,8]*"
    assert describe_args([later], {}) == "f32[2,8]*@24"


@pytest.mark.parametrize("spec", [{"t": "sym", "v": "s0"}, {"t": "other", "v": "Generator"},
                                  {"t": "dtype", "v": "float33"},
                                  {"t": "memory_format", "v": "strided"}, {"shape": [2]}])
def test_what_cannot_be_rebuilt_is_a_typed_error(spec):
    with pytest.raises(ArgSpecError):
        decode(spec, materialize)


@pytest.mark.parametrize("op, args, kwargs", [
    ("aten.full.default", [[2, 3], 1.0], {}),  # a factory naming no device
    ("aten.full.default", [[2, 3], 1.0], {"device": None}),
    ("aten.ones.default", [[2, 3]], {"device": {"t": "device", "v": "cpu"}}),
    ("aten._to_copy.default", [{"t": "tensor", "shape": [4], "stride": [1], "dtype": "float32",
                                "offset": 0}], {"device": {"t": "device", "v": "cuda:3"}}),
])
def test_a_call_read_from_data_runs_on_the_device_kforge_gives_it(op, args, kwargs):
    """A device is data: every one a call names, and the one a factory naming none would take
    (the host), is the device kforge runs the call on."""
    meta = torch.device("meta")

    def on_meta(spec: dict) -> torch.Tensor:
        return torch.empty(spec["shape"], device=meta)

    decoded, named = decode_call(op, args, kwargs, on_meta, meta)
    assert named["device"] == meta
    assert resolve_op(op)(*decoded, **named).device == meta


def test_the_format_loads_without_torch():
    loaded = subprocess.run(
        [sys.executable, "-c", ("import sys, kforge.core.argspec as a, kforge.core.opcard; "
                                "a.tensor_specs([]); print('torch' in sys.modules)")],
        cwd=ROOT, capture_output=True, text=True, check=True).stdout.strip()
    assert loaded == "False"


# ----- bind -----


def spec(*shape: int, dtype: str = "float32") -> dict:
    return encode_value(torch.zeros(*shape, dtype=getattr(torch, dtype)))


def test_bind_names_positional_arguments_by_schema():
    x = spec(4, 8)
    assert bind("aten._softmax.default", [x, -1, False], {}) == {
        "self": x, "dim": -1, "half_to_float": False}


def test_bind_keeps_lists_and_optional_tensors_as_specs():
    x, w = spec(2, 7, 96), spec(96)
    shape = {"t": "list", "items": [96]}
    assert bind("aten.native_layer_norm.default", [x, shape, w, None, 1e-5], {}) == {
        "input": x, "normalized_shape": shape, "weight": w, "bias": None, "eps": 1e-5}


def test_bind_fills_in_schema_defaults():
    a, b = spec(3), spec(3)
    assert bind("aten.add.Tensor", [a, b], {}) == {"self": a, "other": b, "alpha": 1}
    assert bind("aten.add.Tensor", [a, b], {"alpha": 0.5})["alpha"] == 0.5
    bound = bind("aten.sum.dim_IntList", [a, {"t": "list", "items": [0]}], {})
    assert bound["keepdim"] is False and bound["dtype"] is None
    pool = bind("aten.avg_pool2d.default", [spec(1, 1, 4, 4), {"t": "list", "items": [2, 2]}], {})
    assert pool["padding"] == {"t": "list", "items": [0, 0]}  # list defaults come as list specs


def test_bind_takes_a_tensor_list_and_a_default_dim():
    tensors = encode_value([torch.zeros(2, 3), torch.zeros(4, 3)])
    assert bind("aten.cat.default", [tensors], {}) == {"tensors": tensors, "dim": 0}
    assert bind("aten.cat.default", [tensors], {"dim": 1}) == {"tensors": tensors, "dim": 1}


def test_bind_an_out_overload_names_out_last():
    a, out = spec(3), spec(3)
    bound = bind("aten.add.out", [a, a], {"out": out})
    assert list(bound) == ["self", "other", "alpha", "out"]
    assert bound["out"] is out and bound["alpha"] == 1
    with pytest.raises(ArgSpecError, match="needs argument 'out'"):
        bind("aten.add.out", [a, a], {})


def test_bind_accepts_positional_arguments_by_keyword():
    x = spec(4, 8)
    assert bind("aten._softmax.default", [x], {"half_to_float": False, "dim": 1}) == {
        "self": x, "dim": 1, "half_to_float": False}


@pytest.mark.parametrize("args, kwargs, message", [
    ([1, 2, 3, 4], {}, "takes 3 positional arguments, not 4"),
    ([1, 2, 3], {"dims": 0}, "has no argument 'dims'"),
    ([1, 2, 3], {"dim": 0}, "'dim' both by position and by keyword"),
    ([1], {}, "needs argument 'dim'"),
])
def test_bind_refuses_calls_the_schema_does_not_take(args, kwargs, message):
    with pytest.raises(ArgSpecError, match=message):
        bind("aten._softmax.default", args, kwargs)


def test_bind_of_an_unknown_operator_is_a_typed_error():
    with pytest.raises(ArgSpecError, match="no operator"):
        bind("aten.no_such_op.default", [], {})
