"""Fusion regions found again in a compiled model: every chain of aten calls in a graph that has
a region's structure (the same ops, arguments and data flow, its intermediate results used
nowhere else) becomes one call of the region's operator, so that kforge's compile backend can
put the region's kernel there.

The graph is the model's forward as the dispatcher sees it (``aten_graph``: Dynamo's graph traced
with ``make_fx`` on fake tensors of the example inputs' static shapes), the level at which capture
recorded the region, so the same ops appear with the same arguments. Matching is structural only;
whether a kernel serves the call's exact variant is decided afterwards, where the region's
operator is decomposed (a call no kernel serves goes back to the region's own aten calls, which
Inductor fuses as it would have).
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import fx

from kforge.core.argspec import (
    ArgSpecError,
    bind,
    encode_value,
    freeze,
    resolve_op,
    walk,
)
from kforge.core.region import Region, is_ref


def aten_graph(gm: fx.GraphModule, example_inputs: Sequence[Any]) -> fx.GraphModule:
    """``gm`` as a graph of aten calls, traced on fake tensors with the example inputs' static
    shapes (outside Dynamo's own tracing context)."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.proxy_tensor import make_fx

    mode = FakeTensorMode(allow_non_fake_inputs=True)
    fakes = [mode.from_tensor(t, static_shapes=True) if isinstance(t, torch.Tensor) else t
             for t in example_inputs]
    with torch._guards.tracing(None), mode:
        return make_fx(gm, tracing_mode="real")(*fakes)


@dataclass(frozen=True)
class Match:
    """One occurrence of a region in a graph: the graph values bound to its inputs and outputs,
    and every graph node it is made of (tuple items included)."""

    inputs: tuple[fx.Node, ...]
    outputs: tuple[fx.Node, ...]
    nodes: tuple[fx.Node, ...]


def _bound(node: fx.Node, op: str) -> dict[str, Any]:
    """A graph node's call in the form matching compares: its arguments bound to the schema, as
    arg specs in which graph nodes stand as ``("node", node)``."""
    return bind(op, [_spec(a) for a in node.args], {k: _spec(v) for k, v in node.kwargs.items()})


def _spec(value: Any) -> Any:
    if isinstance(value, fx.Node):
        return ("node", value)
    if isinstance(value, (list, tuple)):
        return {"t": "list", "items": [_spec(item) for item in value]}
    return encode_value(value)


def _is_node(value: Any) -> bool:
    return type(value) is tuple and len(value) == 2 and value[0] == "node"


def find_matches(graph: fx.Graph, region: Region,
                 variants: Sequence[Sequence[dict]] | None = None) -> list[Match]:
    """Every non-overlapping occurrence of ``region`` in ``graph``, in graph order; with
    ``variants`` (lists of input arg specs), only those whose inputs are one of them, as the
    graph's fake tensors say (a chain whose structure repeats, as the rotary embedding of q and
    k does, then binds each input where that variant has it)."""
    ops = [node["op"] for node in region.nodes]
    try:
        region.check()
        targets = [resolve_op(op) for op in ops]
        wanted = [bind(op, node["args"], node["kwargs"]) for op, node in zip(ops, region.nodes)]
    except ArgSpecError:
        return []
    taken: set[fx.Node] = set()
    found = []
    for anchor in graph.nodes:  # the region's last node: one of its results
        if anchor.op != "call_function" or anchor.target != targets[-1] or anchor in taken:
            continue
        match = _Matcher(region, ops, targets, wanted, taken, variants).run(anchor)
        if match is not None:
            found.append(match)
            taken.update(match.nodes)
    return found


class _Matcher:
    """A depth-first search binding the region's nodes to graph nodes. It starts from the
    region's last node (always one of its results) and binds what each bound node reads from
    the arguments of its graph node, with no choice to make; a node that no bound node reads (the
    chain of another result) is tried at each user, of its op, of a value bound already."""

    def __init__(self, region: Region, ops: list[str], targets: list[Any], wanted: list[dict],
                 taken: set[fx.Node], variants: Sequence[Sequence[dict]] | None = None) -> None:
        self.variants = None if variants is None else {
            tuple(freeze(spec) for spec in variant) for variant in variants}
        self.allowed = None if self.variants is None else [
            {variant[i] for variant in self.variants} for i in range(len(region.inputs))]
        self.region = region
        self.ops = ops
        self.targets = targets
        self.wanted = wanted
        self.taken = taken
        self.reads = [_refs(node) for node in region.nodes]
        self.refs: dict[str, fx.Node] = {}
        self.trail: list[str] = []  # the refs in the order bound, to undo a failed branch

    def run(self, anchor: fx.Node) -> Match | None:
        if self._bind(len(self.ops) - 1, anchor) and self._complete():
            return self._match()
        return None

    def _set(self, ref: str, node: fx.Node) -> None:
        self.refs[ref] = node
        self.trail.append(ref)

    def _undo(self, mark: int) -> None:
        while len(self.trail) > mark:
            del self.refs[self.trail.pop()]

    def _bind(self, index: int, node: fx.Node) -> bool:
        """Bind region node ``index`` to ``node``, and the nodes it reads to the graph nodes
        that ``node`` reads; undone on failure."""
        name = f"n{index}"
        if name in self.refs:
            return self.refs[name] is node
        if (node.op != "call_function" or node.target != self.targets[index]
                or node in self.taken or node in self.refs.values()):
            return False
        try:
            call = _bound(node, self.ops[index])
        except ArgSpecError:
            return False
        mark = len(self.trail)
        self._set(name, node)
        producers: list[tuple[int, fx.Node]] = []
        if self._same(self.wanted[index], call, producers) and all(
                self._bind(j, producer) for j, producer in producers):
            return True
        self._undo(mark)
        return False

    def _same(self, want: Any, got: Any, producers: list[tuple[int, fx.Node]]) -> bool:
        if is_ref(want):
            if not _is_node(got):
                return False
            ref, value = want["v"], got[1]
            if ref.startswith("x"):
                if ref in self.refs:
                    return self.refs[ref] is value
                if self.allowed is not None and _spec_of(value) not in self.allowed[int(ref[1:])]:
                    return False
                self._set(ref, value)
                return True
            base, _, item = ref.partition(".")
            if item:  # one item of a node's tuple: read through its getitem
                if value.target is not operator.getitem or value.args[1] != int(item):
                    return False
                value = value.args[0]
            producers.append((int(base[1:]), value))
            return True
        if _is_node(got):
            return False
        if isinstance(want, dict) and isinstance(got, dict):
            if want.keys() != got.keys():
                return False
            return all(self._same(want[k], got[k], producers) for k in want)
        if isinstance(want, (list, tuple)) and isinstance(got, (list, tuple)):
            return len(want) == len(got) and all(
                self._same(w, g, producers) for w, g in zip(want, got))
        return freeze(want) == freeze(got)

    def _complete(self) -> bool:
        """Bind the nodes still unbound (none reads them: other results' chains), trying each
        at the users of what it reads."""
        unbound = [i for i in range(len(self.ops)) if f"n{i}" not in self.refs]
        if not unbound:
            return True
        reached = [i for i in unbound if any(self._value(r) is not None for r in self.reads[i])]
        if not reached:
            return False
        index = reached[0]
        for candidate in self._candidates(index):
            mark = len(self.trail)
            if self._bind(index, candidate) and self._complete():
                return True
            self._undo(mark)
        return False

    def _value(self, ref: str) -> fx.Node | None:
        """The graph node bound to a reference: an input, a node, or one item of a node's
        tuple (its ``getitem`` user)."""
        base, _, item = ref.partition(".")
        node = self.refs.get(base)
        if node is None or not item:
            return node
        return next((u for u in node.users if u.target is operator.getitem
                     and u.args[1] == int(item)), None)

    def _candidates(self, index: int) -> list[fx.Node]:
        """Graph nodes that may be region node ``index``: users, of its op, of what it reads
        that is bound already."""
        target = self.targets[index]
        found: dict[fx.Node, None] = {}
        for ref in self.reads[index]:
            value = self._value(ref)
            if value is not None:
                found.update((u, None) for u in value.users
                             if u.op == "call_function" and u.target == target)
        return list(found)

    def _match(self) -> Match | None:
        region = self.region
        if any(f"x{i}" not in self.refs for i in range(len(region.inputs))):
            return None
        if self.variants is not None and tuple(
                _spec_of(self.refs[f"x{i}"]) for i in range(len(region.inputs))) \
                not in self.variants:
            return None
        outputs = [self._value(ref) for ref in region.outputs]
        if any(o is None for o in outputs):
            return None
        nodes = [self.refs[f"n{i}"] for i in range(len(region.nodes))]
        inside = set(nodes) | {u for n in nodes for u in n.users if u.target is operator.getitem}
        if any(u not in inside for node in inside - set(outputs) for u in node.users):
            return None  # an intermediate result is used outside the chain
        return Match(tuple(self.refs[f"x{i}"] for i in range(len(region.inputs))),
                     tuple(outputs), tuple(inside))  # type: ignore[arg-type]


def _spec_of(node: fx.Node) -> Any:
    """The arg spec of the value a graph node computes (its fake tensor), frozen; None where the
    trace recorded none."""
    value = node.meta.get("val")
    return freeze(encode_value(value)) if isinstance(value, torch.Tensor) else None


def _refs(node: dict) -> list[str]:
    """The references a region node reads, in argument order."""
    return [leaf["v"] for _, leaf in walk([node["args"], list(node["kwargs"].values())])
            if is_ref(leaf)]


def replace(gm: fx.GraphModule, region: Region, op: Any,
            variants: Sequence[Sequence[dict]] | None = None) -> int:
    """Call ``op`` (the region's operator) for every occurrence of ``region`` in ``gm`` (of one of
    ``variants``, where given); the number replaced. An occurrence whose results are needed
    before its last call (so that one call cannot stand where the chain stood) is left as it
    is."""
    graph = gm.graph
    order = {node: i for i, node in enumerate(graph.nodes)}
    replaced = 0
    for match in find_matches(graph, region, variants):
        last = max(match.nodes, key=order.__getitem__)
        if any(order[u] < order[last] for out in match.outputs for u in out.users
               if u not in match.nodes):
            continue
        with graph.inserting_after(last):
            call = graph.call_function(op, match.inputs)
        if len(match.outputs) == 1:
            results = [call]
        else:
            with graph.inserting_after(call):
                results = [graph.call_function(operator.getitem, (call, i))
                           for i in range(len(match.outputs))]
        for out, result in zip(match.outputs, results):
            out.replace_all_uses_with(result, delete_user_cb=lambda u: u not in match.nodes)
        for node in sorted(match.nodes, key=order.__getitem__, reverse=True):
            graph.erase_node(node)
        replaced += 1
    if replaced:
        graph.lint()
        gm.recompile()
    return replaced
