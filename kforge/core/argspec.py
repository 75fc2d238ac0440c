"""The arg-spec format: how kforge describes the arguments of one aten call, and the one module
that writes, walks, reads and binds it.

An argument is described by a JSON-able *arg spec*:

- a tensor: ``{"t": "tensor", "shape": [..], "stride": [..], "dtype": "bfloat16", "offset": 0}``
  (a tensor without one set of strides, sparse or nested, has ``"layout"`` instead of strides and
  offset; a nested one has the shape ``[]``)
- a list or tuple of arguments: ``{"t": "list", "items": [...]}``
- a dtype / device / layout / memory format: ``{"t": "dtype", "v": "float32"}`` (and so on); a
  symbolic number ``{"t": "sym", "v": "s0"}``; any other object ``{"t": "other", "v": type name}``
- a plain scalar (int, float, bool, None, str) as itself.

A call is ``(args_spec, kwargs_spec)``: a list and a dict of arg specs.

Encoding runs on every op call while a model is profiled, and the integration guard reuses it at
dispatch time, so it is written for speed: a type check per value, a dict lookup per dtype.
Only encoding, decoding and operator lookup need torch, and it is imported when they are first
used: torch-free modules (op cards, the TUI) read specs without loading it.

A call read from data runs where kforge runs it (``decode_call``: every device it names is that
one) and through operators that check what they are given (``checked_op``).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from functools import cache
from typing import TYPE_CHECKING, Any

from kforge.errors import KforgeError

if TYPE_CHECKING:
    import torch

_ENCODER_NAMES = ("dtype_name", "tensor_spec", "encode_value", "encode_call")


class ArgSpecError(KforgeError):
    """An arg spec that cannot be read back, or a call that does not fit its operator."""


# ----- encoding: values -> specs -----


def __getattr__(name: str) -> Any:
    if name in _ENCODER_NAMES:
        function = _encoder()[name]
        globals()[name] = function  # later lookups find it without this hook
        return function
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


@cache
def _encoder() -> dict[str, Callable[..., Any]]:
    """The encoder functions, made on first use: they hold torch and its types as closure
    variables, the fastest lookup on the per-call path."""
    import torch

    # Keyed by the dtype object, so aliases (torch.half) map to the canonical name ("float16").
    names = {value: str(value).removeprefix("torch.") for value in vars(torch).values()
             if isinstance(value, torch.dtype)}
    tensor, strided, dtype, device, layout, memory_format = (
        torch.Tensor, torch.strided, torch.dtype, torch.device, torch.layout, torch.memory_format)
    symbolic = (torch.SymInt, torch.SymFloat, torch.SymBool)

    def dtype_name(value: torch.dtype) -> str:
        """``torch.bfloat16`` -> ``"bfloat16"``."""
        return names.get(value) or str(value).removeprefix("torch.")

    def tensor_spec(t: torch.Tensor) -> dict:
        return {"t": "tensor", "shape": list(t.shape), "stride": list(t.stride()),
                "dtype": dtype_name(t.dtype), "offset": t.storage_offset()}

    def unstrided_spec(t: torch.Tensor) -> dict:
        """A sparse, nested or other tensor without one set of strides: its kind in ``layout``
        (a nested tensor's components differ in size: it has no one shape either)."""
        if t.is_nested:
            return {"t": "tensor", "shape": [], "dtype": dtype_name(t.dtype), "layout": "nested"}
        return {"t": "tensor", "shape": list(t.shape), "dtype": dtype_name(t.dtype),
                "layout": str(t.layout).removeprefix("torch.")}

    def encode_value(value: Any) -> Any:
        """The arg spec of one argument value."""
        if isinstance(value, tensor):
            if value.layout is strided:
                try:
                    return tensor_spec(value)
                except RuntimeError:  # a nested tensor: strided components, no one shape
                    pass
            return unstrided_spec(value)
        if value is None or isinstance(value, (bool, int, float, str)):
            return value
        if isinstance(value, (list, tuple)):
            return {"t": "list", "items": [encode_value(item) for item in value]}
        if isinstance(value, dtype):
            return {"t": "dtype", "v": dtype_name(value)}
        if isinstance(value, device):
            return {"t": "device", "v": str(value)}
        if isinstance(value, layout):
            return {"t": "layout", "v": str(value).removeprefix("torch.")}
        if isinstance(value, memory_format):
            return {"t": "memory_format", "v": str(value).removeprefix("torch.")}
        if isinstance(value, symbolic):
            return {"t": "sym", "v": str(value)}
        return {"t": "other", "v": type(value).__name__}

    def encode_call(func: Any, args: tuple | list, kwargs: dict) -> tuple[list, dict]:
        """``(args_spec, kwargs_spec)`` for one call of ``func`` (an OpOverload; not encoded)."""
        return [encode_value(a) for a in args], {k: encode_value(v) for k, v in kwargs.items()}

    return {"dtype_name": dtype_name, "tensor_spec": tensor_spec, "encode_value": encode_value,
            "encode_call": encode_call}


# ----- walking -----


def is_tensor_spec(value: Any) -> bool:
    return isinstance(value, dict) and value.get("t") == "tensor"


def list_items(spec: Any) -> list | None:
    """The items of a list spec; None for any other value."""
    if isinstance(spec, dict) and spec.get("t") == "list":
        return spec["items"]
    return None


def walk(spec: Any, path: str = "") -> Iterator[tuple[str, Any]]:
    """``(path, leaf)`` for every value inside ``spec`` that is not a list, in argument order.
    List specs and Python lists and tuples (a call's arguments; a saved sample's lists) are
    entered alike, each item adding ``[i]`` to ``path``."""
    items = list_items(spec)
    if items is None and isinstance(spec, (list, tuple)):
        items = spec
    if items is None:
        yield path, spec
        return
    for i, item in enumerate(items):
        yield from walk(item, f"{path}[{i}]")


def tensor_specs(spec: Any) -> list[dict]:
    """Every tensor spec inside ``spec`` (an arg spec, or lists of them), in argument order."""
    return [leaf for _, leaf in walk(spec) if is_tensor_spec(leaf)]


# ----- decoding: specs -> values -----


def torch_dtype(name: str) -> torch.dtype:
    """``"bfloat16"`` -> ``torch.bfloat16``."""
    import torch

    value = getattr(torch, name, None)
    if not isinstance(value, torch.dtype):
        raise ArgSpecError(f"unknown dtype {name!r} in an arg spec")
    return value


def torch_value(kind: str, name: Any) -> Any:
    """The torch object a dtype, device, layout or memory-format spec names."""
    import torch

    if kind == "dtype":
        return torch_dtype(name)
    if kind == "device":
        return torch.device(name)
    expected = {"layout": torch.layout, "memory_format": torch.memory_format}.get(kind)
    if expected is None:
        raise ArgSpecError(f"an argument of kind {kind!r} ({name}) cannot be rebuilt")
    value = getattr(torch, str(name), None)
    if not isinstance(value, expected):
        raise ArgSpecError(f"unknown {kind} {name!r} in an arg spec")
    return value


def decode(spec: Any, make_tensor: Callable[[dict], Any], *,
           make_list: Callable[[list], Any] = tuple,
           make_named: Callable[[str, Any], Any] = torch_value,
           make_scalar: Callable[[Any], Any] | None = None) -> Any:
    """``spec`` as a value, built bottom up: tensor specs by ``make_tensor``, lists (list specs
    and Python lists) from their decoded items by ``make_list`` (tuples by default, as aten
    accepts them and no callee can keep state in them), specs with a ``"v"`` by
    ``make_named(kind, v)`` (torch objects by default), plain scalars by ``make_scalar`` (as
    they are by default)."""

    def one(value: Any) -> Any:
        if isinstance(value, dict):
            kind = value.get("t")
            if kind == "tensor":
                return make_tensor(value)
            if kind == "list":
                return make_list([one(item) for item in value["items"]])
            if "v" not in value:
                raise ArgSpecError(f"{value} is not an arg spec")
            return make_named(kind, value["v"])
        if isinstance(value, (list, tuple)):
            return make_list([one(item) for item in value])
        return value if make_scalar is None else make_scalar(value)

    return one(spec)


def placed(device: torch.device) -> Callable[[str, Any], Any]:
    """A ``make_named`` for ``decode`` that reads every device as ``device``, the one kforge runs
    the call on: a device is data (``"cpu"`` in a card a GPU worker ran made its tensors, of
    whatever size the card said, in host memory)."""

    def named(kind: str, name: Any) -> Any:
        return device if kind == "device" else torch_value(kind, name)

    return named


def decode_call(op_name: str, args_spec: list, kwargs_spec: dict,
                make_tensor: Callable[[dict], Any], device: torch.device, *,
                make_list: Callable[[list], Any] = tuple) -> tuple[list, dict]:
    """A call of ``op_name`` read from data, as it runs on ``device``: its arguments ``decode``d
    (tensors by ``make_tensor``, in argument order) with every device read as ``device``
    (``placed``), and ``device`` given where the operator takes one by keyword (a factory:
    ``full``, ``ones``, ``arange``, ``empty``) and the call names none, which would make its
    tensor on the default device, in host memory."""
    named = placed(device)
    args = [decode(spec, make_tensor, make_list=make_list, make_named=named) for spec in args_spec]
    kwargs = {name: decode(spec, make_tensor, make_list=make_list, make_named=named)
              for name, spec in kwargs_spec.items()}
    if kwargs.get("device") is None and any(
            argument.name == "device" and argument.kwarg_only
            for argument in resolve_op(op_name)._schema.arguments):
        kwargs["device"] = device
    return args, kwargs


# ----- operators and schemas -----


# Namespaces whose operators a name read from data may resolve to: PyTorch's own, kforge's own
# (its kernels' and its regions' operators), and those of the model being captured here
# (``allow_namespace``). A name is data; it never reaches an arbitrary attribute of torch.ops.
BUILTIN_NAMESPACES = frozenset({"aten", "prims", "kforge", "kforge_region"})
_namespaces: set[str] = set(BUILTIN_NAMESPACES)
_NAME_PART = re.compile(r"(?!__)[A-Za-z_][A-Za-z0-9_]*")
# Operators of those namespaces whose effects reach past the tensors they are given and return:
# ``from_file`` maps a host file (read it; shared, write it), ``_print`` writes to the terminal.
# (TorchScript's builtins, such as ``aten::save``, ``aten::warn`` or string ops, are no dispatcher
# operators, which kforge records and calls; ``resolve_op`` refuses them all.)
HOST_EFFECTS = frozenset({"aten::from_file", "aten::_print"})


def allow_namespace(namespace: str) -> None:
    """Let ``resolve_op`` find the operators of ``namespace`` in this process (capture calls it
    for the custom operators the model it runs has registered)."""
    _namespaces.add(namespace)


@cache
def resolve_op(name: str) -> torch._ops.OpOverload:
    """``"aten._softmax.default"`` -> ``torch.ops.aten._softmax.default``: only ever an
    ``OpOverload`` of an allowed namespace, a dispatcher operator (what capture records) with no
    effect outside its tensors (``HOST_EFFECTS``); any other name is an ``ArgSpecError``."""
    import torch

    parts = name.split(".") if isinstance(name, str) else []
    if len(parts) != 3 or not all(_NAME_PART.fullmatch(part) for part in parts):
        raise ArgSpecError(f"{name!r} is not an operator name of the form namespace.op.overload")
    namespace, op_name, overload = parts
    if namespace not in _namespaces:
        raise ArgSpecError(f"{name!r} is not an operator kforge may call: namespace "
                           f"{namespace!r} is not one of {', '.join(sorted(_namespaces))}")
    try:
        packet = getattr(getattr(torch.ops, namespace), op_name)
        found = (getattr(packet, overload) if isinstance(packet, torch._ops.OpOverloadPacket)
                 and overload in packet.overloads() else None)
    except (AttributeError, RuntimeError):
        found = None
    if not isinstance(found, torch._ops.OpOverload):
        raise ArgSpecError(f"PyTorch {torch.__version__} has no operator {name!r}")
    schema = found._schema
    if schema.name in HOST_EFFECTS:
        raise ArgSpecError(f"{name!r} is not an operator kforge may call: it reaches outside the "
                           "tensors it is given (host files or the terminal)")
    try:
        torch._C._dispatch_find_schema_or_throw(schema.name, schema.overload_name)
    except RuntimeError:
        raise ArgSpecError(f"{name!r} is not an operator kforge may call: a TorchScript builtin, "
                           "no dispatcher operator") from None
    return found


# Operators that make a view of the sizes and strides they are given without checking them
# against the tensor's storage (sizes read from data reached memory past it, which the view, or
# the copy made of it, then read), each with the operator that takes the same arguments and
# checks them: what kforge calls for such a name read from data (``checked_op``).
CHECKED_TWINS = {"aten::_reshape_alias": "as_strided",
                 "aten::_reshape_alias_copy": "as_strided_copy"}


def checked_op(name: str) -> torch._ops.OpOverload:
    """What kforge calls for operator ``name`` read from data (an op card's, a region's node):
    ``resolve_op(name)``, or where that operator does not check the view it makes against its
    input's memory, the same overload of its checked twin (``CHECKED_TWINS``)."""
    func = resolve_op(name)
    twin = CHECKED_TWINS.get(func._schema.name)
    if twin is None:
        return func
    return resolve_op(f"{func.namespace}.{twin}.{func._overloadname}")


def bind(op_name: str, args_spec: list, kwargs_spec: dict) -> dict[str, Any]:
    """A call's arguments by their aten schema names, in schema order (positional, then keyword);
    an argument the call leaves out gets its schema default. Values stay arg specs. (A default of
    an enum type, such as ``MemoryFormat memory_format=contiguous_format``, is the enum's number,
    as the schema holds it.)"""
    arguments = resolve_op(op_name)._schema.arguments
    positional = sum(not argument.kwarg_only for argument in arguments)
    if len(args_spec) > positional:
        raise ArgSpecError(f"{op_name} takes {positional} positional arguments, "
                           f"not {len(args_spec)}")
    names = [argument.name for argument in arguments]
    if unknown := [name for name in kwargs_spec if name not in names]:
        raise ArgSpecError(f"{op_name} has no argument {unknown[0]!r} "
                           f"(its arguments: {', '.join(names)})")
    encode_value = _encoder()["encode_value"]
    bound = {}
    for i, argument in enumerate(arguments):
        name = argument.name
        if i < len(args_spec):
            if name in kwargs_spec:
                raise ArgSpecError(f"{op_name} gets argument {name!r} both by position and "
                                   "by keyword")
            bound[name] = args_spec[i]
        elif name in kwargs_spec:
            bound[name] = kwargs_spec[name]
        elif argument.has_default_value():
            bound[name] = encode_value(argument.default_value)
        else:
            raise ArgSpecError(f"{op_name} needs argument {name!r}, which the call does not pass")
    return bound


# Argument kinds a call may hold besides numbers, strings, None, lists and tensors: each names a
# torch value and is rebuilt from its name (``torch_value``), never from an object.
_NAMED_KINDS = {"dtype": "int", "layout": "int", "memory_format": "int", "device": "Device",
                "sym": "int"}  # -> the schema type they stand at (dtypes and enums are ints)


def check_call(op_name: str, args_spec: list, kwargs_spec: dict, *,
               is_tensor: Callable[[Any], bool] = is_tensor_spec) -> dict[str, Any]:
    """``bind``'s result, once every argument is found to fit its schema type: a tensor (what
    ``is_tensor`` accepts: tensor specs, or a region's references) only where the schema takes
    one, a string only where it takes one, dtypes, devices, layouts and memory formats by name,
    numbers, None and lists of these; nothing else (no object, no callable). What a call read
    from data must pass before it is made. Raises ArgSpecError naming the argument."""
    if not isinstance(args_spec, list) or not isinstance(kwargs_spec, dict):
        raise ArgSpecError(f"a call of {op_name} needs a list of arguments and a dict of "
                           "keyword arguments")
    bound = bind(op_name, args_spec, kwargs_spec)
    for argument in resolve_op(op_name)._schema.arguments:
        problem = _misfit(str(argument.type), bound[argument.name], is_tensor)
        if problem:
            raise ArgSpecError(f"{op_name} argument {argument.name!r}: {problem}")
    return bound


def _misfit(kind: str, spec: Any, is_tensor: Callable[[Any], bool]) -> str | None:
    """Why ``spec`` cannot stand at an argument of schema type ``kind``; None where it can."""
    if spec is None or type(spec) in (bool, int, float):  # a number may stand for a tensor too
        return None
    kind = kind.removeprefix("Optional[").removesuffix("]") if kind.startswith("Optional[") \
        else kind
    if is_tensor(spec):
        return None if "Tensor" in kind else f"a tensor where the schema takes {kind}"
    if isinstance(spec, dict) and spec.get("t") == "list":
        items = spec.get("items")
        if not isinstance(items, list):
            return "a list spec without a list of items"
    else:
        items = spec if isinstance(spec, (list, tuple)) else None
    if items is not None:
        if not kind.startswith("List["):
            return f"a list where the schema takes {kind}"
        inner = kind[len("List["):-1]
        return next((p for p in (_misfit(inner, item, is_tensor) for item in items) if p), None)
    if type(spec) is str:
        return None if kind == "str" else f"a string where the schema takes {kind}"
    if isinstance(spec, dict) and spec.keys() == {"t", "v"} and type(spec["v"]) is str:
        wanted = _NAMED_KINDS.get(spec["t"])
        if wanted is not None and (wanted == kind or kind in ("number", "t")):
            return None
    return f"{str(spec)[:80]} is not a value of type {kind}"


# ----- comparing -----


def storage_span(shape: tuple[int, ...] | list[int], stride: tuple[int, ...] | list[int]) -> int:
    """Elements between a tensor's first and last element, inclusive (0 for an empty tensor)."""
    if any(size == 0 for size in shape):
        return 0
    return 1 + sum((size - 1) * abs(step) for size, step in zip(shape, stride))


_TENSOR_KEYS = frozenset({"t", "shape", "stride", "dtype", "offset"})


def freeze(spec: Any) -> Any:
    """An arg spec as a hashable value, equal exactly when the specs' canonical JSON is equal:
    dict keys in any order, lists and tuples alike, but ``1``, ``1.0`` and ``True`` apart. (A
    strided tensor's shape and strides, always integers, are compared as integer tuples: the
    fast path, since this runs on every call of a patched op.)"""
    kind = type(spec)
    if kind is dict:
        if spec.keys() == _TENSOR_KEYS and spec["t"] == "tensor":
            return ("tensor", tuple(spec["shape"]), tuple(spec["stride"]), spec["dtype"],
                    spec["offset"])
        return (dict, tuple(sorted((key, freeze(value)) for key, value in spec.items())))
    if kind is list or kind is tuple:
        return (list, tuple([freeze(value) for value in spec]))
    if kind is float:
        return (float, repr(spec))  # repr: NaN equals NaN, -0.0 differs from 0.0
    if kind is bool or kind is int:
        return (kind, spec)
    return spec


def is_contiguous(shape: list[int], stride: list[int]) -> bool:
    """Row-major contiguity, ignoring strides of size-1 dimensions as PyTorch does."""
    expected = 1
    for size, step in zip(reversed(shape), reversed(stride)):
        if size != 1 and step != expected:
            return False
        expected *= size
    return True
