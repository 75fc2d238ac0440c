"""Find a model's fusion regions: record one forward's calls with the tensors each reads and
writes, hand the trace to ``kforge.core.region.find_regions``, and make each distinct region
variant a region card, its time the sum of its ops' per-call times."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.weak import WeakIdKeyDictionary

from kforge.capture.classify import is_fusible, is_region_view
from kforge.capture.recorder import SKIPPED_NAMESPACES, ModuleTracker
from kforge.capture.samples import spread
from kforge.core.argspec import encode_call, walk
from kforge.core.opcard import NATIVE, OpCard, variant_key
from kforge.core.region import RegionInstance, TraceCall, find_regions


class TraceRecorder(TorchDispatchMode):
    """Records every call as a ``TraceCall``; tensors are told apart by identity (a view is a
    tensor of its own). Bookkeeping calls are recorded too, unfusible, so that call indices are
    the same as a ``SampleRecorder``'s on the same forward."""

    def __init__(self, tracker: ModuleTracker) -> None:
        super().__init__()
        self.tracker = tracker
        self.trace: list[TraceCall] = []
        self._ids: WeakIdKeyDictionary = WeakIdKeyDictionary()
        self._next_id = 0  # never reused: a tensor freed and another at its address differ
        self._facts: dict[Any, tuple[str, bool, bool, bool, bool]] = {}

    def _id(self, tensor: torch.Tensor) -> int:
        found = self._ids.get(tensor)
        if found is None:
            found = self._ids[tensor] = self._next_id
            self._next_id += 1
        return found

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (),
                           kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        facts = self._facts.get(func)
        if facts is None:
            schema = func._schema
            facts = self._facts[func] = (
                str(func), torch.Tag.pointwise in func.tags, func.is_view, schema.is_mutable,
                any("Tensor" in str(r.type) for r in schema.returns))
        op, pointwise, aliases, mutates, returns_tensor = facts
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
        fusible = is_fusible(op, pointwise=pointwise, aliases_input=aliases, mutates=mutates,
                             returns_tensor=returns_tensor, reads_tensors=bool(reads))
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


def region_cards(trace: list[TraceCall], op_cards: Iterable[OpCard],
                 total_us: float) -> RegionPlan:
    """One region card per distinct region variant of ``trace``: calls per forward, and time per
    forward summed from its ops' cards (their per-call times)."""
    per_call = {c.key: c.total_us / max(c.calls, 1) for c in op_cards}
    instances: dict[str, list[RegionInstance]] = {}
    regions: dict[str, Any] = {}
    for instance in find_regions(trace):
        region = instance.region
        key = variant_key(region.op, list(region.inputs), {})
        instances.setdefault(key, []).append(instance)
        regions[key] = region
    cards, modules = [], {}
    for key, found in instances.items():
        region = regions[key]
        time_us = sum(per_call.get(k, 0.0) for i in found for k in i.member_keys)
        calls = len(found)
        cards.append(OpCard(op=region.op, args=list(region.inputs), kwargs={}, calls=calls,
                            total_us=time_us, share=time_us / total_us if total_us else 0.0,
                            library=NATIVE, target=True, eager_us=time_us / calls, key=key,
                            region=region.to_dict()))
        modules[key] = list(dict.fromkeys(i.scope.split("#")[0] for i in found))
    return RegionPlan(cards, instances, modules)


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
