"""Op cards: one operator variant a model runs (op + shapes + dtypes + strides + scalar args).

Plain data and pure functions only. Arguments are JSON-able *arg specs* (the format of
``kforge.core.argspec``).

Two calls belong to the same card exactly when their op and arg specs are equal, so the card key
is a hash of the canonical JSON of both. The same key guards integration at dispatch time.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from kforge.core.argspec import tensor_specs
from kforge.core.describe import describe_args, describe_range_args
from kforge.core.laws import Ranges
from kforge.core.schema import Record

# Where eager time goes for an op. Native kernels are PyTorch's own and the best targets;
# vendor-library ops (cuBLAS, cuDNN, flash attention) rarely lose to a generated kernel.
NATIVE = "native"
VENDOR_LIBRARIES = ("cublas", "cudnn", "flash", "cutlass", "nccl")
# Ops that move no data or only copy it: listed in a profile, never offered as targets.
VIEW_OR_COPY = "view"

DTYPE_BYTES = {
    "float64": 8, "float32": 4, "float16": 2, "bfloat16": 2, "int64": 8, "int32": 4,
    "int16": 2, "int8": 1, "uint8": 1, "bool": 1, "float8_e4m3fn": 1, "float8_e5m2": 1,
    "complex64": 8, "complex128": 16,
}


# A card key names folders (its captured samples, its exported kernel): letters, digits, - and _
# only (kforge's own keys are hex digits), so that no key read from a database leads elsewhere.
_FOLDER_KEY = re.compile(r"[A-Za-z0-9_-]{1,64}")


def key_folder(root: Path, key: str) -> Path:
    """``root / key``, the folder of card ``key`` under ``root``; a ValueError for a key that
    could name anything but a folder right there (``..``, a path, a NUL byte)."""
    if not isinstance(key, str) or not _FOLDER_KEY.fullmatch(key):
        raise ValueError(f"op card key {str(key)[:80]!r} cannot name a folder (kforge's keys are "
                         "hex digits)")
    return Path(root) / key


def canonical_json(value: Any) -> str:
    """A stable text form of an arg spec: sorted keys, no spaces, floats written exactly."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), allow_nan=True)


def variant_key(op: str, args: list, kwargs: dict, ranges: dict | None = None) -> str:
    """The identity of one op variant; equal keys mean 'the same call up to tensor values'. A
    range card's ranges are part of its identity (a card without ranges keeps its key)."""
    identity = [op, args, kwargs] if ranges is None else [op, args, kwargs, ranges]
    digest = hashlib.sha256(canonical_json(identity).encode()).hexdigest()
    return digest[:20]


def tensor_bytes(spec: dict) -> int:
    """Bytes a tensor spec occupies when each element is read once."""
    numel = math.prod(spec["shape"]) if spec["shape"] else 1
    return numel * DTYPE_BYTES.get(spec["dtype"], 4)


@dataclass(frozen=True)
class OpCard(Record):
    """One operator variant of a profiled model, with where its time goes.

    Times are per call in microseconds; ``total_us`` is the card's GPU time over one model run and
    ``share`` its fraction of the model's total operator time. ``floor_us`` is the physical floor
    (bytes moved at the measured copy bandwidth, or FLOPs at peak rate), when known. It crosses
    to the evaluation worker as the codec (``kforge.core.schema``) writes it.
    """

    op: str
    args: list
    kwargs: dict = field(default_factory=dict)
    calls: int = 1
    total_us: float = 0.0
    share: float = 0.0
    library: str = NATIVE
    target: bool = True
    eager_us: float | None = None
    compiled_us: float | None = None
    floor_us: float | None = None
    id: int | None = None
    key: str = ""
    # A region card's chain of ops (``kforge.core.region.Region.to_dict``): its ``op`` is then the
    # region's operator and its arguments the region's inputs. None for an op card.
    region: dict | None = None
    # A range card's symbols and affine laws (``kforge.core.ranges.Ranges.to_dict``): its
    # arguments are then its variant at the profiled point. None for an exact card.
    ranges: dict | None = None

    def __post_init__(self) -> None:
        if not self.key:
            object.__setattr__(self, "key", variant_key(self.op, self.args, self.kwargs,
                                                        self.ranges))

    @property
    def short_op(self) -> str:
        """``aten._softmax.default`` -> ``_softmax``; a region by its ops,
        ``region(_to_copy,pow,mean,...)``."""
        if self.region is not None:
            ops = [node["op"].split(".")[1] for node in self.region["nodes"]]
            shown = ops if len(ops) <= 4 else [*ops[:3], "...", ops[-1]]
            return f"region({','.join(shown)})"
        parts = self.op.split(".")
        return parts[1] if len(parts) >= 2 and parts[0] == "aten" else self.op

    @property
    def signature(self) -> str:
        """The arguments in short; a range card's varying sizes by their laws, then its range
        (``bf16[1,1,L,256], -2 for L=1..4096``)."""
        if self.ranges is not None:
            return describe_range_args(self.args, self.kwargs, Ranges.from_dict(self.ranges))
        return describe_args(self.args, self.kwargs)

    @property
    def shapes(self) -> str:
        """Its tensors' shapes in order, ``8x1024 8x1024`` (``()`` for a tensor of no
        dimensions)."""
        return " ".join("x".join(str(d) for d in t["shape"]) or "()"
                        for t in tensor_specs(self.args))

    @property
    def label(self) -> str:
        """The op as a list of ops shows it, by its name, range and shapes (``_softmax
        8x1024``): how a message names an op, never by its card's id."""
        return " ".join(part for part in (self.short_op, self.range_text, self.shapes) if part)

    @property
    def range_text(self) -> str:
        """``L=1..4096`` for a range card, "" for an exact one."""
        if self.ranges is None:
            return ""
        return Ranges.from_dict(self.ranges).text()

    @property
    def io_bytes(self) -> int:
        """Bytes of tensor inputs (each read once); outputs are counted by the evaluator."""
        return sum(tensor_bytes(t) for t in tensor_specs([self.args, list(self.kwargs.values())]))

    @property
    def vendor(self) -> bool:
        return self.library in VENDOR_LIBRARIES

    def with_(self, **changes: Any) -> OpCard:
        """A copy with ``changes``; the key follows if the op, its arguments or its ranges
        change."""
        if {"op", "args", "kwargs", "ranges"} & changes.keys():
            changes.setdefault("key", "")
        return replace(self, **changes)


def rank_cards(cards: list[OpCard]) -> list[OpCard]:
    """Targets first, then by time share, largest first; ties by op name for a stable order."""
    return sorted(cards, key=lambda c: (not c.target, -c.share, c.op, c.key))
