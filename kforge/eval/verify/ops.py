"""What the evaluator needs to know about an aten operator: whether it may run a card's call at
all (``admit``), which arguments it writes, and how much work one call does (bytes moved, FLOPs)
for the physical floor."""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cache
from typing import TYPE_CHECKING, Any

import torch

from kforge.core.argspec import ArgSpecError, checked_op, resolve_op, storage_span
from kforge.core.meta import SizeUnknown, meta_call
from kforge.core.opcard import OpCard
from kforge.errors import KforgeError
from kforge.eval.verify.inputs import Geometry, all_tensor_specs
from kforge.runtime.regions import region_function, register_cards

if TYPE_CHECKING:
    from kforge.runtime.device import Runtime


def admit(card: OpCard, runtime: Runtime) -> None:
    """Raise KforgeError, saying why, unless the evaluator may run ``card``'s call on
    ``runtime``'s device: its operator is one kforge calls (a region card's is defined here, its
    nodes checked first), and one call, run first on meta tensors (``kforge.core.meta``), makes
    tensors only on the device it runs on and needs no more memory than that device has free:
    its inputs and every tensor it makes, a region's intermediate results included. Called
    before anything of the card is made or run. A call meta tensors cannot size (``SizeUnknown``:
    results whose sizes depend on its inputs' values, as nonzero's or a boolean mask's, or a step
    with no meta kernel) is held to its inputs' size alone; what it makes is made on the device."""
    try:
        register_cards([card])
        func = region_function(card.region) if card.region is not None else checked_op(card.op)
        made = meta_call(card.op, card.args, card.kwargs, func).made_bytes
    except SizeUnknown:
        made = 0
    except ArgSpecError as exc:
        raise KforgeError(f"kforge will not run {card.op}: {exc}") from None
    inputs = sum(Geometry.from_spec(spec).nbytes for spec in all_tensor_specs(card))
    free = runtime.free_bytes()
    if inputs + made > free:
        raise KforgeError(f"one call of {card.op} needs {_size(inputs + made)} "
                          f"({_size(inputs)} of inputs, {_size(made)} made), more than the "
                          f"{runtime.device.type} has free ({_size(free)})")


def _size(nbytes: int) -> str:
    return f"{nbytes / 2**20:.1f} MiB" if nbytes < 2**30 else f"{nbytes / 2**30:,.1f} GiB"


@dataclass(frozen=True)
class Mutated:
    """An argument the op writes in place (``Tensor(a!)`` in its schema): by position, or by
    keyword for keyword-only arguments such as ``out``."""

    position: int | None
    name: str


@cache
def mutated_args(name: str) -> tuple[Mutated, ...]:
    """The arguments ``name`` writes, from its schema (``aten.add_.Tensor`` writes ``self``)."""
    schema = resolve_op(name)._schema
    found = []
    for index, arg in enumerate(schema.arguments):
        if arg.alias_info is not None and arg.alias_info.is_write:
            found.append(Mutated(None if arg.kwarg_only else index, arg.name))
    return tuple(found)


def mutated_values(name: str, args: list | tuple, kwargs: dict) -> list[Any]:
    """The values passed for the arguments ``name`` writes (None where not passed)."""
    values = []
    for m in mutated_args(name):
        if m.position is not None and m.position < len(args):
            values.append(args[m.position])
        else:
            values.append(kwargs.get(m.name))
    return values


def flatten_tensors(value: Any) -> list[torch.Tensor]:
    """Every tensor in a (nested) value, in order."""
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [t for item in value for t in flatten_tensors(item)]
    if isinstance(value, dict):
        return [t for item in value.values() for t in flatten_tensors(item)]
    return []


def unique_bytes(t: torch.Tensor) -> int:
    """Bytes a kernel must touch at least once to read or write every element of ``t``:
    a broadcast (stride 0) tensor counts its storage, not its logical size."""
    return min(t.numel(), storage_span(t.shape, t.stride())) * t.element_size()


def traffic_bytes(tensors: list[torch.Tensor]) -> int:
    return sum(unique_bytes(t) for t in tensors)


def flop_count(name: str, args: list | tuple, outputs: list[torch.Tensor]) -> int | None:
    """FLOPs of one call for ops where a FLOP rate means something (matmuls, convolutions)."""
    short = name.split(".")[1] if name.count(".") == 2 else name
    tensors = [a for a in args if isinstance(a, torch.Tensor)]
    if not outputs:
        return None
    out = outputs[0]
    if short in ("mm", "bmm", "addmm", "baddbmm") and len(tensors) >= 2:
        a = tensors[-2]
        return 2 * out.numel() * a.shape[-1]
    if short in ("convolution", "_convolution", "cudnn_convolution") and len(tensors) >= 2:
        weight = tensors[1]
        return 2 * out.numel() * math.prod(weight.shape[1:])
    return None


# Headroom over the measured copy rate that a kernel may reach when it only reads (a copy both
# reads and writes; HBM reads alone run a little faster).
READ_ONLY_HEADROOM = 1.25


def memory_floor_us(read_bytes: int, write_bytes: int, bandwidth_gbs: float | None) -> float | None:
    """The memory roofline: every byte read and written once at the measured copy rate
    (which counts read + write bytes)."""
    if not bandwidth_gbs:
        return None
    return (read_bytes + write_bytes) / (bandwidth_gbs * 1e3)


def hard_floor_us(read_bytes: int, write_bytes: int, bandwidth_gbs: float | None,
                  l2_bytes: int, peak_gbs: float | None = None) -> float | None:
    """A time no correct kernel can beat after an L2 flush: inputs must come from DRAM, and only
    the output bytes beyond what L2 can hold must reach it, at a rate a little above the copy
    rate, or at the memory's theoretical peak (``peak_gbs``) where that is higher: a copy rate
    measured while other work shared the GPU is low, and a floor built on it alone would call an
    honest kernel near the roofline a cheat."""
    if not bandwidth_gbs and not peak_gbs:
        return None
    rate = max((bandwidth_gbs or 0.0) * READ_ONLY_HEADROOM, peak_gbs or 0.0) * 1e3  # bytes/us
    return (read_bytes + max(0, write_bytes - l2_bytes)) / rate


def beats_floor(candidate_us: float, eager_us: float, floor_us: float | None) -> bool:
    """True when a candidate is faster than physics allows. The floor only counts where eager
    respects it: an op that reads a fraction of its inputs (an embedding lookup) has no floor."""
    return bool(floor_us) and eager_us >= floor_us and candidate_us < floor_us
