"""Fusion regions as PyTorch operators: each region (``kforge.core.region``) is defined with
``torch.library`` as ``kforge_region::r_<hash>``, whose implementation runs the region's aten calls
one by one. Registered, a region card is an op card to the rest of kforge: the evaluator calls
the operator as eager's reference, launch plans bind its inputs by name (``x0``, ``x1``, ...), and
the guard puts a kernel in front of it at the CUDA dispatch key like any op's.

The implementation interprets the region's nodes, data that kforge recorded from the model (or a
database says it did): ``Region.check`` proves them calls of allowed operators on tensors before
any is made; no candidate text is involved. Each node runs where the region's inputs are, whatever
device it names, and through an operator that checks the view it makes (``checked_op``).
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from typing import Any

import torch
from torch.multiprocessing.reductions import StorageWeakRef

from kforge.core.argspec import checked_op, decode, placed, resolve_op
from kforge.core.region import NAMESPACE, Region

_library: torch.library.Library | None = None
_defined: dict[str, Region] = {}  # operator name -> its region, as registered here
_lock = threading.Lock()


def register(region: Region | dict) -> Any:
    """The region's operator (an OpOverload), defined on first use in this process."""
    if isinstance(region, dict):
        region = Region.from_dict(region)
    global _library
    with _lock:
        if region.name not in _defined:
            run = _interpreter(region)  # checks the region first
            if _library is None:
                _library = torch.library.Library(NAMESPACE, "FRAGMENT")
            _library.define(region.schema())
            _library.impl(region.name, run, "CompositeExplicitAutograd")
            _defined[region.name] = region
    return resolve_op(region.op)


def registered(op: str) -> Region | None:
    """The region of operator ``op`` (``kforge_region.r_<hash>.default``) if this process has
    registered it; None for any other op."""
    namespace, _, rest = op.partition(".")
    return _defined.get(rest.partition(".")[0]) if namespace == NAMESPACE else None


def region_function(region: Region | dict) -> Any:
    """The region as a plain function of its inputs, calling its aten ops one by one (what
    torch.compile should see to fuse them)."""
    return _interpreter(Region.from_dict(region) if isinstance(region, dict) else region)


def register_cards(cards: Iterable[Any]) -> None:
    """Define the operator of every region card among ``cards`` (op cards pass); an
    ``ArgSpecError`` for a region that fails ``Region.check``."""
    for card in cards:
        if getattr(card, "region", None) is not None:
            register(card.region)


def _interpreter(region: Region) -> Any:
    region.check()
    nodes = [(checked_op(node["op"]), node["args"], node["kwargs"]) for node in region.nodes]
    outputs = region.outputs

    def run(*inputs: torch.Tensor) -> Any:
        values: dict[str, Any] = {f"x{i}": t for i, t in enumerate(inputs)}
        # Every device a node names is the region's own. (A node reads tensors, so one that
        # names none makes its result beside them: no node is a factory.)
        named = placed(_device_of(inputs))

        def value(spec: Any) -> Any:
            return decode(spec, _no_tensor_spec, make_list=list,
                          make_named=lambda kind, v: values[v] if kind == "ref" else named(kind, v))

        for index, (func, args, kwargs) in enumerate(nodes):
            result = func(*[value(a) for a in args], **{k: value(v) for k, v in kwargs.items()})
            if isinstance(result, (tuple, list)):
                for j, item in enumerate(result):
                    values[f"n{index}.{j}"] = item
            else:
                values[f"n{index}"] = result
        found = [_fresh(values[ref], inputs) for ref in outputs]
        return found[0] if len(found) == 1 else tuple(found)

    return run


def _device_of(inputs: tuple[torch.Tensor, ...]) -> torch.device:
    """Where a region runs: on the device of its inputs, the first not on the CPU where there is
    one (aten lets a 0-d CPU tensor join a call on a GPU, so a CPU input may be a scalar)."""
    return next((t.device for t in inputs if t.device.type != "cpu"), inputs[0].device)


def _no_tensor_spec(spec: dict) -> Any:
    raise ValueError(f"a region node holds a tensor spec instead of a reference: {spec}")


def _fresh(value: torch.Tensor, inputs: tuple[torch.Tensor, ...]) -> torch.Tensor:
    """An operator's result may not share memory with its inputs: such a result is copied."""
    storage = StorageWeakRef(value.untyped_storage())  # also while traced on fake tensors
    if any(StorageWeakRef(t.untyped_storage()) == storage for t in inputs):
        return value.clone()
    return value
