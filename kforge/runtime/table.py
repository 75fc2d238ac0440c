"""The table of verified kernels: one entry per exact op variant, or per range card (a range of
variants whose sizes follow affine laws, ``kforge.core.ranges``), looked up on every call of a
patched op, with hit and fallback counts."""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from kforge.core.argspec import (
    encode_call,
    freeze,
    is_tensor_spec,
    resolve_op,
    torch_dtype,
)
from kforge.core.launch_plan import DeviceLimits, PlanError
from kforge.core.laws import RangeError, Ranges
from kforge.core.ranges import MATCH_CACHE_SIZE, RangeMatcher, instantiate
from kforge.runtime.plan import KernelLauncher, PlanRunner, resolve_for

_MISS = object()


# ----- the table of kernels -----


@dataclass(eq=False)
class Entry:
    """One kernel for one exact op variant (``args``/``kwargs`` are its arg specs) on one
    device. ``run(args, kwargs)`` (a ``PlanRunner``) returns what the op returns."""

    op: str
    args: list
    kwargs: dict
    runner: Callable[[tuple, dict], Any]
    device: torch.device
    label: str = ""
    key: str = ""  # the op card's key, for reports that join back to a session
    hits: int = 0
    fallbacks: int = 0  # calls of this variant that ran the original op anyway
    disabled: str = ""  # why the kernel is off for good, once it failed
    # The entry as the native guard holds it, once made (kforge.runtime.native): calls it serves
    # count there.
    native: Any = field(default=None, repr=False)
    # A range card's ranges (``args``/``kwargs`` then hold its variant at the profiled point):
    # the entry serves every variant of the range, ``runner`` is then a ``RangeRunner``.
    ranges: dict | None = None

    def __post_init__(self) -> None:
        if self.device.type == "cuda" and self.device.index is None:
            self.device = torch.device("cuda", torch.cuda.current_device())

    def run(self, args: tuple, kwargs: dict, point: Mapping[str, int] | None = None) -> Any:
        """The kernel's result, or _MISS when the original op must run instead. ``point``: where
        in its range a range entry's call is, when the caller has matched it already."""
        if self.disabled or not _all_on(self.device, args, kwargs):
            self.fallbacks += 1
            return _MISS
        runner = self.runner if point is None else self.runner.at(point)
        if runner is None:  # the plan does not cover this point of the range
            self.fallbacks += 1
            return _MISS
        try:
            if self.device.type == "cuda" and torch.cuda.current_device() != self.device.index:
                with torch.cuda.device(self.device):  # as the op's own kernel would set it
                    result = runner(args, kwargs)
            else:
                result = runner(args, kwargs)
        except Exception as exc:  # any failure of the kernel: the original op takes over
            self.disable(f"{type(exc).__name__}: {exc}")
            self.fallbacks += 1
            return _MISS
        self.hits += 1
        return result

    def counts(self) -> tuple[int, int, str]:
        """Hits, fallbacks and why the kernel is off, on both guards."""
        if self.native is None:
            return self.hits, self.fallbacks, self.disabled
        hits, fallbacks, disabled = self.native.counts()
        return self.hits + hits, self.fallbacks + fallbacks, self.disabled or disabled

    def disable(self, reason: str) -> None:
        self.disabled = reason.strip().splitlines()[0][:300] if reason.strip() else "failed"
        warnings.warn(f"kforge kernel {self.label or self.op} failed ({self.disabled}); "
                      f"{self.op} runs as eager PyTorch from now on", RuntimeWarning, stacklevel=4)


def _all_on(device: torch.device, args: Iterable[Any], kwargs: dict) -> bool:
    for value in (*args, *kwargs.values()):
        if isinstance(value, torch.Tensor):
            if value.device != device:
                return False
        elif type(value) is list or type(value) is tuple:
            if not _all_on(device, value, {}):
                return False
    return True


class _OpEntries:
    """A table's kernels for one op, keyed by exact variant, with a cheap first test on the
    first argument's shape and dtype so that most other calls skip the full encoding; then its
    range entries, tried in order after the exact lookup (the Python guard serves an op that has
    any: the native guard compares exact variants only)."""

    def __init__(self, func: Any) -> None:
        self.func = func
        self.variants: dict[Any, Entry] = {}
        self.ranges: list[tuple[RangeMatcher, Entry]] = []
        self.quick: set[tuple] | None = set()
        self.misses = 0
        self.native_route: Any = None  # the native guard serving these kernels, if it does

    def miss_count(self) -> int:
        """Calls that matched no kernel's variant, on both guards."""
        return self.misses + (self.native_route.misses() if self.native_route else 0)

    def add(self, entry: Entry) -> None:
        if entry.ranges is not None:
            self.ranges.append((RangeMatcher(entry.args, entry.kwargs,
                                             Ranges.from_dict(entry.ranges)), entry))
            self.quick = None  # a range's first argument takes many shapes
            return
        key = freeze([entry.args, entry.kwargs])
        if key in self.variants:
            raise ValueError(f"two kernels for one variant of {entry.op}")
        self.variants[key] = entry
        first = entry.args[0] if entry.args else None
        if self.quick is not None and is_tensor_spec(first) and "stride" in first:
            self.quick.add((tuple(first["shape"]), torch_dtype(first["dtype"])))
        else:
            self.quick = None

    def run(self, args: tuple, kwargs: dict) -> Any:
        if self.quick is not None:
            first = args[0] if args else None
            if not isinstance(first, torch.Tensor) or (first.shape, first.dtype) not in self.quick:
                self.misses += 1
                return _MISS
        args_spec, kwargs_spec = encode_call(self.func, args, kwargs)
        frozen = freeze([args_spec, kwargs_spec])
        entry = self.variants.get(frozen)
        if entry is not None:
            return entry.run(args, kwargs)
        for matcher, ranged in self.ranges:
            point = matcher.match(args_spec, kwargs_spec, frozen)
            if point is not None:
                return ranged.run(args, kwargs, point)
        self.misses += 1
        return _MISS


