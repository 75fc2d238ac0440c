"""Launch plans: the host side of a kernel candidate as data, checked and resolved by kforge.

A plan says which outputs and scratch buffers to allocate and which kernels to launch with which
grid, block and parameters, in terms of the op's arguments. It is never executed as code: its
expressions are parsed into a closed grammar and interpreted here. A candidate covers one exact op
variant, so ``resolve`` turns a plan into constants once per variant; at call time only pointers
change. See ``docs/launch-plan.md`` for the format.
"""

from __future__ import annotations

import ast
import difflib
import json
import keyword
import math
import operator
import re
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from kforge.core.argspec import is_contiguous
from kforge.core.opcard import DTYPE_BYTES
from kforge.errors import KforgeError

MAX_EXPRESSION_CHARS = 2000
MAX_EXPRESSION_DEPTH = 100
MAX_LIST_ITEMS = 256  # lets, requires, outputs, scratch buffers, launches, params of one launch
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
FLOAT32_MAX = 3.4028234663852886e38

TENSOR_ATTRIBUTES = ("shape", "stride", "numel", "dim", "itemsize", "offset", "is_contiguous",
                     "dtype")
FUNCTION_ARITY = {"min": (1, None), "max": (1, None), "abs": (1, 1), "ceil_div": (2, 2),
                  "len": (1, 1), "defined": (1, 1)}
INT_RANGES = {"i32": (-(2**31), 2**31 - 1), "u32": (0, 2**32 - 1), "i64": (INT64_MIN, INT64_MAX),
              "u64": (0, 2**64 - 1)}
SCALAR_CTYPES = (*INT_RANGES, "f32", "f64", "bool")
RETURN_KINDS = ("single", "tuple", "list")

_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_TOP_FIELDS = {"let": False, "requires": False, "outputs": True, "scratch": False,
               "launches": True, "returns": False}
_OUTPUT_FIELDS = {"name": True, "like": False, "shape": False, "stride": False, "dtype": False,
                  "arg": False}
_SCRATCH_FIELDS = {"name": True, "bytes": True, "zero": False}
_LAUNCH_FIELDS = {"kernel": True, "grid": True, "block": True, "cluster": False,
                  "shared_mem": False, "params": False, "align": False, "unaligned_kernel": False}


class PlanError(KforgeError):
    """A launch plan is malformed or cannot be resolved; ``path`` names the field, e.g.
    ``launches[0].grid[1]`` (empty for the plan as a whole)."""

    def __init__(self, path: str, reason: str) -> None:
        self.path = path
        self.reason = reason
        super().__init__(f"{path}: {reason}" if path else f"launch plan: {reason}")


class PlanNotApplicable(PlanError):
    """A ``requires`` expression is false: the plan does not cover this op variant."""


class _EvalError(Exception):
    """An expression failed; the caller adds the field path and the expression text."""


# --- bound argument values -------------------------------------------------------------------


@dataclass(frozen=True)
class TensorMeta:
    """A tensor argument without data: layout and dtype name (``offset`` in elements)."""

    shape: tuple[int, ...]
    stride: tuple[int, ...]
    dtype: str
    offset: int = 0

    def __post_init__(self) -> None:
        object.__setattr__(self, "shape", tuple(self.shape))
        object.__setattr__(self, "stride", tuple(self.stride))
        if len(self.shape) != len(self.stride):
            raise PlanError("", f"a tensor's shape {self.shape} and stride {self.stride} differ "
                                "in length")

    @property
    def itemsize(self) -> int:
        size = DTYPE_BYTES.get(self.dtype)
        if size is None:
            raise PlanError("", f"dtype {self.dtype!r} has no known item size")
        return size

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def dim(self) -> int:
        return len(self.shape)

    @property
    def is_contiguous(self) -> bool:
        return is_contiguous(list(self.shape), list(self.stride))


ArgValue = TensorMeta | None | bool | int | float | str | tuple["ArgValue", ...]


@dataclass(frozen=True)
class DeviceLimits:
    """What one launch and one call may ask of the GPU."""

    max_threads_per_block: int = 1024
    max_block: tuple[int, int, int] = (1024, 1024, 64)
    max_grid: tuple[int, int, int] = (2**31 - 1, 65535, 65535)
    max_shared_mem: int = 227 * 1024
    max_launches: int = 64
    max_cluster_size: int = 8  # blocks per thread-block cluster (the portable limit)
    max_scratch_bytes: int = 8 << 30
    max_output_bytes: int = 64 << 30


# --- expressions -----------------------------------------------------------------------------
# Parsed text becomes this small closed tree; nothing else is ever evaluated.


@dataclass(frozen=True)
class _Const:
    value: Any


@dataclass(frozen=True)
class _Name:
    name: str


@dataclass(frozen=True)
class _Attr:
    base: _Node
    attr: str


@dataclass(frozen=True)
class _Index:
    base: _Node
    index: _Node


@dataclass(frozen=True)
class _Call:
    function: str
    args: tuple[_Node, ...]


@dataclass(frozen=True)
class _Unary:
    op: str  # "-" or "not"
    operand: _Node


@dataclass(frozen=True)
class _Binary:
    op: str
    left: _Node
    right: _Node


@dataclass(frozen=True)
class _Logic:
    op: str  # "and" or "or"
    operands: tuple[_Node, ...]


@dataclass(frozen=True)
class _Compare:
    left: _Node
    ops: tuple[str, ...]
    rights: tuple[_Node, ...]


@dataclass(frozen=True)
class _IsNone:
    operand: _Node
    negated: bool


@dataclass(frozen=True)
class _Cond:
    test: _Node
    then: _Node
    otherwise: _Node


_Node = (_Const | _Name | _Attr | _Index | _Call | _Unary | _Binary | _Logic | _Compare | _IsNone
         | _Cond)

_ARITHMETIC: dict[type, tuple[str, Callable[[Any, Any], Any]]] = {
    ast.Add: ("+", operator.add), ast.Sub: ("-", operator.sub), ast.Mult: ("*", operator.mul),
    ast.Div: ("/", operator.truediv), ast.FloorDiv: ("//", operator.floordiv),
    ast.Mod: ("%", operator.mod),
}
_BINARY_FUNCTIONS = {symbol: function for symbol, function in _ARITHMETIC.values()}
_COMPARISONS: dict[type, tuple[str, Callable[[Any, Any], bool]]] = {
    ast.Eq: ("==", operator.eq), ast.NotEq: ("!=", operator.ne), ast.Lt: ("<", operator.lt),
    ast.LtE: ("<=", operator.le), ast.Gt: (">", operator.gt), ast.GtE: (">=", operator.ge),
}
_COMPARE_FUNCTIONS = {symbol: function for symbol, function in _COMPARISONS.values()}
_FORBIDDEN_OPERATORS = {ast.Pow: "**", ast.MatMult: "@", ast.BitAnd: "&", ast.BitOr: "|",
                        ast.BitXor: "^", ast.LShift: "<<", ast.RShift: ">>", ast.Invert: "~",
                        ast.UAdd: "unary +", ast.In: "in", ast.NotIn: "not in"}
