"""Reading a fusion region's nodes as a program (``kforge.propose.library.regions.program``), or
declining it.

Each output is followed back through the region's nodes, at the output's own coordinates:

- a view (transpose, unsqueeze, slice, select, expand, view, split, ...) changes the coordinates
  a value is read at: it is carried down and applied, as PyTorch applies it, to the input that is
  finally read, so that every input read is a strided access (a ``Leaf``); broadcasting is an
  expand. Views of results pass through pointwise ops and copies to their inputs.
- a pointwise op (one the elementwise family computes, or a cast) becomes an ``Apply`` with the
  dtype eager gives its result (found by running the region on meta tensors).
- ``cat`` splits the output's coordinates into pieces, each read from one of its tensors.
- ``mean``, ``sum`` and ``amax`` over the last dimension, and ``_softmax`` / ``_log_softmax``
  over it, become stages: reductions over each row of the output.

Anything else declines the region with the reason: an op no kernel computes, a view no strided
access can express, a reduction over another dimension, an output that aliases an input or
another output.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import torch

from kforge.core.argspec import (
    ArgSpecError,
    bind,
    decode,
    list_items,
    resolve_op,
    torch_dtype,
    torch_value,
    walk,
)
from kforge.core.region import Region, is_ref
from kforge.propose.library.cards import (
    FLOAT_CTYPES,
    Declined,
    TensorArg,
    contiguous_strides,
)
from kforge.propose.library.families.elementwise import FORMS, Form
from kforge.propose.library.regions.program import (
    Apply,
    Box,
    Const,
    Expr,
    Leaf,
    Load,
    Output,
    Piece,
    Program,
    Stage,
    Total,
)

# Ops that only change how a tensor is indexed, and the op that applies them to a strided view
# (``_unsafe_view`` is a view whose result PyTorch does not mark as one).
VIEW_OPS = {
    "aten.transpose.int": "aten.transpose.int",
    "aten.permute.default": "aten.permute.default",
    "aten.unsqueeze.default": "aten.unsqueeze.default",
    "aten.squeeze.dim": "aten.squeeze.dim",
    "aten.squeeze.dims": "aten.squeeze.dims",
    "aten.squeeze.default": "aten.squeeze.default",
    "aten.slice.Tensor": "aten.slice.Tensor",
    "aten.select.int": "aten.select.int",
    "aten.narrow.default": "aten.narrow.default",
    "aten.expand.default": "aten.expand.default",
    "aten.view.default": "aten.view.default",
    "aten._unsafe_view.default": "aten.view.default",
    "aten.t.default": "aten.t.default",
    "aten.alias.default": "aten.alias.default",
    "aten.detach.default": "aten.detach.default",
    "aten.lift_fresh.default": "aten.alias.default",
    "aten.split.Tensor": "aten.split.Tensor",
    "aten.split_with_sizes.default": "aten.split_with_sizes.default",
    "aten.unbind.int": "aten.unbind.int",
}
LIST_VIEW_OPS = ("aten.split.Tensor", "aten.split_with_sizes.default", "aten.unbind.int")
# Copies that keep every value (their memory format only decides the result's layout).
COPY_OPS = ("aten.clone.default",)


def _unary(function: str) -> Form:
    return Form(1, lambda t, v, s: f"{function}({t[0]})")


def _softplus(t: list[str], v: list, s: dict[str, str]) -> str:
    return f"kf::softplus({t[0]}, {s.get('beta', '1.f')}, {s.get('threshold', '1.f')})"


# Pointwise ops beyond the elementwise family's, in the same form.
EXTRA_FORMS = {"aten.sin.default": _unary("sinf"), "aten.cos.default": _unary("cosf"),
               "aten.log.default": _unary("logf"), "aten.reciprocal.default": _unary("1.f / "),
               "aten.softplus.default": Form(1, _softplus, named=(("beta", 1), ("threshold", 2)))}
POINTWISE: dict[str, Form] = {**{op: f for op, f in FORMS.items() if not f.inplace}, **EXTRA_FORMS}
REDUCTIONS = {"aten.mean.dim": "sum", "aten.sum.dim_IntList": "sum", "aten.amax.default": "max"}
SOFTMAXES = ("aten._softmax.default", "aten._log_softmax.default")

# Descriptors are meta tensors this many elements into their storage, so that a piece of a cat,
# read at the cat's coordinates, may start before its own first element.
BASE = 2**40


@dataclass(frozen=True)
class ViewStep:
    """One view applied to a strided tensor: ``op(t, *args, **kwargs)``, and where the op returns
    several tensors (``split``), the one numbered ``item``."""

    op: str
    args: tuple
    kwargs: tuple[tuple[str, Any], ...] = ()
    item: int | None = None

    def apply(self, t: torch.Tensor) -> torch.Tensor:
        result = resolve_op(self.op)(t, *map(_thaw, self.args),
                                     **{k: _thaw(v) for k, v in self.kwargs})
        return result[self.item] if self.item is not None else result


@dataclass(frozen=True)
class Embed:
    """A tensor joined by ``cat`` read at the cat's coordinates: dimension ``dim`` grows to
    ``size``, the tensor starting at ``start`` along it (elsewhere the read is never made)."""

    dim: int
    start: int
    size: int

    def apply(self, t: torch.Tensor) -> torch.Tensor:
        shape = list(t.shape)
        shape[self.dim] = self.size
        return t.as_strided(shape, t.stride(), t.storage_offset() - self.start * t.stride(self.dim))


Move = ViewStep | Embed


def expand_step(shape: tuple[int, ...]) -> ViewStep:
    return ViewStep("aten.expand.default", (tuple(shape),))


def descriptor(shape: tuple[int, ...], stride: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """A meta tensor of this layout, ``BASE`` elements into a storage that any view fits in."""
    span = sum((n - 1) * s for n, s in zip(shape, stride)) + 1
    storage = torch.empty(2 * BASE + span, dtype=dtype, device="meta")
    return storage.as_strided(shape, stride, BASE)


def match_region(region: Region | dict, inputs: list | None = None) -> Program:
    """The program that computes ``region`` for ``inputs`` (arg specs: a card's arguments; the
    region's own inputs by default); Declined, with the reason, when there is none."""
    return _Matcher(region, inputs).program()


def region_outputs(region: Region | dict, inputs: list | None = None) -> tuple[TensorArg, ...]:
    """What the region's operator returns for ``inputs`` (shapes, strides, dtypes), by running
    its chain on meta tensors; Declined when the chain does not run there."""
    matcher = _Matcher(region, inputs)
    region = matcher.region
    found = []
    for ref in region.outputs:
        value = matcher.meta(ref)
        # The operator copies a result that shares memory with an input.
        found.append(value.clone() if matcher.base_of(ref).startswith("x") else value)
    return tuple(TensorArg.from_tensor(t) for t in found)


class _Matcher:
    def __init__(self, region: Region | dict, inputs: list | None) -> None:
        self.region = Region.from_dict(region) if isinstance(region, dict) else region
        specs = self.region.inputs if inputs is None else inputs
        if len(specs) != len(self.region.inputs):
            raise Declined(f"the region takes {len(self.region.inputs)} inputs, not {len(specs)}")
        self.inputs = tuple(TensorArg.from_spec(spec) for spec in specs)
        self.stages: list[Stage] = []
        self.space: tuple[int, ...] = ()  # the shape of the output being followed
        self.row_shape: tuple[int, ...] | None = None  # the shape whose rows the stages reduce
        self.group: GroupSpace | None = None  # a group norm's coordinates, where there is one
        self.memo: dict[tuple, list[Piece]] = {}

    # ----- the region's values -----

    @cached_property
    def values(self) -> dict[str, Any]:
        """Every value of the region as a meta tensor (shapes, strides and dtypes as eager's)."""
        try:
            self.region.check()
        except ArgSpecError as exc:
            raise Declined(str(exc)) from None
        values: dict[str, Any] = {}
        for i, t in enumerate(self.inputs):
            if any(s < 0 for s in t.stride):
                raise Declined(f"input x{i} has negative strides")
            values[f"x{i}"] = torch.empty_strided(t.shape, t.stride, dtype=torch_dtype(t.dtype),
                                                  device="meta")
        for index, node in enumerate(self.region.nodes):
            try:
                result = resolve_op(node["op"])(*[self.decode(a, values) for a in node["args"]],
                                                **{k: self.decode(v, values)
                                                   for k, v in node["kwargs"].items()})
            except (RuntimeError, TypeError, ValueError, IndexError, NotImplementedError) as exc:
                raise Declined(f"node n{index} ({node['op']}) does not run on meta tensors: "
                               f"{first_line(exc)}") from None
            if isinstance(result, (tuple, list)):
                for j, item in enumerate(result):
                    values[f"n{index}.{j}"] = item
            else:
                values[f"n{index}"] = result
        return values

    @staticmethod
    def decode(spec: Any, values: dict[str, Any]) -> Any:
        def named(kind: str, v: Any) -> Any:
            if kind == "ref":
                return values[v]
            return torch.device("meta") if kind == "device" else torch_value(kind, v)

        return decode(spec, _no_tensor, make_list=list, make_named=named)

    def meta(self, ref: str) -> torch.Tensor:
        value = self.values[ref]
        if not isinstance(value, torch.Tensor):
            raise Declined(f"{ref} is not a tensor")
        return value

    def node(self, ref: str) -> tuple[dict, int | None]:
        """The node that produces ``ref``, and which of its results ``ref`` is."""
        name, _, item = ref.partition(".")
        return self.region.nodes[int(name[1:])], int(item) if item else None

    def bound(self, ref: str) -> dict[str, Any]:
        node, _ = self.node(ref)
        return bind(node["op"], node["args"], node["kwargs"])

    def plain(self, spec: Any, op: str) -> Any:
        """A non-tensor argument as a Python value (ints, lists of ints, None)."""
        if any(is_ref(leaf) for _, leaf in walk(spec)):
            raise Declined(f"{op} takes a tensor argument besides its input")
        return self.decode(spec, {})

    def source(self, ref: str) -> str:
        """The tensor a view or copy node reads."""
        node, _ = self.node(ref)
        first = node["args"][0] if node["args"] else None
        if not is_ref(first):
            raise Declined(f"{node['op']} does not read a tensor first")
        return first["v"]

    def base_of(self, ref: str) -> str:
        """The input or computed value that ``ref`` is a view of (``ref`` itself if none)."""
        while not ref.startswith("x") and self.node(ref)[0]["op"] in VIEW_OPS:
            ref = self.source(ref)
        return ref

    # ----- the program -----

    def program(self) -> Program:
        self.group = self.group_space()
        if self.group is not None:
            self.row_shape = self.group.shape
        # Whole tensors first: a statistic returned as well is placed on their rows.
        order = sorted(range(len(self.region.outputs)),
                       key=lambda i: -self.meta(self.base_of(self.region.outputs[i])).numel())
        found = {i: self.output(i, self.region.outputs[i]) for i in order}
        if not self.stages:  # computed in the order outputs lie in memory: stores coalesce
            found = {i: self.output(i, self.region.outputs[i], memory_order(o.stride))
                     if o.stride[-1] != 1 and o.shape[-1] != 1 else o for i, o in found.items()}
        outputs = tuple(found[i] for i in range(len(found)))
        if self.stages and any(o.shape != self.row_shape for o in outputs):
            raise Declined("outputs of different shapes share row reductions")
        return Program(self.inputs, tuple(self.stages), outputs,
                       2 if self.group is not None else 1)

    def output(self, index: int, ref: str, order: tuple[int, ...] | None = None) -> Output:
        """Output ``index`` at its own coordinates (``order``: permuted so), or at the rows' or
        the group norm's."""
        eager = self.meta(ref)
        base = self.base_of(ref)
        if base.startswith("x"):
            raise Declined(f"output {index} is a view of input {base}")
        if any(self.base_of(other) == base for other in self.region.outputs if other != ref):
            raise Declined(f"outputs share the memory of {base}")
        computed = self.meta(base)
        if eager.numel() == 0:
            raise Declined(f"output {index} is empty")
        if not (eager.numel() == computed.numel() and is_dense(computed) and is_dense(eager)
                and eager.storage_offset() == computed.storage_offset() == 0):
            raise Declined(f"output {index} is a partial view of {base}")
        dtype = float_dtype(computed, f"output {index}")
        shape = tuple(computed.shape)
        moves: tuple[Move, ...] = ()
        if self.group is not None:
            self.space, moves = self.group.shape, self.group.moves_for(shape, f"output {index}")
        elif self.row_shape is not None and shape != self.row_shape:
            self.space, moves = self.row_shape, self.per_row_moves(shape, f"output {index}")
        elif order is not None:
            self.space = tuple(shape[d] for d in order)
            moves = (ViewStep("aten.permute.default", (order,)),)
        else:
            self.space = shape
        pieces = self.element(base, moves, full_box(self.space))
        t = self.moved(moves, descriptor(shape, tuple(computed.stride()), computed.dtype),
                       f"output {index}")
        stride = tuple(s if n != 1 else 0 for s, n in zip(t.stride(), t.shape))
        return Output(index, self.space, stride, dtype, tuple(pieces), TensorArg.from_tensor(eager))

    def per_row_moves(self, shape: tuple[int, ...], what: str) -> tuple[Move, ...]:
        """A value per row of the rows (with or without its reduced dimension kept) at the
        rows' coordinates."""
        assert self.row_shape is not None
        rows = self.row_shape[:-1]
        if shape == rows + (1,):
            return (expand_step(self.row_shape),)
        if shape == rows:
            return (ViewStep("aten.unsqueeze.default", (-1,)), expand_step(self.row_shape))
        raise Declined(f"{what} has shape {list(shape)}, neither the rows' "
                       f"{list(self.row_shape)} nor one value per row")

    def group_space(self) -> GroupSpace | None:
        """The coordinates of the region's group norm, if it has one."""
        refs = [f"n{i}" for i, n in enumerate(self.region.nodes)
                if n["op"] == "aten.native_group_norm.default"]
        if not refs:
            return None
        if len(refs) > 1:
            raise Declined("the region has more than one group norm")
        bound = self.bound(refs[0] + ".0")
        x = self.meta(bound["input"]["v"]) if is_ref(bound["input"]) else None
        n, c, hw, groups = (self.plain(bound[k], "native_group_norm") for k in
                            ("N", "C", "HxW", "group"))
        if x is None or x.dim() < 2 or list(x.shape[:2]) != [n, c] or c % groups:
            raise Declined("the group norm's arguments do not describe its input")
        # Positions innermost, unless the input read has its channels innermost (channels last).
        read = self.base_through_copies(bound["input"]["v"])
        channels_last = read.startswith("x") and self.inputs[int(read[1:])].stride[1] == 1
        return GroupSpace(tuple(x.shape), groups, channels_last)

    def base_through_copies(self, ref: str) -> str:
        while not ref.startswith("x") and self.node(ref)[0]["op"] in (*VIEW_OPS, *COPY_OPS):
            ref = self.source(ref)
        return ref

    # ----- following values -----

    def element(self, ref: str, moves: tuple[Move, ...], box: Box) -> list[Piece]:
        """``ref``'s values at the output coordinates in ``box``. ``moves`` take ``ref``'s own
        coordinates to the output's, applied first to last."""
        key = (ref, moves, box, self.space)
        if key not in self.memo:
            self.memo[key] = self.follow(ref, moves, box)
        return self.memo[key]

    def follow(self, ref: str, moves: tuple[Move, ...], box: Box) -> list[Piece]:
        if ref.startswith("x"):
            return [Piece(box, Load(self.leaf(int(ref[1:]), moves)))]
        node, _ = self.node(ref)
        op = node["op"]
        if op in VIEW_OPS:
            return self.element(self.source(ref), (self.view_step(ref),) + moves, box)
        if op in COPY_OPS:
            return self.element(self.source(ref), moves, box)
        if op in POINTWISE:
            return self.pointwise(ref, moves, box)
        if op in REDUCTIONS:
            return [Piece(box, self.reduction(ref, moves))]
        if op in SOFTMAXES:
            return [Piece(box, self.softmax(ref, moves))]
        if op == "aten.cat.default":
            return self.cat(ref, moves, box)
        if op == "aten.native_group_norm.default":
            return [Piece(box, self.group_norm(ref, moves))]
        raise Declined(f"{op} (node {ref}) is not an op the region kernels compute")

    def moved(self, moves: tuple[Move, ...], t: torch.Tensor, what: str) -> torch.Tensor:
        """``t`` (a descriptor) at the output's coordinates."""
        for move in moves:
            try:
                t = move.apply(t)
            except (RuntimeError, TypeError, ValueError, IndexError) as exc:
                op = move.op if isinstance(move, ViewStep) else "cat"
                raise Declined(f"{what} cannot be read through {op} as a strided view: "
                               f"{first_line(exc)}") from None
        if tuple(t.shape) != self.space:
            raise Declined(f"{what} is read with shape {list(t.shape)}, not the output's "
                           f"{list(self.space)}")
        return t

    def leaf(self, index: int, moves: tuple[Move, ...]) -> Leaf:
        x = self.inputs[index]
        require_float(x.dtype, f"input x{index}")
        t = self.moved(moves, descriptor(x.shape, x.stride, torch_dtype(x.dtype)),
                       f"input x{index}")
        stride = tuple(s if n != 1 else 0 for s, n in zip(t.stride(), t.shape))
        return Leaf(index, stride, t.storage_offset() - BASE, x.dtype)

    def view_step(self, ref: str) -> ViewStep:
        node, item = self.node(ref)
        op = node["op"]
        if op in LIST_VIEW_OPS and item is None:
            raise Declined(f"{op} gives a list, not one tensor")
        bound = self.bound(ref)
        schema = resolve_op(op)._schema.arguments[1:]
        args = tuple(_freeze(self.plain(bound[a.name], op)) for a in schema if not a.kwarg_only)
        kwargs = tuple((a.name, _freeze(self.plain(bound[a.name], op))) for a in schema
                       if a.kwarg_only)
        return ViewStep(VIEW_OPS[op], args, kwargs, item if op in LIST_VIEW_OPS else None)

    def pointwise(self, ref: str, moves: tuple[Move, ...], box: Box) -> list[Piece]:
        node, _ = self.node(ref)
        op, form = node["op"], POINTWISE[node["op"]]
        result = self.meta(ref)
        dtype = float_dtype(result, f"node {ref} ({op})")
        bound = self.bound(ref)
        names = list(bound)
        if op == "aten._to_copy.default":
            check_copy(bound)
        operands: list[list[Piece]] = []
        for name in names[:form.operands]:
            spec = bound[name]
            if is_ref(spec):
                source = self.meta(spec["v"])
                float_dtype(source, f"{spec['v']}, read by {op}")
                expand = (expand_step(tuple(result.shape)),) if source.shape != result.shape else ()
                operands.append(self.element(spec["v"], expand + moves, box))
            elif isinstance(spec, (int, float)) and not isinstance(spec, bool):
                operands.append([Piece(box, Const(float(spec)))])
            else:
                raise Declined(f"{op} (node {ref}) has argument {name} = {spec!r}, neither a "
                               "tensor nor a number")
        named: list[tuple[str, float | str]] = []
        for keyword, position in form.named:
            value = bound[names[position]]
            if not isinstance(value, (int, float)) or isinstance(value, bool):
                raise Declined(f"{op} (node {ref}) has {keyword} = {value!r}, not a number")
            if value != 1:
                named.append((keyword, float(value)))
        if op == "aten.gelu.default":
            named.append(("approximate", "tanh" if bound["approximate"] == "tanh" else "erf"))
        return combine(operands, box, lambda args: Apply(op, tuple(args), dtype, tuple(named)))

    def cat(self, ref: str, moves: tuple[Move, ...], box: Box) -> list[Piece]:
        bound = self.bound(ref)
        result = self.meta(ref)
        float_dtype(result, f"node {ref} (cat)")
        dim = bound["dim"] % result.dim()
        tensors = list_items(bound["tensors"]) or []
        if not all(is_ref(t) for t in tensors):
            raise Declined(f"cat (node {ref}) joins something other than tensors")
        # The cat's coordinate along `dim` as a function of the output's coordinates.
        probe = [0] * result.dim()
        probe[dim] = 1
        where = self.moved(moves, descriptor(tuple(result.shape), tuple(probe), torch.float32),
                           f"cat (node {ref})")
        origin = where.storage_offset() - BASE
        moving = [(j, s) for j, (s, n) in enumerate(zip(where.stride(), where.shape))
                  if s != 0 and n != 1]
        if len(moving) > 1 or any(s < 0 for _, s in moving):
            raise Declined(f"cat (node {ref}) is read through a view that mixes its dimension "
                           "with others")
        pieces: list[Piece] = []
        start = 0
        for spec in tensors:
            part = self.meta(spec["v"])
            if part.dim() == 1 and part.shape[0] == 0 and result.dim() > 1:
                continue  # cat skips an empty 1-d tensor
            if part.dtype != result.dtype:
                raise Declined(f"cat (node {ref}) joins tensors of different dtypes")
            size = part.shape[dim]
            inner = box
            if moving:
                j, step = moving[0]
                lo = max(box[j][0], -((origin - start) // step))
                hi = min(box[j][1], -((origin - start - size) // step))
                inner = box[:j] + ((lo, hi),) + box[j + 1:] if lo < hi else None
            elif not start <= origin < start + size:
                inner = None
            if inner is not None:
                embed = Embed(dim, start, result.shape[dim])
                pieces += self.element(spec["v"], (embed,) + moves, inner)
            start += size
        return pieces

    # ----- row reductions -----

    def stage(self, kind: str, expr: Expr) -> int:
        found = Stage(kind, expr)
        if found not in self.stages:
            self.stages.append(found)
        return self.stages.index(found)

    def row_input(self, ref: str, what: str) -> Expr:
        """The reduced tensor ``ref`` as one expression over a row of the output's shape."""
        if self.group is not None:
            raise Declined(f"{what} reduces the last dimension in a group norm's region")
        if tuple(self.meta(ref).shape) != self.space:
            raise Declined(f"{what} reduces a tensor of shape {list(self.meta(ref).shape)}, not "
                           f"of the output's shape {list(self.space)}")
        if self.row_shape is not None and self.space != self.row_shape:
            raise Declined("row reductions over tensors of different shapes")
        self.row_shape = self.space
        pieces = self.element(ref, (), full_box(self.space))
        if len(pieces) != 1:
            raise Declined(f"{what} reduces a tensor joined from pieces")
        return pieces[0].expr

    def check_rows(self, ref: str, moves: tuple[Move, ...], what: str, *, per_row: bool) -> None:
        """Decline unless ``moves`` read ``ref`` at the output's own rows: one value per row
        broadcast along the last dimension (``per_row``), or element for element."""
        shape = tuple(self.meta(ref).shape)
        t = self.moved(moves, descriptor(shape, contiguous_strides(shape), torch.float32), what)
        want = contiguous_strides(shape if not per_row else self.space[:-1] + (1,))
        if per_row:
            want = want[:-1] + (0,)
        if t.storage_offset() != BASE or any(n != 1 and s != w for n, s, w
                                             in zip(self.space, t.stride(), want)):
            raise Declined(f"{what} is read at other coordinates than it is computed at")

    def reduction(self, ref: str, moves: tuple[Move, ...]) -> Expr:
        node, _ = self.node(ref)
        op = node["op"]
        bound = self.bound(ref)
        source = bound["self"]
        dtype = float_dtype(self.meta(ref), f"node {ref} ({op})")
        what = f"{op.split('.')[1]} (node {ref})"
        if not is_ref(source):
            raise Declined(f"{what} does not reduce a tensor")
        rank = self.meta(source["v"]).dim()
        dims = self.plain(bound["dim"], op)
        if not isinstance(dims, list) or [d % rank for d in dims] != [rank - 1]:
            raise Declined(f"{what} reduces dimensions {dims}, not only the last")
        if bound.get("dtype") is not None:
            raise Declined(f"{what} converts to another dtype")
        self.check_rows(ref, moves, what, per_row=True)
        total = Total(self.stage(REDUCTIONS[op], self.row_input(source["v"], what)))
        if op == "aten.mean.dim":
            return Apply("aten.div.Tensor", (total, Const(float(self.space[-1]))), dtype)
        return total if dtype == "float32" else Apply("aten._to_copy.default", (total,), dtype)

    def softmax(self, ref: str, moves: tuple[Move, ...]) -> Expr:
        node, _ = self.node(ref)
        op = node["op"]
        bound = self.bound(ref)
        result = self.meta(ref)
        dtype = float_dtype(result, f"node {ref} ({op})")
        what = f"{op.split('.')[1]} (node {ref})"
        if bound["dim"] % result.dim() != result.dim() - 1:
            raise Declined(f"{what} is over dimension {bound['dim']}, not the last")
        if tuple(result.shape) != self.space:
            raise Declined(f"{what} is read through a view")
        self.check_rows(ref, moves, what, per_row=False)
        x = self.row_input(bound["self"]["v"], what)
        row_max = Total(self.stage("max", x))
        centered = Apply("aten.sub.Tensor", (x, row_max), "float32")
        exp = Apply("aten.exp.default", (centered,), "float32")
        row_sum = Total(self.stage("sum", exp))
        if op == "aten._softmax.default":
            return Apply("aten.div.Tensor", (exp, row_sum), dtype)
        return Apply("aten.sub.Tensor", (centered, Apply("aten.log.default", (row_sum,),
                                                          "float32")), dtype)

    def group_norm(self, ref: str, moves: tuple[Move, ...]) -> Expr:
        """``native_group_norm``'s results as eager computes them on the GPU: mean and rstd of
        each group rounded to the statistics' dtype, and y = x * a + (bias - a * mean) with
        a = rstd * weight (y = (x - mean) * rstd without weight and bias)."""
        assert self.group is not None
        _, item = self.node(ref)
        space = self.group
        if moves != (space.element_moves if item == 0 else space.stat_moves):
            raise Declined(f"the group norm's result {ref} is read through a view")
        bound = self.bound(ref)
        x_ref = bound["input"]["v"]
        dtype = float_dtype(self.meta(x_ref), "the group norm's input")
        stats = float_dtype(self.meta(ref.split(".")[0] + ".1"), "the group norm's statistics")
        eps = self.plain(bound["eps"], "native_group_norm")
        x = self.whole(x_ref, space.element_moves, "the group norm's input")
        affine: list[Expr | None] = []
        for name in ("weight", "bias"):
            spec = bound[name]
            if spec is None:
                affine.append(None)
                continue
            if not is_ref(spec) or float_dtype(self.meta(spec["v"]), name) != dtype:
                raise Declined(f"the group norm's {name} is not a {dtype} tensor")
            per_channel = (ViewStep("aten.view.default", ((1, space.input_shape[1]) + (1,) * (
                len(space.input_shape) - 2),)), expand_step(space.input_shape))
            affine.append(self.whole(spec["v"], per_channel + space.element_moves, name))
        size = float(space.cols)
        total = Total(self.stage("sum", x))
        exact_mean = Apply("aten.div.Tensor", (total, Const(size)), "float32")
        centered = Apply("aten.sub.Tensor", (x, exact_mean), "float32")
        squares = Total(self.stage("sum", Apply("aten.mul.Tensor", (centered, centered),
                                                "float32")))
        variance = Apply("aten.div.Tensor", (squares, Const(size)), "float32")
        rstd = Apply("aten._to_copy.default", (Apply("aten.rsqrt.default", (
            Apply("aten.add.Tensor", (variance, Const(float(eps))), "float32"),), "float32"),),
            stats)
        mean = Apply("aten._to_copy.default", (exact_mean,), stats)
        if item == 1:
            return mean
        if item == 2:
            return rstd
        weight, bias = affine
        if weight is None and bias is None:
            return Apply("aten.mul.Tensor", (Apply("aten.sub.Tensor", (x, mean), "float32"),
                                             rstd), dtype)
        scale = rstd if weight is None else Apply("aten.mul.Tensor", (rstd, weight), "float32")
        shifted = Apply("aten.mul.Tensor", (scale, mean), "float32")
        shift = (Apply("aten.neg.default", (shifted,), "float32") if bias is None
                 else Apply("aten.sub.Tensor", (bias, shifted), "float32"))
        return Apply("aten.add.Tensor", (Apply("aten.mul.Tensor", (x, scale), "float32"),
                                         shift), dtype)

    def whole(self, ref: str, moves: tuple[Move, ...], what: str) -> Expr:
        """``ref`` read through ``moves`` at every coordinate: one expression."""
        pieces = self.element(ref, moves, full_box(self.space))
        if len(pieces) != 1:
            raise Declined(f"{what} is joined from pieces")
        return pieces[0].expr


@dataclass(frozen=True)
class GroupSpace:
    """A group norm's coordinates: (sample, group, channel in group, position), or with
    ``channels_last`` (sample, group, position, channel in group), so that the input read is
    innermost. A row is a group: the last two dimensions."""

    input_shape: tuple[int, ...]
    groups: int
    channels_last: bool

    @property
    def natural(self) -> tuple[int, ...]:
        n, c, *spatial = self.input_shape
        return (n, self.groups, c // self.groups, math.prod(spatial))

    @property
    def shape(self) -> tuple[int, ...]:
        n, g, cpg, hw = self.natural
        return (n, g, hw, cpg) if self.channels_last else self.natural

    @property
    def cols(self) -> int:
        return self.natural[2] * self.natural[3]

    @property
    def element_moves(self) -> tuple[Move, ...]:
        """From the input's coordinates to the group norm's."""
        view = ViewStep("aten.view.default", (self.natural,))
        if not self.channels_last:
            return (view,)
        return (view, ViewStep("aten.permute.default", ((0, 1, 3, 2),)))

    @property
    def stat_moves(self) -> tuple[Move, ...]:
        """From a statistic's coordinates (sample, group) to the group norm's."""
        n, g, _, _ = self.natural
        return (ViewStep("aten.view.default", ((n, g, 1, 1),)), expand_step(self.shape))

    def moves_for(self, shape: tuple[int, ...], what: str) -> tuple[Move, ...]:
        if shape == self.input_shape:
            return self.element_moves
        if shape == self.natural[:2]:
            return self.stat_moves
        raise Declined(f"{what} has shape {list(shape)}, neither the group norm's input's nor "
                       "its statistics'")


def memory_order(stride: tuple[int, ...]) -> tuple[int, ...]:
    """The dimensions from the outermost in memory to the innermost (size-1 ones, of stride 0,
    first)."""
    return tuple(sorted(range(len(stride)), key=lambda d: (-stride[d] if stride[d] else -2**62, d)))


def combine(operands: list[list[Piece]], box: Box, make: Any) -> list[Piece]:
    """The pieces of an op over its operands' pieces: one per overlap of one piece of each."""
    found: list[tuple[Box, list[Expr]]] = [(box, [])]
    for pieces in operands:
        found = [(overlap, exprs + [p.expr]) for where, exprs in found for p in pieces
                 if (overlap := intersect(where, p.box)) is not None]
    return [Piece(where, make(exprs)) for where, exprs in found]


def intersect(a: Box, b: Box) -> Box | None:
    box = tuple((max(lo1, lo2), min(hi1, hi2)) for (lo1, hi1), (lo2, hi2) in zip(a, b))
    return box if all(lo < hi for lo, hi in box) else None


def full_box(shape: tuple[int, ...]) -> Box:
    return tuple((0, n) for n in shape)


def is_dense(t: torch.Tensor) -> bool:
    """Non-overlapping and dense: the elements fill a block of memory exactly once."""
    expected = 1
    for stride, size in sorted((s, n) for s, n in zip(t.stride(), t.shape) if n != 1):
        if stride != expected:
            return False
        expected *= size
    return True


def float_dtype(t: torch.Tensor, what: str) -> str:
    name = str(t.dtype).removeprefix("torch.")
    require_float(name, what)
    return name


def require_float(dtype: str, what: str) -> None:
    if dtype not in FLOAT_CTYPES:
        raise Declined(f"{what} is {dtype} (float32, float16 and bfloat16 are supported)")


def check_copy(bound: dict[str, Any]) -> None:
    """A cast is a kernel's only when it stays on the GPU, strided."""
    device, layout = bound.get("device"), bound.get("layout")
    if isinstance(device, dict) and not str(device.get("v", "")).startswith("cuda"):
        raise Declined(f"a copy to {device.get('v')} is not a GPU kernel")
    if isinstance(layout, dict) and layout.get("v") != "strided":
        raise Declined(f"a copy to layout {layout.get('v')} is not supported")


def first_line(exc: Exception) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


def _no_tensor(spec: dict) -> Any:
    raise Declined("a region node holds a tensor spec instead of a reference")


def _freeze(value: Any) -> Any:
    return tuple(_freeze(v) for v in value) if isinstance(value, (list, tuple)) else value


def _thaw(value: Any) -> Any:
    return [_thaw(v) for v in value] if isinstance(value, tuple) else value

