"""Launch plans: structure validation, the expression interpreter, resolution to constants and
the errors a malformed or misapplied plan produces."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kforge.core.launch_plan import (
    DeviceLimits,
    PlanError,
    PlanNotApplicable,
    Pointer,
    ResolvedPlan,
    Scalar,
    TensorMeta,
    parse_plan,
    resolve,
)
from kforge.errors import KforgeError


def contiguous(*shape: int, dtype: str = "float32") -> TensorMeta:
    strides, step = [], 1
    for size in reversed(shape):
        strides.append(step)
        step *= max(size, 1)
    return TensorMeta(shape, tuple(reversed(strides)), dtype)


SOFTMAX = {
    "let": {"cols": "self.shape[-1]", "rows": "self.numel // cols"},
    "requires": ["self.is_contiguous", "dim == -1 or dim == self.dim - 1", "not half_to_float"],
    "outputs": [{"name": "out", "like": "self"}],
    "launches": [{
        "kernel": "softmax_f32", "grid": ["rows"], "block": [256], "shared_mem": "32 * 4",
        "params": [{"ptr": "self"}, {"ptr": "out"}, {"i32": "rows"}, {"i32": "cols"}],
    }],
}

LAYER_NORM = {
    "let": {"cols": "normalized_shape[0]", "rows": "input.numel // cols"},
    "requires": ["len(normalized_shape) == 1", "input.is_contiguous",
                 "input.shape[-1] == cols", "weight is None or weight.is_contiguous"],
    "outputs": [
        {"name": "out", "like": "input"},
        {"name": "mean", "shape": ["rows", 1], "dtype": "float32"},
        {"name": "rstd", "shape": ["rows", 1], "dtype": "'float32' if input.itemsize < 4 "
                                                          "else input.dtype"},
    ],
    "launches": [{
        "kernel": "layer_norm", "grid": ["ceil_div(rows, 4)"], "block": [32, 4],
        "params": [{"ptr": "input"}, {"ptr": "weight"}, {"ptr": "bias"}, {"ptr": "out"},
                   {"ptr": "mean"}, {"ptr": "rstd"}, {"i64": "rows"}, {"i32": "cols"},
                   {"f32": "eps"}, {"bool": "defined(weight)"}, {"bool": "bias is not None"}],
    }],
}


def layer_norm_args(rows: int, cols: int, dtype: str = "float32", affine: bool = True) -> dict:
    weight = contiguous(cols, dtype=dtype) if affine else None
    return {"input": contiguous(rows, cols, dtype=dtype), "normalized_shape": (cols,),
            "weight": weight, "bias": weight, "eps": 1e-5}


def one_launch(grid: list | None = None, block: list | None = None, **launch: object) -> dict:
    """A plan with no outputs and one launch of kernel ``k`` (grid and block default to [1])."""
    return {"outputs": [], "launches": [{"kernel": "k", "grid": grid or [1],
                                         "block": block or [1], **launch}]}


def value_of(expression: object, **bound: object) -> object:
    """What a plan expression evaluates to, read back through an i64 parameter."""
    plan = parse_plan(one_launch(params=[{"i64": expression}]))
    return resolve(plan, bound).launches[0].params[0].value


def error_of(data: object, bound: dict | None = None, **limits: object) -> PlanError:
    with pytest.raises(PlanError) as caught:
        resolve(parse_plan(data), bound or {}, DeviceLimits(**limits))
    return caught.value


# --- realistic plans -------------------------------------------------------------------------


def test_softmax_over_the_last_dim_resolves_to_constants():
    bound = {"self": contiguous(8, 1000), "dim": -1, "half_to_float": False}
    resolved = resolve(parse_plan(SOFTMAX), bound)
    (out,) = resolved.outputs
    assert (out.kind, out.shape, out.stride, out.dtype) == ("new", (8, 1000), (1000, 1), "float32")
    (launch,) = resolved.launches
    assert launch.grid == (8, 1, 1) and launch.block == (256, 1, 1) and launch.shared_mem == 128
    assert launch.params == (Pointer("arg", "self"), Pointer("output", "out"),
                             Scalar("i32", 8), Scalar("i32", 1000))
    assert resolved.returns == "single"
    assert resolved.kernel_names() == ("softmax_f32",)


def test_softmax_plan_does_not_apply_to_other_variants():
    for bound, failing in [
        ({"self": contiguous(8, 1000), "dim": 0, "half_to_float": False}, "requires[1]"),
        ({"self": TensorMeta((8, 1000), (1, 8), "float32"), "dim": -1,
          "half_to_float": False}, "requires[0]"),
        ({"self": contiguous(8, 1000, dtype="float16"), "dim": 1, "half_to_float": True},
         "requires[2]"),
    ]:
        with pytest.raises(PlanNotApplicable) as caught:
            resolve(parse_plan(SOFTMAX), bound)
        assert caught.value.path == failing
        assert "is false for this variant" in str(caught.value)


def test_layer_norm_with_three_outputs_and_optional_affine_pointers():
    resolved = resolve(parse_plan(LAYER_NORM), layer_norm_args(6, 512, "bfloat16"))
    out, mean, rstd = resolved.outputs
    assert (out.shape, out.dtype) == ((6, 512), "bfloat16")
    assert (mean.shape, mean.stride, mean.dtype) == ((6, 1), (1, 1), "float32")
    assert rstd.dtype == "float32"
    assert resolved.returns == "tuple"
    launch = resolved.launches[0]
    assert launch.grid == (2, 1, 1) and launch.block == (32, 4, 1)
    assert launch.params[6:] == (Scalar("i64", 6), Scalar("i32", 512), Scalar("f32", 1e-5),
                                 Scalar("bool", True), Scalar("bool", True))

    plain = resolve(parse_plan(LAYER_NORM), layer_norm_args(6, 512, affine=False))
    assert plain.launches[0].params[1] == Pointer("arg", "weight")  # None: a null pointer
    assert plain.launches[0].params[-2:] == (Scalar("bool", False), Scalar("bool", False))
    assert plain.outputs[2].dtype == "float32"


def test_in_place_add_returns_its_self_argument():
    plan = parse_plan({
        "requires": ["self.shape == other.shape", "self.is_contiguous", "other.is_contiguous"],
        "outputs": [{"name": "result", "arg": "self"}],
        "launches": [{"kernel": "add_inplace", "grid": ["ceil_div(self.numel, 256)"],
                      "block": [256], "params": [{"ptr": "self"}, {"ptr": "other"},
                                                 {"f32": "alpha"}, {"i64": "self.numel"}]}],
    })
    resolved = resolve(plan, {"self": contiguous(1000), "other": contiguous(1000), "alpha": 2})
    (result,) = resolved.outputs
    assert (result.kind, result.arg, result.shape) == ("arg", "self", (1000,))
    assert resolved.launches[0].grid == (4, 1, 1)
    assert resolved.launches[0].params[2] == Scalar("f32", 2.0)


def test_cat_over_a_tensor_list_argument():
    plan = parse_plan({
        "let": {"rows0": "tensors[0].shape[0]", "rows1": "tensors[1].shape[0]",
                "cols": "tensors[0].shape[1]"},
        "requires": ["len(tensors) == 2", "dim == 0",
                     "tensors[0].is_contiguous and tensors[1].is_contiguous"],
        "outputs": [{"name": "out", "shape": ["rows0 + rows1", "cols"],
                     "dtype": "tensors[0].dtype"}],
        "launches": [
            {"kernel": "copy_rows", "grid": ["rows0"], "block": [128],
             "params": [{"ptr": "tensors[0]"}, {"ptr": "out"}, {"i64": 0}, {"i32": "cols"}]},
            {"kernel": "copy_rows", "grid": ["rows1"], "block": [128],
             "params": [{"ptr": "tensors[-1]"}, {"ptr": "out"}, {"i64": "rows0 * cols"},
                        {"i32": "cols"}]},
        ],
    })
    bound = {"tensors": (contiguous(3, 64), contiguous(5, 64)), "dim": 0}
    resolved = resolve(plan, bound)
    assert resolved.outputs[0].shape == (8, 64)
    assert resolved.outputs[0].stride == (64, 1)
    first, second = resolved.launches
    assert first.params[0] == Pointer("arg", "tensors", 0)
    assert second.params[0] == Pointer("arg", "tensors", 1)
    assert second.params[2] == Scalar("i64", 192)
    assert resolved.kernel_names() == ("copy_rows",)


def test_elementwise_with_an_unaligned_fallback_kernel():
    plan = parse_plan({
        "let": {"vec": "16 // self.itemsize"},
        "outputs": [{"name": "out", "like": "self"}],
        "launches": [{"kernel": "mul_vec", "grid": ["ceil_div(self.numel, 256 * vec)"],
                      "block": [256], "align": "vec * self.itemsize",
                      "unaligned_kernel": "mul_scalar",
                      "params": [{"ptr": "self"}, {"ptr": "other"}, {"ptr": "out"},
                                 {"u64": "self.numel"}]}],
    })
    resolved = resolve(plan, {"self": contiguous(4096, dtype="bfloat16"),
                              "other": contiguous(4096, dtype="bfloat16")})
    launch = resolved.launches[0]
    assert (launch.align, launch.unaligned_kernel, launch.grid) == (16, "mul_scalar", (2, 1, 1))
    assert resolved.kernel_names() == ("mul_scalar", "mul_vec")
    assert plan.kernel_names() == ("mul_scalar", "mul_vec")


def test_like_keeps_dense_strides_and_otherwise_goes_contiguous():
    plan = parse_plan({"outputs": [{"name": "out", "like": "x"}],
                       "launches": [{"kernel": "k", "grid": [1], "block": [1]}]})

    def stride_like(x: TensorMeta) -> tuple[int, ...]:
        return resolve(plan, {"x": x}).outputs[0].stride

    assert stride_like(TensorMeta((4, 6), (1, 4), "float32")) == (1, 4)  # transposed, dense
    assert stride_like(TensorMeta((4, 6), (12, 2), "float32")) == (6, 1)  # a strided slice
    assert stride_like(TensorMeta((4, 6), (0, 1), "float32")) == (6, 1)  # expanded


def test_tensor_meta_attributes():
    x = TensorMeta((2, 1, 3), (3, 99, 1), "bfloat16", offset=5)
    assert (x.numel, x.dim, x.itemsize, x.is_contiguous) == (6, 3, 2, True)
    assert not TensorMeta((2, 3), (1, 2), "float32").is_contiguous
    assert value_of("x.offset + x.stride[-2] + len(x.shape)", x=x) == 5 + 99 + 3
    with pytest.raises(PlanError, match="differ in length"):
        TensorMeta((2, 3), (1,), "float32")


def test_expression_operators_and_functions():
    t = contiguous(4, 10)
    assert value_of("max(t.shape) - min(3, t.dim) + abs(-7)", t=t) == 10 - 2 + 7
    assert value_of("ceil_div(t.numel, 16) if t.numel > 0 else 1", t=t) == 3
    assert value_of("1 if 0 < t.dim <= 2 != 3 else 0", t=t) == 1
    assert value_of("1 if t.dtype == 'float32' and not defined(b) else 0", t=t, b=None) == 1
    assert value_of("-7 // 2 * 10 + -7 % 3") == -40 + 2
    assert value_of("-9223372036854775808") == -(2**63)
    with pytest.raises(PlanError, match="float 3.5"):
        value_of("7 / 2")


def test_to_dict_is_canonical_and_parses_back_to_the_same_plan():
    plan = parse_plan(json.dumps(LAYER_NORM))
    data = plan.to_dict()
    assert parse_plan(data) == plan
    assert data["launches"][0]["block"] == [32, 4]
    spaced = json.loads(json.dumps(LAYER_NORM).replace("rows // 4", "rows//4"))
    assert parse_plan(spaced).to_dict() == data
    assert parse_plan({**SOFTMAX, "returns": "single"}).to_dict() == parse_plan(SOFTMAX).to_dict()


# --- errors and the paths they name ----------------------------------------------------------


def test_unknown_field_suggests_the_known_one():
    error = error_of({"outputs": [], "launches": [{"kernal": "k", "grid": [1], "block": [1]}]})
    assert error.path == "launches[0].kernal"
    assert "did you mean 'kernel'" in str(error)
    assert "did you mean 'requires'" in str(error_of({"outputs": [], "launches": [],
                                                      "require": []}))
    assert error_of(one_launch(params=[{"int32": 1}])).path == "launches[0].params[0].int32"


@pytest.mark.parametrize("expression, fragment", [
    ("rows +", "syntax error"),
    ("(rows", "syntax error"),
    ("", "empty"),
    ("__import__('os')", "calling '__import__' is not allowed"),
    ("self.__class__", "attribute .__class__ is not allowed"),
    ("self.data_ptr", "attribute .data_ptr is not allowed"),
    ("self.numel()", "attribute, not a method"),
    ("(lambda: 1)()", "only the functions"),
    ("lambda: 1", "a lambda"),
    ("[x for x in self.shape]", "a comprehension"),
    ("sum(x for x in self.shape)", "calling 'sum' is not allowed"),
    ("2 ** 3", "operator ** is not allowed"),
    ("1 << 3", "operator << is not allowed"),
    ("f'{self}'", "an f-string"),
    ("print(1)", "calling 'print' is not allowed"),
    ("self.shape[0:2]", "a slice"),
    ("(x := 3)", "assignment"),
    ("min(*self.shape)", "plain positional arguments"),
    ("ceil_div(1)", "takes 2 argument(s)"),
    ("x is 1", "compare with None only"),
    ("99999999999999999999", "overflows signed 64 bits"),
    ("1e999", "not allowed"),
    ("x" * 2001, "longer than the limit of 2000"),
    ("-" * 150 + "1", "nested more than"),
])
def test_forbidden_or_malformed_expressions_fail_at_parse(expression: str, fragment: str):
    with pytest.raises(PlanError) as caught:
        parse_plan(one_launch(grid=[expression]))
    assert caught.value.path == "launches[0].grid[0]"
    assert fragment in str(caught.value)


@pytest.mark.parametrize("expression, fragment", [
    ("rowz", "unknown name 'rowz' (did you mean 'rows'?) (known names: rows, self)"),
    ("rows[0]", "indexing applies to lists"),
    ("rows.shape[0]", ".shape applies to tensors"),
    ("self.shape[5]", "index 5 is out of range"),
    ("rows // 0", "divides by zero"),
    ("rows % (rows - rows)", "divides by zero"),
    ("ceil_div(rows, 0)", "divides by zero"),
    ("rows * 4611686018427387904", "overflows signed 64 bits"),
    ("rows / 2", "gives the float 1.5; a grid dimension must be an int"),
    ("rows > 1", "gives the bool True; a grid dimension must be an int"),
    ("rows - 3", "must be at least 1"),
    ("rows if rows else 1", "if needs a bool"),
    ("1 + True", "needs numbers"),
    ("len(rows)", "len() takes a list"),
    ("self < 3", "compares numbers"),
])
def test_expressions_that_fail_when_resolved(expression: str, fragment: str):
    error = error_of(one_launch(grid=[expression]), {"self": contiguous(2, 3), "rows": 3})
    assert error.path == "launches[0].grid[0]"
    assert fragment in str(error)


def test_geometry_and_resource_limits():
    error = error_of(one_launch(block=[64, 32]))
    assert error.path == "launches[0].block" and "2048 threads per block" in str(error)
    error = error_of(one_launch(block=[1, 1, 65]))
    assert error.path == "launches[0].block[2]" and "limit of 64" in str(error)
    error = error_of(one_launch(grid=[1, 70000]))
    assert error.path == "launches[0].grid[1]" and "65535" in str(error)
    assert error_of(one_launch(grid=[0])).path == "launches[0].grid[0]"
    error = error_of(one_launch(shared_mem=300 * 1024))
    assert error.path == "launches[0].shared_mem" and "232448" in str(error)
    many = {"outputs": [], "launches": [{"kernel": "k", "grid": [1], "block": [1]}] * 65}
    assert error_of(many).path == "launches"
    assert "limit of 64" in str(error_of(many))
    error = error_of({"outputs": [], "scratch": [{"name": "s", "bytes": "9 << 30"}],
                      "launches": [{"kernel": "k", "grid": [1], "block": [1]}]})
    assert error.path == "scratch[0].bytes"
    error = error_of({"outputs": [], "scratch": [{"name": "s", "bytes": 2000}],
                      "launches": [{"kernel": "k", "grid": [1], "block": [1]}]},
                     max_scratch_bytes=1024)
    assert error.path == "scratch[0].bytes" and "above the limit of 1024" in str(error)
    error = error_of({"outputs": [{"name": "o", "shape": [2**30, 64], "dtype": "float32"}],
                      "launches": [{"kernel": "k", "grid": [1], "block": [1]}]})
    assert error.path == "outputs[0]" and "bytes" in str(error)


def test_scalar_parameter_ranges():
    def scalar_error(ctype: str, expression: object) -> PlanError:
        return error_of(one_launch(params=[{ctype: expression}]), {"n": 3})

    error = scalar_error("i32", 2**31)
    assert error.path == "launches[0].params[0].i32" and "outside the i32 range" in str(error)
    assert "outside the u32 range" in str(scalar_error("u32", -1))
    assert "needs an int" in str(scalar_error("i64", 1.5))
    assert "needs a bool" in str(scalar_error("bool", 1))
    assert "overflows float32" in str(scalar_error("f32", 1e39))
    assert "needs a number" in str(scalar_error("f64", "n > 1"))
    plan = parse_plan(one_launch(params=[{"u32": 2**32 - 1}, {"f64": "n"}]))
    assert resolve(plan, {"n": 3}).launches[0].params == (Scalar("u32", 2**32 - 1),
                                                          Scalar("f64", 3.0))


def test_pointer_errors_name_the_parameter():
    bound = {"x": contiguous(4), "xs": (contiguous(4),), "n": 3}
    cases = [
        ("xss", "'xss' is no tensor argument, output or scratch buffer (did you mean 'xs'?)"),
        ("n", "'n' is the int 3, not a tensor"),
        ("xs", "is a list of 1; pick one as xs[i]"),
        ("xs[1]", "above the xs length limit of 0"),
        ("x[0]", "'x' is not a list"),
        ("x + 1", "must be a tensor name or NAME[index]"),
    ]
    for ptr, fragment in cases:
        error = error_of(one_launch(params=[{"ptr": ptr}]), bound)
        assert error.path == "launches[0].params[0].ptr", ptr
        assert fragment in str(error), (ptr, str(error))


def test_structural_errors():
    def structure_error(data: object) -> PlanError:
        with pytest.raises(PlanError) as caught:
            parse_plan(data)
        return caught.value

    assert "not valid JSON" in str(structure_error("{not json"))
    assert "must be a JSON object" in str(structure_error([1, 2]))
    assert structure_error({"outputs": []}).reason == "the field 'launches' is missing"
    error = structure_error({"outputs": [{"name": "o", "like": "x", "arg": "x"}],
                             "launches": [{"kernel": "k", "grid": [1], "block": [1]}]})
    assert error.path == "outputs[0]" and "exactly one of" in str(error)
    error = structure_error(one_launch() | {"let": {"a": "b + 1", "b": 2}})
    assert error.path == "let.a" and "not defined before it" in str(error)
    error = structure_error({"outputs": [{"name": "o", "like": "x"}, {"name": "o", "like": "x"}],
                             "launches": [{"kernel": "k", "grid": [1], "block": [1]}]})
    assert error.path == "outputs[1].name"
    error = structure_error({"outputs": [], "returns": "single",
                             "launches": [{"kernel": "k", "grid": [1], "block": [1]}]})
    assert error.path == "returns"
    error = structure_error({"outputs": [], "launches": [
        {"kernel": "k", "grid": [1], "block": [1], "align": 16}]})
    assert error.path == "launches[0].align" and "unaligned_kernel" in str(error)
    assert structure_error(one_launch(grid=[True])).path == "launches[0].grid[0]"
    assert structure_error({"outputs": [], "launches": [{"kernel": "k(", "grid": [1],
                                                         "block": [1]}]}).path == \
        "launches[0].kernel"
    assert structure_error(one_launch(grid=[1, 2, 3, 4])).path == "launches[0].grid"


def test_names_may_not_collide_with_arguments():
    assert error_of(one_launch() | {"let": {"x": 1}}, {"x": 2}).path == "let.x"
    error = error_of({"outputs": [{"name": "out", "like": "x"}],
                      "launches": [{"kernel": "k", "grid": [1], "block": [1]}]},
                     {"x": contiguous(2), "out": contiguous(2)})
    assert error.path == "outputs[0].name" and "must differ" in str(error)
    error = error_of({"outputs": [{"name": "r", "arg": "n"}],
                      "launches": [{"kernel": "k", "grid": [1], "block": [1]}]}, {"n": 2})
    assert error.path == "outputs[0].arg" and "not a tensor" in str(error)


def test_a_failing_let_is_reported_after_a_false_requirement():
    plan = parse_plan(one_launch() | {"let": {"cols": "x.shape[-1]"},
                                      "requires": ["x.dim >= 1", "cols > 0"]})
    with pytest.raises(PlanNotApplicable):
        resolve(plan, {"x": TensorMeta((), (), "float32")})
    plan = parse_plan(one_launch() | {"let": {"cols": "x.shape[-1]"}})
    with pytest.raises(PlanError) as caught:
        resolve(plan, {"x": TensorMeta((), (), "float32")})
    assert caught.value.path == "let.cols" and "out of range" in str(caught.value)


def test_plan_errors_are_kforge_errors():
    assert issubclass(PlanNotApplicable, PlanError) and issubclass(PlanError, KforgeError)


# --- properties ------------------------------------------------------------------------------

_LEAVES = st.integers(-50, 50).map(str)


def _combine(children: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    binary = st.tuples(children, st.sampled_from(["+", "-", "*", "//", "%"]), children,
                       st.booleans()).map(
        lambda t: f"({t[0]} {t[1]} {t[2]})" if t[3] else f"{t[0]} {t[1]} {t[2]}")
    calls = st.tuples(st.sampled_from(["min", "max"]), children, children).map(
        lambda t: f"{t[0]}({t[1]}, {t[2]})")
    return binary | calls | children.map(lambda c: f"-({c})") | children.map(lambda c: f"abs({c})")


@settings(max_examples=150, deadline=None)
@given(st.recursive(_LEAVES, _combine, max_leaves=8))
def test_integer_arithmetic_agrees_with_python(expression: str):
    reference_functions = {"__builtins__": {}, "min": min, "max": max, "abs": abs}
    try:
        expected = eval(expression, reference_functions)  # the reference: test-generated text only
    except ZeroDivisionError:
        with pytest.raises(PlanError, match="divides by zero"):
            value_of(expression)
        return
    assert value_of(expression) == expected


@settings(max_examples=40, deadline=None)
@given(rows=st.integers(1, 5000), cols=st.integers(1, 4096),
       dtype=st.sampled_from(["float32", "float16", "bfloat16"]), affine=st.booleans())
def test_resolution_is_deterministic_and_round_trips(rows: int, cols: int, dtype: str,
                                                     affine: bool):
    plan = parse_plan(LAYER_NORM)
    first = resolve(plan, layer_norm_args(rows, cols, dtype, affine))
    again = resolve(parse_plan(plan.to_dict()), layer_norm_args(rows, cols, dtype, affine))
    assert first == again and hash(first) == hash(again)
    assert ResolvedPlan.from_dict(json.loads(json.dumps(first.to_dict()))) == first


_EXPRESSION_PIECES = st.sampled_from(
    list("abcdefghijklmnopqrstuvwxyz_0123456789 +-*/%()[].,<>=!'\"\\:{}@&|^~#\n\t")
    + ["self", "shape", "rows", "len", "if", "else", "not", "and", "or", "is", "None",
       "lambda", "__class__", "**", "//", "1e400", "defined"])


@settings(max_examples=250, deadline=None)
@given(st.one_of(st.text(max_size=40), st.lists(_EXPRESSION_PIECES, max_size=25).map("".join)))
def test_garbage_expressions_raise_only_plan_errors(text: str):
    bound = {"self": contiguous(2, 3), "rows": 3, "xs": (1, 2)}
    for data in (one_launch(grid=[text]), one_launch(params=[{"ptr": text}]),
                 one_launch() | {"requires": [text]}):
        try:
            resolve(parse_plan(data), bound)
        except PlanError:
            pass


@settings(max_examples=100, deadline=None)
@given(st.text(max_size=80))
def test_garbage_plan_text_raises_only_plan_errors(text: str):
    try:
        parse_plan(text)
    except PlanError:
        pass
