"""Save the real inputs of sampled op calls, within a byte budget, for the evaluator to replay.

File format (a contract with ``kforge.eval.verify.inputs``): ``<samples_dir>/<card key>/<n>.pt``
holds ``torch.save({"args": [...], "kwargs": {...}})``, the call's arguments as the model passed
them. Each tensor is a CPU tensor with the original shape, strides and storage offset (its storage
holds the original storage's first ``offset + span`` elements). A tensor that did not fit the budget
is left as its arg spec (a ``{"t": "tensor", ...}`` dict): the evaluator fills it with random
values. Lists and tuples become lists; dtypes, devices, layouts and scalars are kept as they are;
memory formats, which torch cannot pickle, are stored as their arg spec. Read a file with
``torch.load(path, weights_only=True)``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from kforge.core.argspec import encode_value, storage_span
from kforge.core.files import create_new

MIB = 1 << 20
# Defaults for one profile: enough for a few real activations and masks per card, while a weight
# matrix of a large model (tens of MiB and up) is usually left for random refill.
CARD_BYTES = 64 * MIB
SESSION_BYTES = 1024 * MIB


def storage_bytes_needed(t: torch.Tensor) -> int:
    """Bytes of storage a copy must keep so that ``t``'s offset and strides still address it."""
    if t.numel() == 0:
        return 0
    return (t.storage_offset() + storage_span(t.shape, t.stride())) * t.element_size()


def cpu_copy_keeping_layout(t: torch.Tensor) -> torch.Tensor:
    """A CPU tensor equal to ``t`` with the same shape, strides and storage offset."""
    if t.numel() == 0:
        return torch.empty_strided(tuple(t.shape), tuple(t.stride()), dtype=t.dtype, device="cpu")
    elements = storage_bytes_needed(t) // t.element_size()
    flat = t.new_empty(0).set_(t.untyped_storage(), 0, (elements,), (1,))
    flat_cpu = flat.to("cpu", copy=True)
    return torch.empty(0, dtype=t.dtype).set_(flat_cpu.untyped_storage(), t.storage_offset(),
                                              tuple(t.shape), tuple(t.stride()))


@dataclass
class SampleBudget:
    """Byte caps for one profile: per card (all its samples together) and for the whole session."""

    card_bytes: int = CARD_BYTES
    session_bytes: int = SESSION_BYTES
    used: int = 0
    used_by_card: dict[str, int] = field(default_factory=dict)
    tensors_left_out: int = 0

    def take(self, key: str, nbytes: int) -> bool:
        """Reserve ``nbytes`` for card ``key``; False (and nothing reserved) when over a cap."""
        card_used = self.used_by_card.get(key, 0)
        if card_used + nbytes > self.card_bytes or self.used + nbytes > self.session_bytes:
            self.tensors_left_out += 1
            return False
        self.used_by_card[key] = card_used + nbytes
        self.used += nbytes
        return True


def snapshot_value(value: Any, key: str, budget: SampleBudget) -> Any:
    """``value`` with every tensor copied to the CPU, or replaced by its spec when over budget
    or when it is no plain strided tensor (sparse, nested, quantized: no kernel takes those)."""
    if isinstance(value, torch.Tensor):
        spec = encode_value(value)
        if ("stride" in spec and not value.is_quantized
                and budget.take(key, storage_bytes_needed(value))):
            return cpu_copy_keeping_layout(value)
        return spec
    if isinstance(value, (list, tuple)):
        return [snapshot_value(item, key, budget) for item in value]
    if isinstance(value, torch.memory_format):
        return encode_value(value)
    return value


def save_sample(path: Path, key: str, args: tuple | list, kwargs: dict,
                budget: SampleBudget) -> None:
    """Write one call's inputs to ``path``, a new file (its folder is created)."""
    sample = {"args": [snapshot_value(a, key, budget) for a in args],
              "kwargs": {k: snapshot_value(v, key, budget) for k, v in kwargs.items()}}
    path.parent.mkdir(parents=True, exist_ok=True)
    with create_new(path, "sample file") as out:
        torch.save(sample, out)


def spread(calls: int, count: int) -> set[int]:
    """``count`` call indices spread evenly over ``calls`` calls (first and last included)."""
    if calls <= 0 or count <= 0:
        return set()
    if count >= calls:
        return set(range(calls))
    if count == 1:
        return {0}
    step = (calls - 1) / (count - 1)
    return {math.floor(i * step + 0.5) for i in range(count)}