class RangeRunner:
    """A range card's kernel: its launch plan resolved for the card's exact variant at each point
    of the range it is called at (once per point, kept), run by a ``PlanRunner``. Called without
    a point, it finds the call's point itself."""

    def __init__(self, plan: Mapping[str, Any], op: str, args: list, kwargs: dict,
                 ranges: dict, backend: KernelLauncher, device: torch.device,
                 limits: DeviceLimits = DeviceLimits()) -> None:
        self.plan_source = plan
        self.op = op
        self.func = resolve_op(op)
        self.backend = backend
        self.device = device
        self.limits = limits
        self.matcher = RangeMatcher(args, kwargs, Ranges.from_dict(ranges))
        self._runners: dict[tuple[int, ...], PlanRunner | None] = {}

    def at(self, point: Mapping[str, int]) -> PlanRunner | None:
        """The plan's runner at ``point``; None where the plan does not cover it."""
        key = tuple(point.values())
        if key not in self._runners:
            if len(self._runners) >= MATCH_CACHE_SIZE:
                self._runners.clear()
            matcher = self.matcher
            args, kwargs = instantiate(matcher.args, matcher.kwargs, matcher.ranges, point)
            try:
                resolved = resolve_for(self.plan_source, self.op, args, kwargs, self.limits)
                self._runners[key] = PlanRunner(resolved, self.op, self.backend, self.device)
            except PlanError:
                self._runners[key] = None
        return self._runners[key]

    def __call__(self, args: tuple, kwargs: dict) -> Any:
        args_spec, kwargs_spec = encode_call(self.func, args, kwargs)
        point = self.matcher.match(args_spec, kwargs_spec)
        runner = self.at(point) if point is not None else None
        if runner is None:
            raise RangeError(f"a call of {self.op} outside the kernel's range "
                             f"{self.matcher.ranges.text()} or its plan")
        return runner(args, kwargs)


class KernelTable:
    """Kernels by op and exact variant (or range), with their hit counts."""

    def __init__(self, entries: Iterable[Entry] = ()) -> None:
        self.entries: list[Entry] = []
        self._by_op: dict[tuple[str, str], _OpEntries] = {}
        for entry in entries:
            self.add(entry)

    def add(self, entry: Entry) -> None:
        slot = (entry.op, entry.device.type)
        if slot not in self._by_op:
            self._by_op[slot] = _OpEntries(resolve_op(entry.op))
        self._by_op[slot].add(entry)
        self.entries.append(entry)

    def __len__(self) -> int:
        return len(self.entries)

    def ops(self) -> dict[tuple[str, str], _OpEntries]:
        """(op name, device type) -> the kernels of that op."""
        return dict(self._by_op)

    def report(self) -> Report:
        return Report(
            kernels=[KernelCount(e.label or e.op, e.op, e.key, *e.counts()) for e in self.entries],
            misses={op: slot.miss_count() for (op, _), slot in self._by_op.items()})

    def reset_counts(self) -> None:
        for entry in self.entries:
            entry.hits = entry.fallbacks = 0
            if entry.native is not None:
                entry.native.reset()
        for slot in self._by_op.values():
            slot.misses = 0
            if slot.native_route is not None:
                slot.native_route.reset()


@dataclass(frozen=True)
class KernelCount:
    label: str
    op: str
    key: str
    hits: int
    fallbacks: int
    disabled: str


@dataclass(frozen=True)
class Report:
    """How often each kernel ran, and how often each patched op ran eager instead."""

    kernels: list[KernelCount]
    misses: dict[str, int]  # op -> calls that matched no kernel's variant
    notes: list[str] = field(default_factory=list)

    @property
    def hits(self) -> int:
        return sum(k.hits for k in self.kernels)

    def __str__(self) -> str:
        if not self.kernels:
            return "\n".join(["no kernels are patched in", *self.notes])
        width = max(len(k.label) for k in self.kernels)
        lines = [f"{'kernel'.ljust(width)}  {'hits':>7}  {'fallbacks':>9}"]
        for k in self.kernels:
            state = f"  off: {k.disabled}" if k.disabled else ""
            lines.append(f"{k.label.ljust(width)}  {k.hits:>7}  {k.fallbacks:>9}{state}")
        other = {op: n for op, n in self.misses.items() if n}
        if other:
            lines.append("other variants of these ops ran eager: " +
                         ", ".join(f"{op} x{n}" for op, n in sorted(other.items())))
        return "\n".join([*lines, *self.notes])
