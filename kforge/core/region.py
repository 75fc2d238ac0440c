"""Fusion regions: maximal connected chains of fusible ops inside one module call, found from a
model's recorded calls, each one unit to write a single kernel for.

Pure data and decisions. A recorded call (``TraceCall``) names the tensors it reads and writes by
identity; ``find_regions`` groups the fusible calls of each module call into connected chains
whose intermediate results are used only inside the chain, and writes each as a ``Region``: its
nodes (aten calls whose tensor arguments are references to region inputs or earlier nodes), its
inputs' arg specs (the exact variant) and its outputs. A region with the same nodes is the same
operator (``kforge_region.r_<hash>.default``) at every variant; the runtime registers it with
``torch.library`` so that the rest of kforge treats a region card as an op card.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from kforge.core import schema
from kforge.core.argspec import (
    ArgSpecError,
    check_call,
    is_tensor_spec,
    list_items,
    resolve_op,
    tensor_specs,
    walk,
)
from kforge.core.describe import describe_args
from kforge.core.opcard import canonical_json

NAMESPACE = "kforge_region"
MIN_OPS = 2  # ops that compute (not views) a region needs: one op is an op card already
MAX_OPS = 48
MAX_INPUTS = 8
MAX_OUTPUTS = 4
T = TypeVar("T")

# Native ops that may join a fusion region besides pointwise ones (``torch.Tag.pointwise``):
# reductions, norms, softmax, casts, and the ops that only move or reshape data.
REGION_OPS = frozenset({
    "sum", "mean", "amax", "amin", "max", "min", "var", "var_mean", "std", "std_mean", "prod",
    "logsumexp", "linalg_vector_norm", "norm", "any", "all", "argmax", "argmin",
    "native_layer_norm", "native_group_norm", "_fused_rms_norm", "rms_norm",
    "_native_batch_norm_legit_no_training",
    "_softmax", "_log_softmax", "_safe_softmax",
    "_to_copy", "clone", "cat", "stack", "where", "masked_fill", "clamp", "clamp_min",
    "clamp_max", "fill", "repeat", "flip", "roll", "tril", "triu",
})
# Views and metadata ops: they join a region but do no work of their own.
REGION_VIEW_OPS = frozenset({"_unsafe_view", "_reshape_alias", "alias", "lift_fresh", "detach"})
# Matrix products a region may start with, its other nodes their epilogue (the matmul family's
# ``region_problem``). Capture leaves vendor-library ops out of the regions it builds.
REGION_PRODUCT_OPS = frozenset({"mm", "addmm", "bmm"})


def may_join(op: str, *, pointwise: bool, aliases_input: bool, mutates: bool,
             returns_tensor: bool, reads_tensors: bool) -> bool:
    """Whether a call of ``op`` may be a node of a region: a functional aten op (no in-place
    write) that reads tensors and returns them, and is pointwise, one of REGION_OPS, a view or
    a matrix product. Capture builds regions of such calls only
    (``kforge.capture.classify.is_fusible``, which also leaves out every op a vendor library
    runs), and ``Region.check`` holds every region read from data to the same rule: no factory
    (nothing read: ``from_file`` maps a host file), no write, no op of another kind."""
    if mutates or not returns_tensor or not reads_tensors or not op.startswith("aten."):
        return False
    short = op.split(".")[1]
    return (pointwise or aliases_input or short in REGION_OPS or short in REGION_VIEW_OPS
            or short in REGION_PRODUCT_OPS)


def operator_facts(func: Any) -> dict[str, bool]:
    """What ``may_join`` asks of an operator (an OpOverload), from its tags and schema."""
    import torch

    schema = func._schema
    return {"pointwise": torch.Tag.pointwise in func.tags, "aliases_input": func.is_view,
            "mutates": schema.is_mutable,
            "returns_tensor": any("Tensor" in str(r.type) for r in schema.returns)}


@dataclass(frozen=True)
class TraceCall:
    """One recorded call: its op and arg specs, the identities of the tensors it reads (the tensor
    leaves of ``args`` then ``kwargs``, in walk order) and writes (its results' tensors, in order),
    the module call that issued it, and whether it may join a region (``fusible``; ``view``: it
    only reshapes or aliases, so it does not count as work)."""

    op: str
    args: list
    kwargs: dict
    reads: tuple[int, ...]
    writes: tuple[int, ...]
    scope: str
    fusible: bool
    view: bool = False
    key: str = ""


@dataclass(frozen=True)
class Region(schema.Record):
    """A chain of aten calls as one operator: ``nodes`` (``{"op", "args", "kwargs"}``, tensors as
    references ``{"t": "ref", "v": "x0"}`` to input 0, ``"n3"`` to node 3's result, ``"n3.1"`` to
    its second result), ``inputs`` (their arg specs: the variant) and ``outputs`` (references)."""

    nodes: tuple[dict, ...]
    inputs: tuple[dict, ...]
    outputs: tuple[str, ...]

    @property
    def name(self) -> str:
        """The operator's name: the same for the same nodes at any input shapes."""
        structure = canonical_json([list(self.nodes), list(self.outputs), len(self.inputs)])
        return "r_" + hashlib.sha256(structure.encode()).hexdigest()[:12]

    @property
    def op(self) -> str:
        return f"{NAMESPACE}.{self.name}.default"

    @property
    def ops(self) -> list[str]:
        """The aten ops of its nodes, in order."""
        return [node["op"] for node in self.nodes]

    def schema(self) -> str:
        """The ``torch.library`` schema: tensors in, tensors out."""
        params = ", ".join(f"Tensor x{i}" for i in range(len(self.inputs)))
        returns = ("Tensor" if len(self.outputs) == 1
                   else "(" + ", ".join("Tensor" for _ in self.outputs) + ")")
        return f"{self.name}({params}) -> {returns}"

    def source(self) -> str:
        """The region as a readable Python function of aten calls."""
        params = ", ".join(f"x{i}" for i in range(len(self.inputs)))
        lines = [f"def {self.name}({params}):"]
        for i, spec in enumerate(self.inputs):
            lines.append(f"    # x{i}: {describe_args([spec], {})}")
        for i, node in enumerate(self.nodes):
            target = node_name(i)
            lines.append(f"    {target} = {node['op'].removesuffix('.default')}("
                         f"{_call_text(node['args'], node['kwargs'])})")
        lines.append(f"    return {', '.join(ref.replace('.', '_') for ref in self.outputs)}")
        return "\n".join(lines)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Region:
        """A region as stored; one that cannot be read is an ArgSpecError, as a damaged arg spec
        is."""
        try:
            return schema.read(cls, data, schema.Origin.record(), what="fields")
        except schema.SchemaError as exc:
            raise ArgSpecError(f"{str(data)[:120]} is not a region ({exc})") from None

    def check(self) -> None:
        """Raise ArgSpecError unless every node calls an allowed operator (``resolve_op``) that
        may join a region (``may_join``: what capture builds regions of) with arguments that fit
        its schema (``check_call``), reading only the region's inputs and the tensor results of
        earlier nodes, and every output is such a result. Regions are read from databases, which
        may be crafted: this runs before any node is."""
        if not all(is_tensor_spec(spec) for spec in self.inputs):
            raise ArgSpecError(f"region {self.name}: an input is not a tensor spec")
        readable = {f"x{i}" for i in range(len(self.inputs))}
        listed: set[str] = set()  # nodes returning a tensor list: any item may be read

        def reads(index: int) -> Callable[[Any], bool]:
            def is_tensor(leaf: Any) -> bool:
                if not is_ref(leaf):
                    return False
                ref = leaf.get("v")
                if not _readable(ref, readable, listed):
                    raise ArgSpecError(f"region {self.name}: node n{index} reads {ref!r}, "
                                       "no input or earlier tensor result")
                return True

            return is_tensor

        for index, node in enumerate(self.nodes):
            if (not isinstance(node, dict) or node.keys() != {"op", "args", "kwargs"}
                    or not isinstance(node["op"], str)):
                raise ArgSpecError(f"region {self.name}: node n{index} is not a call")
            check_call(node["op"], node["args"], node["kwargs"], is_tensor=reads(index))
            func = resolve_op(node["op"])
            reads_tensors = any(is_ref(leaf) for _, leaf in walk(
                [node["args"], list(node["kwargs"].values())]))
            if not may_join(node["op"], reads_tensors=reads_tensors, **operator_facts(func)):
                raise ArgSpecError(
                    f"region {self.name}: node n{index} calls {node['op']}, which no region "
                    "holds (its nodes are functional aten ops that read tensors: pointwise ops, "
                    "reductions, norms, softmax, casts, views and matrix products)")
            returns = [str(r.type) for r in func._schema.returns]
            name = node_name(index)
            if returns == ["Tensor"]:
                readable.add(name)
            elif returns == ["List[Tensor]"]:
                listed.add(name)
            else:
                readable.update(f"{name}.{j}" for j, kind in enumerate(returns)
                                if kind == "Tensor")
        bad = [ref for ref in self.outputs if not _readable(ref, readable, listed)]
        if bad or not self.outputs:
            raise ArgSpecError(f"region {self.name}: output {bad[0] if bad else None!r} is no "
                               "tensor result of its nodes")


def node_name(index: int) -> str:
    return f"n{index}"


def is_ref(value: Any) -> bool:
    return isinstance(value, dict) and value.get("t") == "ref"


def _readable(ref: Any, readable: set[str], listed: set[str]) -> bool:
    if not isinstance(ref, str):
        return False
    base, dot, item = ref.partition(".")
    return ref in readable or (base in listed and dot and item.isdigit())


def _call_text(args: list, kwargs: dict) -> str:
    def one(spec: Any) -> str:
        if is_ref(spec):
            return spec["v"].replace(".", "_")
        items = list_items(spec)
        if items is not None:
            return "[" + ", ".join(one(i) for i in items) + "]"
        if isinstance(spec, dict) and "v" in spec:
            return f"torch.{spec['v']}" if spec["t"] in ("dtype", "layout") else repr(spec["v"])
        return repr(spec)

    return ", ".join([one(a) for a in args] + [f"{k}={one(v)}" for k, v in kwargs.items()])


@dataclass
class RegionInstance:
    """One occurrence of a region in the trace: the calls it is made of (trace indices), and
    where each input was first read (trace index, tensor-leaf index of that call)."""

    region: Region
    calls: tuple[int, ...]
    input_reads: tuple[tuple[int, int], ...]
    scope: str
    member_keys: tuple[str, ...] = field(default=())
    input_tensors: tuple[int, ...] = field(default=())  # identities, in input order
    output_tensors: tuple[int, ...] = field(default=())


def find_regions(trace: Sequence[TraceCall]) -> list[RegionInstance]:
    """Every region instance in ``trace``, in the order they start."""
    readers: dict[int, list[int]] = {}
    producer: dict[int, int] = {}
    for index, call in enumerate(trace):
        for tensor in call.reads:
            readers.setdefault(tensor, []).append(index)
        for tensor in call.writes:
            if tensor not in call.reads:  # an op may hand back its argument itself
                producer.setdefault(tensor, index)
    found = []
    for members in _components(trace, producer):
        instance = _region(trace, members, producer, readers)
        if instance is not None:
            found.append(instance)
            continue
        for piece in _pieces(trace, members, producer):  # no one kernel: its parts may be
            part = _region(trace, piece, producer, readers) if piece != members else None
            if part is not None:
                found.append(part)
    return sorted(found, key=lambda r: r.calls[0])


def _pieces(trace: Sequence[TraceCall], members: list[int],
            producer: dict[int, int]) -> list[list[int]]:
    """A chain that cannot be one kernel, cut before each call that reads what a call outside
    the chain made after the cut's start (a matmul between a norm and the next block's
    activation), and each cut split into its connected parts."""
    inside = set(members)
    segments: list[list[int]] = [[]]
    for index in members:
        start = segments[-1][0] if segments[-1] else index
        if any((source := producer.get(t)) is not None and source not in inside
               and source > start for t in trace[index].reads):
            segments.append([])
        segments[-1].append(index)
    pieces = []
    for segment in segments:
        within = set(segment)
        pieces += _connected(segment, lambda i: [
            s for t in trace[i].reads if (s := producer.get(t)) in within and s < i])
    return pieces


def _connected(calls: Iterable[int], earlier: Callable[[int], Iterable[int]]) -> list[list[int]]:
    """``calls`` grouped by the links ``earlier(call)`` names (calls before it it joins), each
    group in call order."""
    parent: dict[int, int] = {}

    def root(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    for index in calls:
        parent[index] = index
        for source in earlier(index):
            parent[root(index)] = root(source)
    groups: dict[int, list[int]] = {}
    for index in parent:
        groups.setdefault(root(index), []).append(index)
    return [sorted(g) for g in groups.values()]


def _components(trace: Sequence[TraceCall], producer: dict[int, int]) -> list[list[int]]:
    """Fusible calls of one module call joined by data flow, each component in call order."""
    transparent = _transparent_scopes(trace)

    def earlier(index: int) -> list[int]:
        call = trace[index]
        return [source for tensor in call.reads
                if (source := producer.get(tensor)) is not None and source < index
                and trace[source].fusible
                and _same_module_call(trace[source].scope, call.scope, transparent)]

    return _connected((i for i, call in enumerate(trace) if call.fusible), earlier)


def _transparent_scopes(trace: Sequence[TraceCall]) -> set[str]:
    """Module calls made of fusible calls alone (an activation module such as ``act_fn``):
    their calls belong to the module call around them too, so that a gated activation whose
    ``silu`` runs in a child module is one chain with the ``mul`` after it."""
    fusible: dict[str, bool] = {}
    for call in trace:
        fusible[call.scope] = fusible.get(call.scope, True) and call.fusible
    return {scope for scope, alone in fusible.items() if alone and scope}


def _module_path(scope: str) -> str:
    return scope.split("#")[0]


def _direct_child(path: str, around: str) -> bool:
    """Whether module ``path`` is a child of module ``around`` ("" is the model itself)."""
    if around:
        if not path.startswith(around + "."):
            return False
        path = path[len(around) + 1:]
    return bool(path) and "." not in path


def _same_module_call(source: str, consumer: str, transparent: set[str]) -> bool:
    """Whether a call in scope ``consumer`` may join the region of the call in scope ``source``
    whose result it reads: the same module call, or a transparent child module call whose result
    the module call around it reads (an activation's output, not a child's input: a norm module
    fed by its parent's residual add stays a region of its own, the add's result being needed
    later)."""
    return source == consumer or (
        source in transparent and _direct_child(_module_path(source), _module_path(consumer)))


def _region(trace: Sequence[TraceCall], members: list[int], producer: dict[int, int],
            readers: dict[int, list[int]]) -> RegionInstance | None:
    inside = set(members)
    work = sum(not trace[i].view for i in members)
    if work < MIN_OPS or len(members) > MAX_OPS:
        return None
    outputs: list[int] = []
    for i in members:
        for tensor in trace[i].writes:
            users = readers.get(tensor, [])
            outside = [u for u in users if u not in inside]
            if outside or not users:
                if any(u in inside for u in users):
                    return None  # an intermediate used later: the chain cannot be one kernel
                outputs.append(tensor)
    if not outputs or len(outputs) > MAX_OUTPUTS:
        return None
    if _depends_on_itself(trace, members, inside, producer):
        return None
    inputs: list[int] = []
    input_reads: list[tuple[int, int]] = []
    names: dict[int, str] = {}
    nodes = []
    for position, i in enumerate(members):
        call = trace[i]
        refs = []
        for leaf, tensor in enumerate(call.reads):
            if tensor not in names:
                source = producer.get(tensor)
                if source is None or source not in inside or source >= i:
                    names[tensor] = f"x{len(inputs)}"
                    inputs.append(tensor)
                    input_reads.append((i, leaf))
            refs.append(names[tensor])
        leaves = iter(refs)
        args = _with_refs(call.args, leaves)
        kwargs = {k: _with_refs(v, leaves) for k, v in call.kwargs.items()}
        nodes.append({"op": call.op, "args": args, "kwargs": kwargs})
        single = len(call.writes) == 1
        for j, tensor in enumerate(call.writes):
            names.setdefault(tensor, node_name(position) if single
                             else f"{node_name(position)}.{j}")
    if len(inputs) > MAX_INPUTS:
        return None
    specs = [_spec_of(trace, read) for read in input_reads]
    region = Region(tuple(nodes), tuple(specs), tuple(names[t] for t in outputs))
    outermost = min((trace[i].scope for i in members),
                    key=lambda scope: len(_module_path(scope).split(".")) if
                    _module_path(scope) else 0)
    return RegionInstance(region, tuple(members), tuple(input_reads), outermost,
                          tuple(trace[i].key for i in members), tuple(inputs), tuple(outputs))


def _depends_on_itself(trace: Sequence[TraceCall], members: list[int], inside: set[int],
                       producer: dict[int, int]) -> bool:
    """Whether a call outside the chain both reads the chain's results and feeds it (a matmul in
    the middle): no single kernel can run such a chain."""
    tainted_tensors: set[int] = set()
    tainted_calls: set[int] = set()
    for index in range(members[0], members[-1] + 1):
        call = trace[index]
        if index in inside:
            if any(producer.get(t) in tainted_calls for t in call.reads):
                return True
            tainted_tensors.update(call.writes)
        elif any(t in tainted_tensors for t in call.reads):
            tainted_calls.add(index)
            tainted_tensors.update(call.writes)
    return False


def _with_refs(spec: Any, refs: Iterable[str]) -> Any:
    """``spec`` with its tensor leaves replaced, in walk order, by the next references."""
    refs = iter(refs)

    def one(value: Any) -> Any:
        if is_tensor_spec(value):
            return {"t": "ref", "v": next(refs)}
        items = list_items(value)
        if items is not None:
            return {"t": "list", "items": [one(i) for i in items]}
        if isinstance(value, list):
            return [one(i) for i in value]
        return value

    return one(spec)


def _spec_of(trace: Sequence[TraceCall], read: tuple[int, int]) -> dict:
    call_index, leaf = read
    call = trace[call_index]
    return tensor_specs([call.args, list(call.kwargs.values())])[leaf]


def folded(rows: Sequence[T], card_of: Callable[[T], Any]) -> list[tuple[T, T | None]]:
    """Rows of cards in their order, each region card's row followed by the rows of the op
    cards of its calls, paired with that region's row (None for a row that stands on its own).
    An op card inside a region does not stand on its own, and one that several regions call
    (a cast that starts every norm) is listed under each; ``card_of`` gives a row's
    ``OpCard``."""
    by_key = {card_of(row).key: row for row in rows}

    def members(row: T) -> list[T]:
        region = card_of(row).region
        keys = region.get("members", ()) if region is not None else ()
        return [by_key[key] for key in keys if key in by_key]

    inside = {id(member) for row in rows for member in members(row)}
    ordered: list[tuple[T, T | None]] = []
    for row in rows:
        if id(row) not in inside:
            ordered += [(row, None), *((member, row) for member in members(row))]
    return ordered
