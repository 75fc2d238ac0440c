"""Find a model's fusion regions: record one forward's calls with the tensors each reads and
writes, hand the trace to ``kforge.core.region.find_regions``, and make each distinct region
variant a region card, its time the sum of its ops' per-call times."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch
from torch._ops import HigherOrderOperator
from torch.utils.weak import WeakIdKeyDictionary

from kforge.capture.classify import is_fusible, is_region_view
from kforge.capture.recorder import (
    SKIPPED_NAMESPACES,
    HigherOrderPassThrough,
    ModuleTracker,
    hookable_modules,
)
from kforge.capture.samples import spread
from kforge.core.argspec import encode_call, tensor_specs, walk
from kforge.core.opcard import NATIVE, OpCard, variant_key
from kforge.core.region import RegionInstance, TraceCall, find_regions, operator_facts


@dataclass
class ForwardCall:
    """One call of a module's forward: its path, the module call it ran in, the identities of
    its positional tensor arguments (None for others), its own parameters and buffers by
    identity, and its result's identity when that is one tensor."""

    path: str
    parent: str
    args: tuple[int | None, ...]
    params: dict[int, str]
    output: int | None = None


class TraceRecorder(HigherOrderPassThrough):
    """Records every call as a ``TraceCall``, and every module call (``forwards``, by scope);
    tensors are told apart by identity (a view is a tensor of its own). Bookkeeping calls are
    recorded too, unfusible, so that call indices are the same as a ``SampleRecorder``'s on the
    same forward. Enter it after its tracker."""

    def __init__(self, tracker: ModuleTracker) -> None:
        super().__init__()
        self.tracker = tracker
        self.trace: list[TraceCall] = []
        self.forwards: dict[str, ForwardCall] = {}
        self._ids: WeakIdKeyDictionary = WeakIdKeyDictionary()
        self._next_id = 0  # never reused: a tensor freed and another at its address differ
        self._facts: dict[Any, tuple[str, dict[str, bool]]] = {}
        self._scopes: list[str] = [""]
        self._handles: list[Any] = []

    def __enter__(self) -> TraceRecorder:
        for name, module in hookable_modules(self.tracker.model):
            self._handles.append(module.register_forward_pre_hook(self._entered(name)))
            self._handles.append(module.register_forward_hook(self._left(name),
                                                              always_call=True))
        return super().__enter__()

    def __exit__(self, *exc: object) -> Any:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        return super().__exit__(*exc)

    def _entered(self, name: str) -> Any:
        def hook(module: torch.nn.Module, args: tuple) -> None:
            if not self.tracker.on_its_thread(name):
                return
            scope = self.tracker.scope  # the tracker's own hook ran first
            own = [*module.named_parameters(recurse=False), *module.named_buffers(recurse=False)]
            self.forwards[scope] = ForwardCall(
                name, self._scopes[-1],
                tuple(self._id(a) if isinstance(a, torch.Tensor) else None for a in args),
                {self._id(t): n for n, t in own if isinstance(t, torch.Tensor)})
            self._scopes.append(scope)
        return hook

    def _left(self, name: str) -> Any:
        def hook(module: torch.nn.Module, args: tuple, output: Any) -> None:
            if self.tracker.on_its_thread(name) and len(self._scopes) > 1:
                scope = self._scopes.pop()
                if isinstance(output, torch.Tensor):
                    self.forwards[scope].output = self._id(output)
        return hook

    def _id(self, tensor: torch.Tensor) -> int:
        found = self._ids.get(tensor)
        if found is None:
            found = self._ids[tensor] = self._next_id
            self._next_id += 1
        return found

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (),
                           kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        if isinstance(func, HigherOrderOperator):
            return self.pass_through(func, args, kwargs)
        facts = self._facts.get(func)
        if facts is None:
            facts = self._facts[func] = (str(func), operator_facts(func))
        op, known = facts
        aliases = known["aliases_input"]
        result = func(*args, **kwargs)
        if op.split(".", 1)[0] in SKIPPED_NAMESPACES:
            self.trace.append(TraceCall(op, [], {}, (), (), self.tracker.scope, False))
            return result
        reads = tuple(self._id(v) for _, v in walk([list(args), list(kwargs.values())])
                      if isinstance(v, torch.Tensor))
        writes = tuple(self._id(v) for _, v in walk(result if isinstance(result, (list, tuple))
                                                     else [result])
                       if isinstance(v, torch.Tensor))
        args_spec, kwargs_spec = encode_call(func, args, kwargs)
        # a kernel takes strided tensors only: sparse or nested ones keep their call out
        fusible = (is_fusible(op, reads_tensors=bool(reads), **known)
                   and all("stride" in t for t in tensor_specs([args_spec, kwargs_spec])))
        self.trace.append(TraceCall(op, args_spec, kwargs_spec, reads, writes, self.tracker.scope,
                                    fusible, is_region_view(op, aliases),
                                    variant_key(op, args_spec, kwargs_spec)))
        return result