_CONSTRUCT_NAMES = {
    ast.Lambda: "a lambda", ast.ListComp: "a comprehension", ast.SetComp: "a comprehension",
    ast.DictComp: "a comprehension", ast.GeneratorExp: "a comprehension",
    ast.JoinedStr: "an f-string", ast.FormattedValue: "an f-string",
    ast.NamedExpr: "an assignment (:=)", ast.List: "a list literal", ast.Tuple: "a tuple literal",
    ast.Set: "a set literal", ast.Dict: "a dict literal", ast.Starred: "unpacking (*)",
    ast.Slice: "a slice", ast.Await: "await", ast.Yield: "yield", ast.YieldFrom: "yield",
}


@dataclass(frozen=True)
class Expr:
    """One parsed expression; equal when their canonical text is equal."""

    canonical: str
    text: str = field(compare=False)
    node: _Node = field(compare=False, repr=False)
    names: frozenset[str] = field(compare=False, repr=False)


def _parse_tree(source: Any) -> tuple[str, ast.expr]:
    """The text of an expression (a string or a JSON number) and its Python syntax tree.

    Parsing only builds the tree; ``_translate`` then admits the closed grammar alone.
    """
    if isinstance(source, bool) or not isinstance(source, (str, int, float)):
        raise _EvalError(f"must be an expression string or a number, not {_json_kind(source)}")
    if isinstance(source, float) and not math.isfinite(source):
        raise _EvalError(f"the number {source} is not finite")
    text = source if isinstance(source, str) else repr(source)
    if len(text) > MAX_EXPRESSION_CHARS:
        raise _EvalError(f"an expression of {len(text)} characters is longer than the limit of "
                         f"{MAX_EXPRESSION_CHARS}")
    if not text.strip():
        raise _EvalError("the expression is empty")
    stripped = text.strip()  # a leading space would be an indentation error
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # e.g. SyntaxWarning for `x is 1`, refused anyway
            return text, ast.parse(stripped, mode="eval").body
    except SyntaxError as error:
        column = (error.offset or 0) + len(text) - len(text.lstrip())
        where = (f" at column {column}" if error.offset and error.offset <= len(stripped)
                 else " at the end")
        raise _EvalError(f"{_quote(text)}: syntax error: {error.msg}{where}") from None
    except (ValueError, MemoryError, RecursionError) as error:
        raise _EvalError(f"{_quote(text)}: syntax error: {error}") from None


def _expr_from_tree(text: str, tree: ast.expr) -> Expr:
    names: set[str] = set()
    try:
        node = _translate(tree, 1, names)  # bounds the depth before ast.unparse recurses
    except _EvalError as error:
        raise _EvalError(f"{_quote(text)}: {error}") from None
    return Expr(canonical=ast.unparse(tree), text=text, node=node, names=frozenset(names))


def _translate(node: ast.AST, depth: int, names: set[str]) -> _Node:
    """The closed-grammar form of a Python AST node; anything outside the grammar is refused."""
    if depth > MAX_EXPRESSION_DEPTH:
        raise _EvalError(f"is nested more than {MAX_EXPRESSION_DEPTH} levels deep")

    def sub(child: ast.AST) -> _Node:
        return _translate(child, depth + 1, names)

    match node:
        case ast.Constant(value=value):
            return _Const(_literal(value))
        case ast.Name(id=name):
            names.add(name)
            return _Name(name)
        case ast.Attribute(value=base, attr=attr):
            if attr not in TENSOR_ATTRIBUTES:
                raise _EvalError(f"the attribute .{attr} is not allowed"
                                 f"{_suggest(attr, TENSOR_ATTRIBUTES)} "
                                 f"(tensor attributes: {', '.join(TENSOR_ATTRIBUTES)})")
            return _Attr(sub(base), attr)
        case ast.Subscript(value=base, slice=index):
            return _Index(sub(base), sub(index))
        case ast.Call(func=ast.Attribute(attr=attr)) if attr in TENSOR_ATTRIBUTES:
            raise _EvalError(f".{attr} is an attribute, not a method: write it without ()")
        case ast.Call(func=ast.Name(id=function), args=args, keywords=keywords):
            return _Call(function, tuple(sub(a) for a in _call_args(function, args, keywords)))
        case ast.Call():
            raise _EvalError(f"only the functions {', '.join(FUNCTION_ARITY)} may be called")
        case ast.UnaryOp(op=ast.USub(), operand=ast.Constant(value=value)) if _is_number(value):
            return _Const(_literal(-value))
        case ast.UnaryOp(op=ast.USub(), operand=operand):
            return _Unary("-", sub(operand))
        case ast.UnaryOp(op=ast.Not(), operand=operand):
            return _Unary("not", sub(operand))
        case ast.BinOp(op=op, left=left, right=right) if type(op) in _ARITHMETIC:
            return _Binary(_ARITHMETIC[type(op)][0], sub(left), sub(right))
        case ast.BoolOp(op=op, values=values):
            return _Logic("and" if isinstance(op, ast.And) else "or", tuple(map(sub, values)))
        case ast.Compare(left=left, ops=[ast.Is() | ast.IsNot() as op],
                         comparators=[ast.Constant(value=None)]):
            return _IsNone(sub(left), isinstance(op, ast.IsNot))
        case ast.Compare(ops=ops) if any(isinstance(op, (ast.Is, ast.IsNot)) for op in ops):
            raise _EvalError("'is' and 'is not' compare with None only, as in `x is None`")
        case ast.Compare(left=left, ops=ops, comparators=rights) if all(
                type(op) in _COMPARISONS for op in ops):
            return _Compare(sub(left), tuple(_COMPARISONS[type(op)][0] for op in ops),
                            tuple(map(sub, rights)))
        case ast.IfExp(test=test, body=then, orelse=otherwise):
            return _Cond(sub(test), sub(then), sub(otherwise))
        case ast.BinOp(op=op) | ast.UnaryOp(op=op) if type(op) in _FORBIDDEN_OPERATORS:
            raise _EvalError(f"the operator {_FORBIDDEN_OPERATORS[type(op)]} is not allowed")
        case ast.Compare(ops=ops):
            bad = next(op for op in ops if type(op) not in _COMPARISONS)
            raise _EvalError(f"the operator {_FORBIDDEN_OPERATORS[type(bad)]} is not allowed")
    construct = _CONSTRUCT_NAMES.get(type(node), type(node).__name__)
    raise _EvalError(f"{construct} is not allowed in a plan expression")


