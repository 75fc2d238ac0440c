"""What a model builder of the zoo receives (the options with every default resolved) and
returns (the model and its inputs), and the context it builds parameters in."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Resolved:
    """Options with every default filled in, as a builder receives them."""

    dtype: torch.dtype
    device: torch.device
    batch: int | None
    seq_len: int | None
    mode: str | None
    layers: int | None


@dataclass
class Built:
    """What a builder returns: the model, its inputs, and an optional untimed per-step reset."""

    model: torch.nn.Module
    args: tuple
    kwargs: dict
    reset: Callable[[], None] | None = None


@contextmanager
def building_on(device: torch.device, dtype: torch.dtype) -> Iterator[None]:
    """Create parameters directly on ``device`` in ``dtype`` (no CPU copy of a large model)."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            yield
    finally:
        torch.set_default_dtype(previous)
