"""Arg specs as people read them: ``bf16[8,4096]``, ``f32[64,64]*`` for a non-contiguous tensor,
and a range card's arguments with each varying integer written as its law
(``bf16[1,8,L+1,256], -2 for L=1..4096``)."""

from __future__ import annotations

import copy
from typing import Any

from kforge.core.argspec import decode, is_contiguous, tensor_specs
from kforge.core.laws import Ranges


def describe_tensor(spec: dict) -> str:
    """Short human form, e.g. ``bf16[8,4096]``, ``f32[64,64]*`` for a non-contiguous tensor,
    ``f32[2,8]*@25`` for one 25 elements into its storage, ``f32[4,16] sparse_coo`` or
    ``f32 nested`` for one without strides."""
    short = {"bfloat16": "bf16", "float16": "f16", "float32": "f32", "float64": "f64",
             "int64": "i64", "int32": "i32", "bool": "b8", "uint8": "u8", "int8": "i8"}
    dtype = short.get(spec["dtype"], spec["dtype"])
    dims = ",".join(str(d) for d in spec["shape"])
    if "stride" not in spec:
        return f"{dtype}[{dims}] {spec.get('layout')}" if dims else f"{dtype} {spec.get('layout')}"
    mark = "" if is_contiguous(spec["shape"], spec["stride"]) else "*"
    offset = spec.get("offset", 0)  # a view into a larger tensor: another variant per place
    return f"{dtype}[{dims}]{mark}" + (f"@{offset}" if offset else "")


def describe_args(args: list, kwargs: dict) -> str:
    """One-line human form of a call's arguments for tables and prompts."""

    def one(spec: Any) -> str:
        return decode(spec, describe_tensor, make_list=lambda items: f"[{', '.join(items)}]",
                      make_named=lambda kind, name: str(name), make_scalar=repr)

    parts = [one(a) for a in args] + [f"{k}={one(v)}" for k, v in sorted(kwargs.items())]
    return ", ".join(parts)


class _LawText(str):
    """A varying integer written as its law, told apart from a string argument."""


def symbolic_args(args: list, kwargs: dict, ranges: Ranges) -> tuple[list, dict]:
    """The arg specs with each varying integer written as its law (``"L+1"``), for display."""
    root = copy.deepcopy({"args": args, "kwargs": kwargs})
    for law in ranges.laws:
        *parents, last = law.path
        holder: Any = root
        for step in parents:
            holder = holder[step]
        holder[last] = _LawText(law.text())
    return root["args"], root["kwargs"]


def describe_range_args(args: list, kwargs: dict, ranges: Ranges) -> str:
    """``bf16[1,8,L+1,256], -2 for L=1..4096``: the arguments with varying integers written as
    their laws (a tensor's dtype and contiguity mark as at the profiled point), and the range."""
    shown_args, shown_kwargs = symbolic_args(args, kwargs, ranges)
    # decode visits positional arguments in order, then keyword arguments sorted by name
    exact = iter(tensor_specs(args) + [t for name in sorted(kwargs)
                                       for t in tensor_specs(kwargs[name])])

    def tensor(spec: dict) -> str:
        held = describe_tensor(next(exact))
        dims = ",".join(str(d) for d in spec["shape"])
        return f"{held[:held.index('[')]}[{dims}]{'*' if held.endswith('*') else ''}"

    def one(spec: Any) -> str:
        return decode(spec, tensor, make_list=lambda items: f"[{', '.join(items)}]",
                      make_named=lambda kind, name: str(name),
                      make_scalar=lambda v: v if isinstance(v, _LawText) else repr(v))

    parts = [one(a) for a in shown_args] + [f"{k}={one(v)}" for k, v in
                                            sorted(shown_kwargs.items())]
    return f"{', '.join(parts)} for {ranges.text()}"