@dataclass
class RegionPlan:
    """The region cards of one forward and, per card, its instances in the trace (for samples)."""

    cards: list[OpCard]
    instances: dict[str, list[RegionInstance]]  # card key -> instances, in trace order
    modules: dict[str, list[str]]  # card key -> module paths
    # region instances left out: calls whose variants the timed forwards never ran (the model
    # runs other shapes from one forward to the next)
    unmatched: int = 0


def region_cards(trace: list[TraceCall], op_cards: Iterable[OpCard], total_us: float,
                 forwards: dict[str, ForwardCall] | None = None) -> RegionPlan:
    """One region card per distinct region variant of ``trace``: calls per forward, and time per
    forward summed from its ops' cards (their per-call times). Where every instance of a region
    is the whole forward of a module (``forwards``: the module calls), the card's region says
    which modules and how their arguments and parameters feed the region (``forward``). Given
    op cards, an instance with a call none of them holds is left out (``unmatched``)."""
    per_call = {c.key: c.total_us / max(c.calls, 1) for c in op_cards}
    bind = _Binder(trace, forwards or {})
    instances: dict[str, list[RegionInstance]] = {}
    regions: dict[str, Any] = {}
    unmatched = 0
    for instance in find_regions(trace):
        if per_call and any(k not in per_call for k in instance.member_keys):
            unmatched += 1
            continue
        region = instance.region
        key = variant_key(region.op, list(region.inputs), {})
        instances.setdefault(key, []).append(instance)
        regions[key] = region
    cards, modules = [], {}
    for key, found in instances.items():
        region = regions[key]
        time_us = sum(per_call.get(k, 0.0) for i in found for k in i.member_keys)
        calls = len(found)
        described = region.to_dict()
        # the op cards of its calls, which views (kforge show, the TUI) fold under it
        described["members"] = sorted({k for i in found for k in i.member_keys})
        bindings = {bind(i) for i in found}
        if len(bindings) == 1 and None not in bindings:
            described["forward"] = {"paths": sorted({bind.path(i) for i in found}),
                                    "inputs": [list(b) for b in bindings.pop()]}
        cards.append(OpCard(op=region.op, args=list(region.inputs), kwargs={}, calls=calls,
                            total_us=time_us, share=time_us / total_us if total_us else 0.0,
                            library=NATIVE, target=True, eager_us=time_us / calls, key=key,
                            region=described))
        modules[key] = list(dict.fromkeys(i.scope.split("#")[0] for i in found))
    return RegionPlan(cards, instances, modules, unmatched)


class _Binder:
    """Whether a region instance is the whole forward of the module call it ran in, and if so,
    where each of its inputs comes from: ``("arg", i)``, the forward's positional argument i, or
    ``("param", name)``, the module's own parameter or buffer."""

    def __init__(self, trace: list[TraceCall], forwards: dict[str, ForwardCall]) -> None:
        self.forwards = forwards
        self.calls_by_scope: dict[str, list[int]] = {}
        for index, call in enumerate(trace):
            if call.op.split(".", 1)[0] not in SKIPPED_NAMESPACES:
                self.calls_by_scope.setdefault(call.scope, []).append(index)
        self.children: dict[str, list[str]] = {}
        for scope, forward in forwards.items():
            self.children.setdefault(forward.parent, []).append(scope)

    def path(self, instance: RegionInstance) -> str:
        return self.forwards[instance.scope].path

    def _nested(self, scope: str) -> list[str]:
        found, todo = [], [scope]
        while todo:
            current = todo.pop()
            found.append(current)
            todo.extend(self.children.get(current, []))
        return found

    def __call__(self, instance: RegionInstance) -> tuple[tuple[str, Any], ...] | None:
        forward = self.forwards.get(instance.scope)
        if forward is None or len(instance.output_tensors) != 1 \
                or forward.output != instance.output_tensors[0]:
            return None
        members = set(instance.calls)
        for scope in self._nested(instance.scope):
            if any(i not in members for i in self.calls_by_scope.get(scope, [])):
                return None
        sources = []
        for tensor in instance.input_tensors:
            if tensor in forward.args:
                sources.append(("arg", forward.args.index(tensor)))
            elif tensor in forward.params:
                sources.append(("param", forward.params[tensor]))
            else:
                return None
        return tuple(sources)


# (tensor-leaf index, card key, input index, instance number, number of inputs)
RegionRead = tuple[int, str, int, int, int]


def region_reads(plan: RegionPlan, per_card: int) -> dict[int, list[RegionRead]]:
    """Where to take the inputs of up to ``per_card`` instances of each region card, spread over
    its instances: trace index -> the reads at that call."""
    reads: dict[int, list[RegionRead]] = {}
    for key, instances in plan.instances.items():
        for number in sorted(spread(len(instances), per_card)):
            instance = instances[number]
            count = len(instance.input_reads)
            for k, (call, leaf) in enumerate(instance.input_reads):
                reads.setdefault(call, []).append((leaf, key, k, number, count))
    return reads