def _literal(value: Any) -> Any:
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, int):
        return _fit_int64(value)
    if isinstance(value, float) and math.isfinite(value):
        return value
    raise _EvalError(f"the literal {value!r} is not allowed (ints, finite floats, True, False, "
                     "None and strings are)")


def _call_args(function: str, args: list[ast.expr], keywords: list[ast.keyword]) -> list[ast.expr]:
    if function not in FUNCTION_ARITY:
        raise _EvalError(f"calling {function!r} is not allowed; the functions are "
                         f"{', '.join(FUNCTION_ARITY)}")
    if keywords or any(isinstance(a, ast.Starred) for a in args):
        raise _EvalError(f"{function}() takes plain positional arguments only")
    least, most = FUNCTION_ARITY[function]
    if len(args) < least or (most is not None and len(args) > most):
        wanted = str(least) if least == most else f"at least {least}"
        raise _EvalError(f"{function}() takes {wanted} argument(s), not {len(args)}")
    return args


# --- evaluation ------------------------------------------------------------------------------


class _Scope:
    """Argument values and let values, the names an expression may use.

    Lets are computed in order up front; a let that fails keeps its error, raised when something
    uses it (so a false ``requires`` is reported before a let that only fails on such variants).
    """

    def __init__(self, args: dict[str, ArgValue], lets: tuple[tuple[str, Expr], ...]) -> None:
        self.args = args
        self.lets: dict[str, ArgValue] = {}
        self.failed: dict[str, PlanError] = {}
        for name, expr in lets:
            try:
                self.lets[name] = _evaluate(expr, self, f"let.{name}")
            except PlanError as error:
                self.failed[name] = error

    def lookup(self, name: str) -> ArgValue:
        if name in self.args:
            return _fit_int64(self.args[name])
        if name in self.lets:
            return self.lets[name]
        if name in self.failed:
            raise self.failed[name]
        known = sorted({*self.args, *self.lets, *self.failed})
        raise _EvalError(f"uses the unknown name {name!r}{_suggest(name, known)} "
                         f"(known names: {', '.join(known) or 'none'})")

    def raise_first_failure(self) -> None:
        for error in self.failed.values():
            raise error


def _evaluate(expr: Expr, scope: _Scope, path: str) -> ArgValue:
    try:
        return _eval(expr.node, scope)
    except _EvalError as error:
        raise PlanError(path, f"{_quote(expr.text)}: {error}") from None


def _eval(node: _Node, scope: _Scope) -> ArgValue:
    match node:
        case _Const(value):
            return value
        case _Name(name):
            return scope.lookup(name)
        case _Attr(base, attr):
            tensor = _eval(base, scope)
            if not isinstance(tensor, TensorMeta):
                raise _EvalError(f".{attr} applies to tensors, not to {_describe(tensor)}")
            if attr == "itemsize" and tensor.dtype not in DTYPE_BYTES:
                raise _EvalError(f"dtype {tensor.dtype!r} has no known item size")
            return _fit_int64(getattr(tensor, attr))
        case _Index(base, index):
            items = _eval(base, scope)
            if not isinstance(items, tuple):
                raise _EvalError(f"indexing applies to lists (shape, stride, list arguments), "
                                 f"not to {_describe(items)}")
            position = _eval(index, scope)
            if not _is_int(position):
                raise _EvalError(f"an index must be an int, not {_describe(position)}")
            if not -len(items) <= position < len(items):
                raise _EvalError(f"index {position} is out of range for a list of {len(items)}")
            return _fit_int64(items[position])
        case _Call(function, args):
            return _fit_int64(_call(function, [_eval(a, scope) for a in args]))
        case _Unary("-", operand):
            return _fit_int64(-_number(_eval(operand, scope), "unary -"))
        case _Unary(_, operand):
            return not _boolean(_eval(operand, scope), "not")
        case _Binary(op, left, right):
            a = _number(_eval(left, scope), op)
            b = _number(_eval(right, scope), op)
            if op in ("/", "//", "%") and b == 0:
                raise _EvalError(f"divides by zero ({a!r} {op} {b!r})")
            try:
                return _fit_int64(_BINARY_FUNCTIONS[op](a, b))
            except ArithmeticError as error:
                raise _EvalError(f"{a!r} {op} {b!r} fails: {error}") from None
        case _Logic(op, operands):
            for operand in operands:
                value = _boolean(_eval(operand, scope), op)
                if value == (op == "or"):
                    return value
            return op == "and"
        case _Compare(left, ops, rights):
            a = _eval(left, scope)
            for op, right in zip(ops, rights):
                b = _eval(right, scope)
                if op not in ("==", "!=") and not (_is_number(a) and _is_number(b)):
                    raise _EvalError(f"{op} compares numbers, not {_describe(a)} and "
                                     f"{_describe(b)}")
                if not _COMPARE_FUNCTIONS[op](a, b):
                    return False
                a = b
            return True
        case _IsNone(operand, negated):
            return (_eval(operand, scope) is None) != negated
        case _Cond(test, then, otherwise):
            return _eval(then if _boolean(_eval(test, scope), "if") else otherwise, scope)
    raise AssertionError(f"unhandled expression node {node!r}")


