"""What the evaluator needs to know about an aten operator: how to call it, which arguments it
writes, and how much work one call does (bytes moved, FLOPs) for the physical floor."""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cache
from typing import Any

import torch

from kforge.core.argspec import resolve_op, storage_span


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
                  l2_bytes: int) -> float | None:
    """A time no correct kernel can beat after an L2 flush: inputs must come from DRAM, and only
    the output bytes beyond what L2 can hold must reach it, at a rate a little above the copy
    rate."""
    if not bandwidth_gbs:
        return None
    rate = bandwidth_gbs * 1e3 * READ_ONLY_HEADROOM  # bytes per microsecond
    return (read_bytes + max(0, write_bytes - l2_bytes)) / rate


def beats_floor(candidate_us: float, eager_us: float, floor_us: float | None) -> bool:
    """True when a candidate is faster than physics allows. The floor only counts where eager
    respects it: an op that reads a fraction of its inputs (an embedding lookup) has no floor."""
    return bool(floor_us) and eager_us >= floor_us and candidate_us < floor_us
