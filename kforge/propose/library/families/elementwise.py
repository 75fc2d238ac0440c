"""Elementwise ops: activations, arithmetic with broadcasting and scalars, casts, in-place forms,
and the fused forms PyTorch exposes as one op (``add`` with ``alpha``, ``addcmul``).

Each op becomes a float expression over up to three tensor operands (``a``, ``b``, ``c``) and
scalar kernel parameters; the output has eager's layout (an in-place op writes its first operand).
Parameters: ``block`` (threads), ``vec`` (consecutive outputs per access group), ``unroll``
(groups per thread, all loaded before any is stored).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from kforge.core.gpu import GpuInfo
from kforge.propose.library.cards import Call, Declined, TensorArg, require_float
from kforge.propose.library.families.base import (
    Family,
    Kernel,
    Variant,
    cuda_bool,
    entry_points,
    f32,
    launch,
    new_output,
    ptr,
    sm_count,
    vec_options,
)
from kforge.propose.library.layout import (
    Iteration,
    broadcast_strides,
    index_type,
    iteration,
    max_offset,
    offsets_code,
)
from kforge.propose.library.space import (
    Axis,
    Params,
    Space,
    ceil_div,
    pow2_ceil,
    powers_of_two,
)

LETTERS = ("a", "b", "c")
# vec * unroll values per operand stay in registers until stored.
MAX_THREAD_OUTPUTS = 32
THREADS_PER_SM = 2048

# An expression from the operand terms (a tensor's letter or a scalar's parameter name), the raw
# operand values (None for tensors) and the named scalars present ({"alpha": "p1"}).
Expr = Callable[[list[str], list, dict[str, str]], str]


@dataclass(frozen=True)
class Form:
    """An op as an expression over its first ``operands`` arguments (tensors or numbers) and the
    optional named scalars at the given schema positions (left out when they equal 1)."""

    operands: int
    expr: Expr
    inplace: bool = False
    named: tuple[tuple[str, int], ...] = ()


def _call(function: str) -> Expr:
    return lambda t, v, s: f"{function}({t[0]})"


def _scaled(sign: str, swap: bool = False) -> Expr:
    def expr(t: list[str], v: list, s: dict[str, str]) -> str:
        x, y = (t[1], t[0]) if swap else (t[0], t[1])
        return f"{x} {sign} {s['alpha']} * {y}" if "alpha" in s else f"{x} {sign} {y}"

    return expr


# pow's exponents that eager computes specially, so that results round as eager's do.
_POW_SPECIAL = {2.0: "{a} * {a}", 3.0: "{a} * {a} * {a}", 0.5: "sqrtf({a})", -0.5: "rsqrtf({a})",
                -1.0: "1.f / {a}", -2.0: "1.f / ({a} * {a})", 1.0: "{a}", 0.0: "1.f"}


def _pow(t: list[str], v: list, s: dict[str, str]) -> str:
    special = _POW_SPECIAL.get(float(v[1])) if v[1] is not None else None
    return special.format(a=t[0]) if special else f"powf({t[0]}, {t[1]})"


def _addcmul(t: list[str], v: list, s: dict[str, str]) -> str:
    return f"{t[0]} + {s['value']} * {t[1]} * {t[2]}" if "value" in s else f"{t[0]} + {t[1]} * {t[2]}"


def _forms() -> dict[str, Form]:
    forms: dict[str, Form] = {}

    def both(name: str, form: Form) -> None:  # the op and its in-place twin
        forms[f"aten.{name}"] = form
        base, overload = name.split(".")
        forms[f"aten.{base}_.{overload}"] = Form(form.operands, form.expr, True, form.named)

    for name, function in (("relu", "kf::relu"), ("silu", "kf::silu"), ("sigmoid", "kf::sigmoid"),
                           ("tanh", "tanhf"), ("neg", "-"), ("abs", "fabsf"), ("exp", "expf"),
                           ("rsqrt", "rsqrtf"), ("sqrt", "sqrtf"), ("cos", "cosf"), ("sin", "sinf")):
        both(f"{name}.default", Form(1, _call(function)))
    both("gelu.default", Form(1, lambda t, v, s: f"kf::gelu_{s['approximate']}({t[0]})"))
    forms["aten._to_copy.default"] = Form(1, lambda t, v, s: t[0])
    forms["aten.pow.Tensor_Scalar"] = Form(2, _pow)
    arithmetic = {"add": _scaled("+"), "sub": _scaled("-"), "mul": lambda t, v, s: f"{t[0]} * {t[1]}",
                  "div": lambda t, v, s: f"{t[0]} / {t[1]}"}
    for name, expr in arithmetic.items():
        named = (("alpha", 2),) if name in ("add", "sub") else ()
        both(f"{name}.Tensor", Form(2, expr, named=named))
        both(f"{name}.Scalar", Form(2, expr, named=named))
    forms["aten.rsub.Scalar"] = Form(2, _scaled("-", swap=True), named=(("alpha", 2),))
    both("addcmul.default", Form(3, _addcmul, named=(("value", 3),)))
    return forms


FORMS = _forms()


@dataclass(frozen=True)
class Operand:
    letter: str
    arg: str  # the schema name
    tensor: TensorArg


@dataclass(frozen=True)
class ScalarArg:
    """A number the op takes (the argument ``arg``), passed to the kernel as float ``name``."""

    name: str
    arg: str


@dataclass(frozen=True)
class ElementwiseProblem:
    call: Call
    form: Form
    out: TensorArg
    operands: tuple[Operand, ...]
    scalars: tuple[ScalarArg, ...]
    expr: str
    it: Iteration  # strides of the output, then of each operand

    @property
    def itemsize(self) -> int:
        return max([self.out.itemsize] + [o.tensor.itemsize for o in self.operands])


class Elementwise(Family):
    name = "elementwise"
    ops = tuple(FORMS)
    cuda_files = ("elementwise.cu",)
    reference = "one_shot"

    def analyze(self, call: Call) -> ElementwiseProblem:
        form = FORMS[call.op]
        out = call.outputs[0]
        require_float(out)
        if out.numel == 0:
            raise Declined("the output is empty")
        if call.op == "aten._to_copy.default":
            check_plain_copy(call)
        terms, values, operands, scalars = [], [], [], []
        for i in range(form.operands):
            value = call.value(i)
            if isinstance(value, TensorArg):
                require_float(value)
                operands.append(Operand(LETTERS[len(operands)], call.arg_name(i), value))
                terms.append(operands[-1].letter)
                values.append(None)
            elif i > 0 and isinstance(value, (int, float)):
                scalars.append(ScalarArg(f"p{len(scalars)}", call.arg_name(i)))
                terms.append(scalars[-1].name)
                values.append(value)
            else:
                raise Declined(f"argument {i} ({value!r}) is neither a tensor nor a number")
        named: dict[str, str] = {}
        for keyword, position in form.named:
            value = call.value(position)
            if not isinstance(value, (int, float)):
                raise Declined(f"{keyword}={value!r} is not a number")
            if value != 1:
                scalars.append(ScalarArg(f"p{len(scalars)}", call.arg_name(position)))
                named[keyword] = scalars[-1].name
        if call.op.startswith("aten.gelu"):
            named["approximate"] = "tanh" if call.value(1) == "tanh" else "erf"
        first = operands[0].tensor
        if form.inplace and (first.shape, first.stride, first.dtype) != (out.shape, out.stride, out.dtype):
            raise Declined("the in-place output is not the first operand")
        strides = [out.stride] + [broadcast_strides(o.tensor, out.shape) for o in operands]
        return ElementwiseProblem(call, form, out, tuple(operands), tuple(scalars),
                                  form.expr(terms, values, named), iteration(out.shape, strides))

    def variants(self, problem: ElementwiseProblem, gpu: GpuInfo) -> list[Variant]:
        vecs = elementwise_vecs(problem)
        numel = problem.it.numel
        axes = (Axis("block", powers_of_two(64, 1024)), Axis("vec", vecs), Axis("unroll", (1, 2, 4, 8)))

        def valid(p: Params) -> bool:  # no block much larger than the work
            return (p["vec"] * p["unroll"] <= MAX_THREAD_OUTPUTS
                    and (p["block"] == 64 or p["block"] <= pow2_ceil(numel // p["vec"])))

        vec = max(vecs)
        waves = numel / vec / (sm_count(gpu) * THREADS_PER_SM)
        default = {"block": 256, "vec": vec, "unroll": 4 if waves >= 4 else 2 if waves >= 2 else 1}
        space = Space.build(axes, valid, default, {"block": 256, "vec": 1, "unroll": 1})
        return [
            Variant("one_shot", "each thread takes `unroll` groups of `vec` outputs once, as many "
                                "blocks as the data needs (reference)", space),
            Variant("grid_stride", "resident blocks (a full GPU's worth) loop over the data", space),
        ]

    def render(self, problem: ElementwiseProblem, approach: str, params: Params, gpu: GpuInfo) -> Kernel:
        out, it = problem.out, problem.it
        arity = len(problem.operands)
        inner = [it.inner(i) for i in range(arity + 1)] + [0] * (3 - arity)
        index = index_type(it.numel, max_offset(out), *(max_offset(o.tensor) for o in problem.operands))
        offsets = offsets_code(it, ["out"] + [f"{o.letter}_off" for o in problem.operands], "Index")
        offsets += "".join(f"\n{letter}_off = 0;" for letter in LETTERS[arity:])
        geometry = (
            "struct Geometry {\n"
            f"  using Index = {index};\n"
            f"  static constexpr Index NUMEL = {it.numel};\n"
            f"  static constexpr int OUT_INNER = {inner[0]}, A_INNER = {inner[1]}, "
            f"B_INNER = {inner[2]}, C_INNER = {inner[3]};\n"
            "  static __device__ __forceinline__ void offsets(Index e, Index& out, Index& a_off,\n"
            "                                                 Index& b_off, Index& c_off) {\n"
            + "".join(f"    {line}\n" for line in offsets.splitlines())
            + "  }\n};\n\n"
            "struct Op {\n"
            f"  static constexpr int ARITY = {arity};\n"
            + "".join(f"  float {s.name};\n" for s in problem.scalars)
            + "  __device__ __forceinline__ float operator()(float a, float b, float c) const {\n"
            f"    return {problem.expr};\n"
            "  }\n};\n")
        params_c = ([f"{out.ctype}* out"] + [f"const {o.tensor.ctype}* {o.letter}" for o in problem.operands]
                    + [f"float {s.name}" for s in problem.scalars])
        args = ["out"] + [o.letter for o in problem.operands] + ["(const float*)nullptr"] * (3 - arity)
        op = "Op{" + ", ".join(s.name for s in problem.scalars) + "}"
        grid_stride = cuda_bool(approach == "grid_stride")
        source = geometry + "\n" + entry_points(
            "elementwise", params["vec"], params["block"], params_c,
            lambda vec: f"elementwise_loop<Geometry, Op, {params['vec']}, {params['unroll']}, "
                        f"{grid_stride}, {cuda_bool(vec > 1)}>(" + ", ".join(args) + f", {op})")
        return Kernel(source, self.plan(problem, approach, params, gpu))

    def plan(self, problem: ElementwiseProblem, approach: str, params: Params, gpu: GpuInfo) -> dict:
        """Eager's output (or, in place, the first operand itself) and one launch."""
        first = problem.operands[0].arg
        output = {"name": "out", "arg": first} if problem.form.inplace else new_output("out", problem.out)
        blocks = ceil_div(problem.it.numel // params["vec"], params["block"] * params["unroll"])
        if approach == "grid_stride":
            blocks = min(blocks, sm_count(gpu) * (THREADS_PER_SM // params["block"]))
        kernel_params = ([ptr(first if problem.form.inplace else "out")]
                         + [ptr(o.arg) for o in problem.operands]
                         + [f32(s.arg) for s in problem.scalars])
        return {"outputs": [output],
                "launches": [launch("elementwise", blocks, params["block"], kernel_params,
                                    params["vec"], problem.itemsize)]}


def check_plain_copy(call: Call) -> None:
    """A copy is an elementwise kernel only when it stays on the GPU in a strided layout."""
    device, layout = call.kwargs.get("device"), call.kwargs.get("layout")
    if device is not None and device.type != "cuda":
        raise Declined(f"a copy to {device} is not a GPU kernel")
    if layout is not None and layout != torch.strided:
        raise Declined(f"a copy to layout {layout} is not supported")


def elementwise_vecs(problem: ElementwiseProblem) -> tuple[int, ...]:
    """Vector widths every operand allows: the output written with stride 1, the innermost size
    a multiple, and each stride-1 operand aligned at every group's start."""
    it = problem.it
    if it.inner(0) != 1:
        return (1,)
    counts = [it.sizes[-1]]
    for strides in it.strides:
        if strides[-1] == 1:
            counts += [s for s in strides[:-1] if s]
    return vec_options(problem.itemsize, *counts)