def _call(function: str, args: list[ArgValue]) -> ArgValue:
    if function == "defined":
        return args[0] is not None
    if function == "len":
        if not isinstance(args[0], tuple):
            raise _EvalError(f"len() takes a list, not {_describe(args[0])}")
        return len(args[0])
    if function in ("min", "max"):
        items = args
        if len(args) == 1:
            if not isinstance(args[0], tuple):
                raise _EvalError(f"{function}() of one argument takes a list, not "
                                 f"{_describe(args[0])}")
            items = list(args[0])
        if not items:
            raise _EvalError(f"{function}() of an empty list")
        numbers = [_number(item, f"{function}()") for item in items]
        return min(numbers) if function == "min" else max(numbers)
    if function == "abs":
        return abs(_number(args[0], "abs()"))
    a, b = (_number(value, "ceil_div()") for value in args)
    if not (_is_int(a) and _is_int(b)):
        raise _EvalError(f"ceil_div() takes ints, not {_describe(a)} and {_describe(b)}")
    if b == 0:
        raise _EvalError(f"divides by zero (ceil_div({a}, 0))")
    return -(-a // b)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _number(value: ArgValue, where: str) -> int | float:
    if not _is_number(value):
        raise _EvalError(f"{where} needs numbers, not {_describe(value)}")
    return value  # type: ignore[return-value]


def _boolean(value: ArgValue, where: str) -> bool:
    if not isinstance(value, bool):
        raise _EvalError(f"{where} needs a bool, not {_describe(value)}")
    return value


def _fit_int64(value: Any) -> Any:
    if _is_int(value) and not INT64_MIN <= value <= INT64_MAX:
        raise _EvalError(f"the integer {value} overflows signed 64 bits")
    return value


def _describe(value: Any) -> str:
    if value is None:
        return "None"
    if isinstance(value, TensorMeta):
        return f"a {value.dtype} tensor of shape {list(value.shape)}"
    if isinstance(value, tuple):
        return f"the list {_quote(repr(list(value)))}"
    return f"the {type(value).__name__} {value!r}"


def _quote(text: str, limit: int = 80) -> str:
    return repr(text if len(text) <= limit else text[: limit - 3] + "...")


def _suggest(word: str, choices: Any) -> str:
    close = difflib.get_close_matches(word, [str(c) for c in choices], n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _json_kind(value: Any) -> str:
    names = {dict: "an object", list: "a list", str: "a string", bool: "a boolean",
             int: "a number", float: "a number", type(None): "null"}
    return names.get(type(value), type(value).__name__)


# --- the plan --------------------------------------------------------------------------------


@dataclass(frozen=True)
class PointerParam:
    """``{"ptr": NAME}`` or ``{"ptr": "NAME[i]"}`` (an element of a Tensor[] argument)."""

    name: str
    index: Expr | None = None


@dataclass(frozen=True)
class ScalarParam:
    """``{"i32": expr}`` and the other typed scalars."""

    ctype: str
    value: Expr


@dataclass(frozen=True)
class OutputSpec:
    """One returned tensor: ``like`` an argument, a new ``shape``, or an ``arg`` returned itself."""

    name: str
    like: str | None = None
    shape: tuple[Expr, ...] | None = None
    stride: tuple[Expr, ...] | None = None
    dtype: Expr | None = None
    arg: str | None = None


@dataclass(frozen=True)
class ScratchSpec:
    name: str
    nbytes: Expr
    zero: bool = False


@dataclass(frozen=True)
class LaunchSpec:
    kernel: str
    grid: tuple[Expr, ...]
    block: tuple[Expr, ...]
    shared_mem: Expr
    params: tuple[PointerParam | ScalarParam, ...]
    align: Expr | None = None
    unaligned_kernel: str | None = None
    cluster: tuple[Expr, ...] | None = None


@dataclass(frozen=True)
class LaunchPlan:
    """A validated plan with every expression parsed; ``returns`` is filled in when omitted."""

    lets: tuple[tuple[str, Expr], ...]
    requires: tuple[Expr, ...]
    outputs: tuple[OutputSpec, ...]
    scratch: tuple[ScratchSpec, ...]
    launches: tuple[LaunchSpec, ...]
    returns: str

    def kernel_names(self) -> tuple[str, ...]:
        """Every kernel the plan names, known before resolution (kernel names are not expressions)."""
        return _kernel_names(self.launches)

    def to_dict(self) -> dict:
        """Canonical JSON-able data: expressions in normal form, defaults left out."""
        data: dict[str, Any] = {}
        if self.lets:
            data["let"] = {name: _canonical(expr) for name, expr in self.lets}
        if self.requires:
            data["requires"] = [_canonical(expr) for expr in self.requires]
        data["outputs"] = [_output_to_dict(output) for output in self.outputs]
        if self.scratch:
            data["scratch"] = [{"name": s.name, "bytes": _canonical(s.nbytes)}
                               | ({"zero": True} if s.zero else {}) for s in self.scratch]
        data["launches"] = [_launch_to_dict(launch) for launch in self.launches]
        data["returns"] = self.returns
        return data


def _canonical(expr: Expr) -> str | int | float:
    """An expression's canonical form for storing: a number literal as a JSON number."""
    node = expr.node
    return node.value if isinstance(node, _Const) and _is_number(node.value) else expr.canonical


def _output_to_dict(output: OutputSpec) -> dict:
    data: dict[str, Any] = {"name": output.name}
    if output.like is not None:
        data["like"] = output.like
    if output.arg is not None:
        data["arg"] = output.arg
    if output.shape is not None:
        data["shape"] = [_canonical(e) for e in output.shape]
        if output.stride is not None:
            data["stride"] = [_canonical(e) for e in output.stride]
        assert output.dtype is not None
        literal = output.dtype.node
        is_name = isinstance(literal, _Const) and literal.value in DTYPE_BYTES
        data["dtype"] = literal.value if is_name else output.dtype.canonical
    return data


def _launch_to_dict(launch: LaunchSpec) -> dict:
    params: list[dict] = []
    for param in launch.params:
        if isinstance(param, PointerParam):
            index = "" if param.index is None else f"[{param.index.canonical}]"
            params.append({"ptr": param.name + index})
        else:
            params.append({param.ctype: _canonical(param.value)})
    data: dict[str, Any] = {"kernel": launch.kernel, "grid": [_canonical(e) for e in launch.grid],
                            "block": [_canonical(e) for e in launch.block]}
    if launch.cluster is not None:
        data["cluster"] = [_canonical(e) for e in launch.cluster]
    if launch.shared_mem.canonical != "0":
        data["shared_mem"] = _canonical(launch.shared_mem)
    if params:
        data["params"] = params
    if launch.align is not None:
        data["align"] = _canonical(launch.align)
        data["unaligned_kernel"] = launch.unaligned_kernel
    return data


def _kernel_names(launches: Any) -> tuple[str, ...]:
    names = {launch.kernel for launch in launches}
    names |= {launch.unaligned_kernel for launch in launches if launch.unaligned_kernel}
    return tuple(sorted(names))


# --- parsing and validating the structure ----------------------------------------------------


def parse_plan(data: Any) -> LaunchPlan:
    """Validate a plan (a dict, or its JSON text) and parse every expression once."""
    if isinstance(data, str):
        try:
            data = json.loads(data)
        except (ValueError, RecursionError) as error:
            raise PlanError("", f"not valid JSON: {error}") from None
    plan = _fields(data, "", _TOP_FIELDS)
    lets = _parse_lets(plan.get("let", {}))
    requires = tuple(_expr(e, f"requires[{i}]")
                     for i, e in enumerate(_list(plan.get("requires", []), "requires")))
    outputs = tuple(_parse_output(o, f"outputs[{i}]")
                    for i, o in enumerate(_list(plan["outputs"], "outputs")))
    scratch = tuple(_parse_scratch(s, f"scratch[{i}]")
                    for i, s in enumerate(_list(plan.get("scratch", []), "scratch")))
    launches = tuple(_parse_launch(x, f"launches[{i}]")
                     for i, x in enumerate(_list(plan["launches"], "launches", least=1)))
    _check_unique_names(lets, outputs, scratch)
    returns = plan.get("returns", "single" if len(outputs) == 1 else "tuple")
    if returns not in RETURN_KINDS:
        raise PlanError("returns", f"must be one of {', '.join(RETURN_KINDS)}, not {returns!r}"
                                   f"{_suggest(str(returns), RETURN_KINDS)}")
    if returns == "single" and len(outputs) != 1:
        raise PlanError("returns", f"'single' needs exactly one output, not {len(outputs)}")
    return LaunchPlan(lets, requires, outputs, scratch, launches, returns)


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def _fields(data: Any, path: str, fields: dict[str, bool]) -> dict:
    if not isinstance(data, dict):
        raise PlanError(path, f"must be a JSON object, not {_json_kind(data)}")
    for key in data:
        if key not in fields:
            raise PlanError(_join(path, str(key)),
                            f"unknown field {key!r}{_suggest(str(key), fields)}")
    for key, required in fields.items():
        if required and key not in data:
            raise PlanError(path, f"the field {key!r} is missing")
    return data


def _list(data: Any, path: str, least: int = 0, most: int = MAX_LIST_ITEMS) -> list:
    if not isinstance(data, list):
        raise PlanError(path, f"must be a list, not {_json_kind(data)}")
    if not least <= len(data) <= most:
        raise PlanError(path, f"must have {least} to {most} entries, not {len(data)}")
    return data


def _expr(source: Any, path: str) -> Expr:
    try:
        return _expr_from_tree(*_parse_tree(source))
    except _EvalError as error:
        raise PlanError(path, str(error)) from None


def _identifier(value: Any, path: str, what: str) -> str:
    if not isinstance(value, str) or not _IDENTIFIER.match(value) or keyword.iskeyword(value):
        raise PlanError(path, f"{what} must be an identifier such as out or partial, "
                              f"not {value!r}")
    return value


def _parse_lets(data: Any) -> tuple[tuple[str, Expr], ...]:
    if not isinstance(data, dict):
        raise PlanError("let", f"must be a JSON object of name: expression, not {_json_kind(data)}")
    if len(data) > MAX_LIST_ITEMS:
        raise PlanError("let", f"has {len(data)} entries, more than {MAX_LIST_ITEMS}")
    lets: list[tuple[str, Expr]] = []
    for position, (name, source) in enumerate(data.items()):
        path = f"let.{name}"
        _identifier(name, path, "a let name")
        expr = _expr(source, path)
        later = sorted(expr.names & set(list(data)[position:]))
        if later:
            raise PlanError(path, f"uses {later[0]!r}, which is not defined before it "
                                  "(a let may use arguments and earlier lets only)")
        lets.append((name, expr))
    return tuple(lets)


def _parse_output(data: Any, path: str) -> OutputSpec:
    entry = _fields(data, path, _OUTPUT_FIELDS)
    name = _identifier(entry["name"], _join(path, "name"), "an output name")
    forms = [form for form in ("like", "shape", "arg") if form in entry]
    if len(forms) != 1:
        raise PlanError(path, "needs exactly one of 'like', 'shape' or 'arg', not "
                              f"{' and '.join(map(repr, forms)) or 'none'}")
    for extra in ("dtype", "stride"):
        if extra in entry and forms[0] != "shape":
            raise PlanError(_join(path, extra), f"only goes with 'shape', not with {forms[0]!r}")
    if forms[0] != "shape":
        tensor = _identifier(entry[forms[0]], _join(path, forms[0]), "a tensor argument name")
        return OutputSpec(name, **{forms[0]: tensor})
    shape_path = _join(path, "shape")
    shape = tuple(_expr(e, f"{shape_path}[{i}]")
                  for i, e in enumerate(_list(entry["shape"], shape_path, most=64)))
    stride = None
    if "stride" in entry:
        stride_path = _join(path, "stride")
        raw = _list(entry["stride"], stride_path, most=64)
        if len(raw) != len(shape):
            raise PlanError(stride_path, f"has {len(raw)} entries but shape has {len(shape)}")
        stride = tuple(_expr(e, f"{stride_path}[{i}]") for i, e in enumerate(raw))
    if "dtype" not in entry:
        raise PlanError(path, "the field 'dtype' is missing (a 'shape' output needs one)")
    source = entry["dtype"]
    dtype = (Expr(repr(source), source, _Const(source), frozenset()) if source in DTYPE_BYTES
             else _expr(source, _join(path, "dtype")))
    return OutputSpec(name, shape=shape, stride=stride, dtype=dtype)


def _parse_scratch(data: Any, path: str) -> ScratchSpec:
    entry = _fields(data, path, _SCRATCH_FIELDS)
    name = _identifier(entry["name"], _join(path, "name"), "a scratch name")
    zero = entry.get("zero", False)
    if not isinstance(zero, bool):
        raise PlanError(_join(path, "zero"), f"must be true or false, not {zero!r}")
    return ScratchSpec(name, _expr(entry["bytes"], _join(path, "bytes")), zero)


def _parse_launch(data: Any, path: str) -> LaunchSpec:
    entry = _fields(data, path, _LAUNCH_FIELDS)
    kernel = _kernel_name(entry["kernel"], _join(path, "kernel"))
    dims = {}
    for key in ("grid", "block", "cluster"):
        if key in entry:
            raw = _list(entry[key], _join(path, key), least=1, most=3)
            dims[key] = tuple(_expr(e, f"{path}.{key}[{i}]") for i, e in enumerate(raw))
    shared_mem = _expr(entry.get("shared_mem", 0), _join(path, "shared_mem"))
    params_path = _join(path, "params")
    params = tuple(_parse_param(p, f"{params_path}[{i}]")
                   for i, p in enumerate(_list(entry.get("params", []), params_path)))
    if ("align" in entry) != ("unaligned_kernel" in entry):
        present, absent = ("align", "unaligned_kernel") if "align" in entry else (
            "unaligned_kernel", "align")
        raise PlanError(_join(path, present), f"needs {absent!r} too")
    align = unaligned = None
    if "align" in entry:
        align = _expr(entry["align"], _join(path, "align"))
        unaligned = _kernel_name(entry["unaligned_kernel"], _join(path, "unaligned_kernel"))
    return LaunchSpec(kernel, dims["grid"], dims["block"], shared_mem, params, align, unaligned,
                      dims.get("cluster"))


def _kernel_name(value: Any, path: str) -> str:
    if not isinstance(value, str) or not _IDENTIFIER.match(value) or len(value) > 255:
        raise PlanError(path, f"must be a C identifier (the extern \"C\" kernel name), "
                              f"not {value!r}")
    return value


def _parse_param(data: Any, path: str) -> PointerParam | ScalarParam:
    kinds = ("ptr", *SCALAR_CTYPES)
    if not isinstance(data, dict) or len(data) != 1:
        raise PlanError(path, f"must be an object with exactly one key of {', '.join(kinds)}, "
                              f"not {json.dumps(data, default=str)[:80]}")
    (kind, source), = data.items()
    if kind not in kinds:
        raise PlanError(_join(path, str(kind)),
                        f"unknown parameter kind {kind!r}{_suggest(str(kind), kinds)} "
                        f"(kinds: {', '.join(kinds)})")
    path = _join(path, str(kind))
    if kind != "ptr":
        return ScalarParam(kind, _expr(source, path))
    try:
        text, tree = _parse_tree(source)
        match tree:
            case ast.Name(id=name):
                return PointerParam(name)
            case ast.Subscript(value=ast.Name(id=name), slice=index):
                return PointerParam(name, _expr_from_tree(text, index))
    except _EvalError as error:
        raise PlanError(path, str(error)) from None
    raise PlanError(path, f"must be a tensor name or NAME[index], not {_quote(text)}")


def _check_unique_names(lets: tuple[tuple[str, Expr], ...], outputs: tuple[OutputSpec, ...],
                        scratch: tuple[ScratchSpec, ...]) -> None:
    seen: dict[str, str] = {name: f"let.{name}" for name, _ in lets}
    entries = [(o.name, f"outputs[{i}].name") for i, o in enumerate(outputs)]
    entries += [(s.name, f"scratch[{i}].name") for i, s in enumerate(scratch)]
    for name, path in entries:
        if name in seen:
            raise PlanError(path, f"the name {name!r} is already used by {seen[name]}")
        seen[name] = path


# --- resolution ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Pointer:
    """A pointer parameter: an argument (``index`` into a Tensor[] argument), output or scratch.
    An optional tensor argument that is None is passed as a null pointer."""

    source: str  # "arg" | "output" | "scratch"
    name: str
    index: int | None = None


@dataclass(frozen=True)
class Scalar:
    ctype: str  # one of SCALAR_CTYPES
    value: bool | int | float


@dataclass(frozen=True)
class ResolvedOutput:
    """``kind`` "new" is allocated by kforge; "arg" is the argument ``arg`` itself."""

    name: str
    kind: str
    shape: tuple[int, ...]
    stride: tuple[int, ...]
    dtype: str
    arg: str | None = None


@dataclass(frozen=True)
class ResolvedScratch:
    """``nbytes`` bytes, allocated 16-byte aligned per call and zero-filled when ``zero``."""

    name: str
    nbytes: int
    zero: bool


@dataclass(frozen=True)
class ResolvedLaunch:
    """One launch with constant geometry; ``unaligned_kernel`` runs instead of ``kernel`` on a call
    where a pointer parameter is not a multiple of ``align`` bytes."""

    kernel: str
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    shared_mem: int
    params: tuple[Pointer | Scalar, ...]
    align: int | None = None
    unaligned_kernel: str | None = None
    cluster: tuple[int, int, int] = (1, 1, 1)  # blocks per thread-block cluster, per dimension


@dataclass(frozen=True)
class ResolvedPlan:
    """A plan resolved to constants for one op variant."""

    outputs: tuple[ResolvedOutput, ...]
    scratch: tuple[ResolvedScratch, ...]
    launches: tuple[ResolvedLaunch, ...]
    returns: str

    def kernel_names(self) -> tuple[str, ...]:
        """Every kernel this plan may launch, for checking against the compiled module."""
        return _kernel_names(self.launches)

    def to_dict(self) -> dict:
        return {
            "outputs": [{"name": o.name, "kind": o.kind, "shape": list(o.shape),
                         "stride": list(o.stride), "dtype": o.dtype, "arg": o.arg}
                        for o in self.outputs],
            "scratch": [{"name": s.name, "nbytes": s.nbytes, "zero": s.zero}
                        for s in self.scratch],
            "launches": [{"kernel": x.kernel, "grid": list(x.grid), "block": list(x.block),
                          "shared_mem": x.shared_mem,
                          "params": [_param_to_dict(p) for p in x.params],
                          "align": x.align, "unaligned_kernel": x.unaligned_kernel,
                          "cluster": list(x.cluster)}
                         for x in self.launches],
            "returns": self.returns,
        }

    @classmethod
    def from_dict(cls, data: dict) -> ResolvedPlan:
        try:
            return cls(
                outputs=tuple(ResolvedOutput(o["name"], o["kind"], tuple(o["shape"]),
                                             tuple(o["stride"]), o["dtype"], o.get("arg"))
                              for o in data["outputs"]),
                scratch=tuple(ResolvedScratch(s["name"], s["nbytes"], s["zero"])
                              for s in data["scratch"]),
                launches=tuple(ResolvedLaunch(x["kernel"], tuple(x["grid"]), tuple(x["block"]),
                                              x["shared_mem"],
                                              tuple(map(_param_from_dict, x["params"])),
                                              x.get("align"), x.get("unaligned_kernel"),
                                              tuple(x.get("cluster", (1, 1, 1))))
                               for x in data["launches"]),
                returns=data["returns"],
            )
        except (AttributeError, KeyError, TypeError, ValueError) as error:
            raise PlanError("", f"a stored resolved plan is malformed: {error!r}") from None


def _param_to_dict(param: Pointer | Scalar) -> dict:
    if isinstance(param, Pointer):
        return {"source": param.source, "name": param.name, "index": param.index}
    return {"ctype": param.ctype, "value": param.value}


def _param_from_dict(data: dict) -> Pointer | Scalar:
    if "source" in data:
        return Pointer(data["source"], data["name"], data.get("index"))
    return Scalar(data["ctype"], data["value"])


def resolve(plan: LaunchPlan, bound: Mapping[str, ArgValue],
            limits: DeviceLimits = DeviceLimits()) -> ResolvedPlan:
    """Resolve ``plan`` for one op variant whose arguments, by aten schema name, are ``bound``.

    Raises ``PlanNotApplicable`` when a ``requires`` is false, ``PlanError`` for anything else.
    """
    if len(plan.launches) > limits.max_launches:
        raise PlanError("launches", f"{len(plan.launches)} launches is more than the limit of "
                                    f"{limits.max_launches}")
    args = {name: _bind(value, f"args.{name}") for name, value in bound.items()}
    _check_against_args(plan, args)
    scope = _Scope(args, plan.lets)
    for i, condition in enumerate(plan.requires):
        path = f"requires[{i}]"
        holds = _evaluate(condition, scope, path)
        if not isinstance(holds, bool):
            raise PlanError(path, f"{_quote(condition.text)} gives {_describe(holds)}, not a bool")
        if not holds:
            raise PlanNotApplicable(path, f"{_quote(condition.text)} is false for this variant")
    scope.raise_first_failure()

    outputs = tuple(_resolve_output(o, f"outputs[{i}]", scope) for i, o in enumerate(plan.outputs))
    total = 0
    for i, output in enumerate(outputs):
        if output.kind == "new":
            total += _storage_bytes(output, f"outputs[{i}]")
            if total > limits.max_output_bytes:
                raise PlanError(f"outputs[{i}]", f"new outputs take {total} bytes, above the "
                                                 f"limit of {limits.max_output_bytes}")
    scratch = []
    total = 0
    for i, spec in enumerate(plan.scratch):
        path = f"scratch[{i}].bytes"
        nbytes = _int_value(spec.nbytes, scope, path, "a byte count", least=0)
        total += nbytes
        if total > limits.max_scratch_bytes:
            raise PlanError(path, f"scratch takes {total} bytes, above the limit of "
                                  f"{limits.max_scratch_bytes}")
        scratch.append(ResolvedScratch(spec.name, nbytes, spec.zero))
    pointers = _Pointers(args, {o.name for o in plan.outputs}, {s.name for s in plan.scratch})
    launches = tuple(_resolve_launch(x, f"launches[{i}]", scope, pointers, limits)
                     for i, x in enumerate(plan.launches))
    return ResolvedPlan(outputs, tuple(scratch), launches, plan.returns)


def _bind(value: Any, path: str) -> ArgValue:
    if value is None or isinstance(value, (bool, int, float, str, TensorMeta)):
        return value
    if isinstance(value, (list, tuple)):
        return tuple(_bind(item, f"{path}[{i}]") for i, item in enumerate(value))
    raise PlanError(path, f"an argument value of type {type(value).__name__} is not supported "
                          "(tensors are TensorMeta; dtypes are names such as 'float32')")


def _check_against_args(plan: LaunchPlan, args: dict[str, ArgValue]) -> None:
    for name, _ in plan.lets:
        if name in args:
            raise PlanError(f"let.{name}", f"the let {name!r} shadows the argument of that name")
    named = [(o.name, f"outputs[{i}].name") for i, o in enumerate(plan.outputs)]
    named += [(s.name, f"scratch[{i}].name") for i, s in enumerate(plan.scratch)]
    for name, path in named:
        if name in args:
            raise PlanError(path, f"{name!r} is also an argument name; output, scratch and "
                                  "argument names must differ")


def _tensor_arg(name: str, args: dict[str, ArgValue], path: str) -> TensorMeta:
    value = args.get(name)
    if not isinstance(value, TensorMeta):
        tensors = sorted(n for n, v in args.items() if isinstance(v, TensorMeta))
        what = "not an argument" if name not in args else f"{_describe(value)}, not a tensor"
        raise PlanError(path, f"{name!r} is {what} "
                              f"(tensor arguments: {', '.join(tensors) or 'none'})")
    return value


def _resolve_output(spec: OutputSpec, path: str, scope: _Scope) -> ResolvedOutput:
    if spec.arg is not None:
        tensor = _tensor_arg(spec.arg, scope.args, _join(path, "arg"))
        return ResolvedOutput(spec.name, "arg", tensor.shape, tensor.stride, tensor.dtype, spec.arg)
    if spec.like is not None:
        tensor = _tensor_arg(spec.like, scope.args, _join(path, "like"))
        stride = (tensor.stride if _non_overlapping_and_dense(tensor.shape, tensor.stride)
                  else _contiguous_strides(tensor.shape))
        return ResolvedOutput(spec.name, "new", tensor.shape, stride, tensor.dtype)
    assert spec.shape is not None and spec.dtype is not None
    shape = tuple(_int_value(e, scope, f"{path}.shape[{i}]", "a size", least=0)
                  for i, e in enumerate(spec.shape))
    stride = (_contiguous_strides(shape) if spec.stride is None else
              tuple(_int_value(e, scope, f"{path}.stride[{i}]", "a stride", least=0)
                    for i, e in enumerate(spec.stride)))
    if not _non_overlapping(shape, stride):
        raise PlanError(_join(path, "stride"), f"strides {list(stride)} for shape {list(shape)} "
                        "give two elements one address: each element of a new output needs its "
                        "own")
    dtype = _evaluate(spec.dtype, scope, _join(path, "dtype"))
    if dtype not in DTYPE_BYTES:
        raise PlanError(_join(path, "dtype"), f"{_quote(spec.dtype.text)} gives "
                        f"{_describe(dtype)}, not a dtype name ({', '.join(DTYPE_BYTES)})")
    return ResolvedOutput(spec.name, "new", shape, stride, str(dtype))


def _storage_bytes(output: ResolvedOutput, path: str) -> int:
    itemsize = DTYPE_BYTES.get(output.dtype)
    if itemsize is None:
        raise PlanError(path, f"dtype {output.dtype!r} has no known item size")
    if 0 in output.shape:
        return 0
    extent = 1 + sum((size - 1) * step for size, step in zip(output.shape, output.stride))
    return itemsize * extent


def _contiguous_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    strides, step = [], 1
    for size in reversed(shape):
        strides.append(step)
        step *= max(size, 1)
    return tuple(reversed(strides))


def _non_overlapping(shape: tuple[int, ...], stride: tuple[int, ...]) -> bool:
    """Whether every element has an address of its own (gaps allowed): sorted by stride, each
    dim of size > 1 steps past the whole span of the dims inside it."""
    if 0 in shape:
        return True
    span = 0  # the largest offset reached by the dims taken so far
    for size, step in sorted((pair for pair in zip(shape, stride) if pair[0] != 1),
                             key=lambda pair: pair[1]):
        if step <= span:
            return False
        span += (size - 1) * step
    return True


def _non_overlapping_and_dense(shape: tuple[int, ...], stride: tuple[int, ...]) -> bool:
    """PyTorch's rule: sorted by stride, the dims of size > 1 tile memory with no gap or overlap."""
    expected = 1
    for size, step in sorted((pair for pair in zip(shape, stride) if pair[0] != 1),
                             key=lambda pair: pair[1]):
        if size == 0:
            return True
        if step != expected:
            return False
        expected *= size
    return True


def _int_value(expr: Expr, scope: _Scope, path: str, what: str, least: int,
               most: int | None = None, limit_name: str = "") -> int:
    value = _evaluate(expr, scope, path)
    if not _is_int(value):
        raise PlanError(path, f"{_quote(expr.text)} gives {_describe(value)}; "
                              f"{what} must be an int")
    if value < least:
        raise PlanError(path, f"{_quote(expr.text)} gives {value}; {what} must be at least {least}")
    if most is not None and value > most:
        raise PlanError(path, f"{_quote(expr.text)} gives {value}, above the {limit_name} limit "
                              f"of {most}")
    return value


@dataclass(frozen=True)
class _Pointers:
    """The names a pointer parameter may use."""

    args: dict[str, ArgValue]
    outputs: set[str]
    scratch: set[str]

    def known(self) -> list[str]:
        tensors = [n for n, v in self.args.items()
                   if v is None or isinstance(v, (TensorMeta, tuple))]
        return sorted({*tensors, *self.outputs, *self.scratch})


def _resolve_pointer(param: PointerParam, path: str, scope: _Scope,
                     pointers: _Pointers) -> Pointer:
    name = param.name
    for source, names in (("output", pointers.outputs), ("scratch", pointers.scratch)):
        if name in names:
            if param.index is not None:
                raise PlanError(path, f"{source} {name!r} is one buffer; it takes no index")
            return Pointer(source, name)
    if name not in pointers.args:
        known = pointers.known()
        raise PlanError(path, f"{name!r} is no tensor argument, output or scratch buffer"
                              f"{_suggest(name, known)} (known: {', '.join(known) or 'none'})")
    value = pointers.args[name]
    if isinstance(value, tuple):
        if param.index is None:
            raise PlanError(path, f"{name!r} is a list of {len(value)}; pick one as {name}[i]")
        index = _int_value(param.index, scope, path, "an index", least=-len(value),
                           most=len(value) - 1, limit_name=f"{name} length")
        index %= len(value)
        if not (value[index] is None or isinstance(value[index], TensorMeta)):
            raise PlanError(path, f"{name}[{index}] is {_describe(value[index])}, not a tensor")
        return Pointer("arg", name, index)
    if param.index is not None:
        raise PlanError(path, f"{name!r} is not a list; it takes no index")
    if not (value is None or isinstance(value, TensorMeta)):
        raise PlanError(path, f"{name!r} is {_describe(value)}, not a tensor")
    return Pointer("arg", name)


def _resolve_scalar(param: ScalarParam, path: str, scope: _Scope) -> Scalar:
    ctype = param.ctype
    value = _evaluate(param.value, scope, path)
    text = _quote(param.value.text)
    if ctype == "bool":
        if not isinstance(value, bool):
            raise PlanError(path, f"{text} gives {_describe(value)}; a bool parameter needs a bool")
        return Scalar(ctype, value)
    if ctype in INT_RANGES:
        least, most = INT_RANGES[ctype]
        if not _is_int(value):
            raise PlanError(path, f"{text} gives {_describe(value)}; an {ctype} parameter needs "
                                  "an int")
        if not least <= value <= most:
            raise PlanError(path, f"{text} gives {value}, outside the {ctype} range "
                                  f"[{least}, {most}]")
        return Scalar(ctype, value)
    if not _is_number(value):
        raise PlanError(path, f"{text} gives {_describe(value)}; an {ctype} parameter needs "
                              "a number")
    value = float(value)
    if ctype == "f32" and math.isfinite(value) and abs(value) > FLOAT32_MAX:
        raise PlanError(path, f"{text} gives {value}, which overflows float32")
    return Scalar(ctype, value)


def _resolve_launch(spec: LaunchSpec, path: str, scope: _Scope, pointers: _Pointers,
                    limits: DeviceLimits) -> ResolvedLaunch:
    def dims(key: str, exprs: tuple[Expr, ...], maxima: tuple[int, int, int]) -> tuple[int, ...]:
        values = [_int_value(e, scope, f"{path}.{key}[{i}]", f"a {key} dimension", least=1,
                             most=maxima[i], limit_name=f"{key}[{i}]")
                  for i, e in enumerate(exprs)]
        return tuple(values + [1] * (3 - len(values)))

    grid = dims("grid", spec.grid, limits.max_grid)
    block = dims("block", spec.block, limits.max_block)
    threads = math.prod(block)
    if threads > limits.max_threads_per_block:
        raise PlanError(_join(path, "block"), f"{' * '.join(map(str, block))} = {threads} "
                        f"threads per block, above the limit of {limits.max_threads_per_block}")
    shared_mem = _int_value(spec.shared_mem, scope, _join(path, "shared_mem"), "shared_mem",
                            least=0, most=limits.max_shared_mem, limit_name="shared memory")
    params: list[Pointer | Scalar] = []
    for i, param in enumerate(spec.params):
        param_path = f"{path}.params[{i}]"
        if isinstance(param, PointerParam):
            params.append(_resolve_pointer(param, f"{param_path}.ptr", scope, pointers))
        else:
            params.append(_resolve_scalar(param, f"{param_path}.{param.ctype}", scope))
    align = None
    if spec.align is not None:
        align = _int_value(spec.align, scope, _join(path, "align"), "align", least=1,
                           most=4096, limit_name="align")
        if align & (align - 1):
            raise PlanError(_join(path, "align"), f"{align} is not a power of two")
    return ResolvedLaunch(spec.kernel, grid, block, shared_mem, tuple(params), align,
                          spec.unaligned_kernel, _cluster(spec, path, scope, grid, limits))


def _cluster(spec: LaunchSpec, path: str, scope: _Scope, grid: tuple[int, ...],
             limits: DeviceLimits) -> tuple[int, int, int]:
    """A launch's blocks per cluster: each dimension divides the grid's, and the cluster holds at
    most ``limits.max_cluster_size`` blocks."""
    if spec.cluster is None:
        return (1, 1, 1)
    values = [_int_value(e, scope, f"{path}.cluster[{i}]", "a cluster dimension", least=1,
                         most=limits.max_cluster_size, limit_name="cluster size")
              for i, e in enumerate(spec.cluster)]
    cluster = tuple(values + [1] * (3 - len(values)))
    for i, (blocks, size) in enumerate(zip(grid, cluster)):
        if blocks % size:
            raise PlanError(f"{path}.cluster[{i}]", f"a grid of {blocks} blocks does not split "
                                                    f"into clusters of {size}")
    if math.prod(cluster) > limits.max_cluster_size:
        raise PlanError(_join(path, "cluster"), f"{' * '.join(map(str, cluster))} = "
                        f"{math.prod(cluster)} blocks per cluster, above the limit of "
                        f"{limits.max_cluster_size}")
    return cluster
