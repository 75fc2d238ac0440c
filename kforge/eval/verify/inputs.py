"""Materialize an op card's arguments on a device: from a captured sample or from random values.

Every tensor gets exactly its spec's shape, strides, dtype and storage offset, inside a storage
with canaries (NaN for floats, the dtype's maximum for integers) before and after it, so a kernel
that reads out of bounds computes garbage and one that writes out of bounds is seen. Everything
is made on the evaluation's device, whatever device the card names.

Random values mimic the card's first sample where there is one: integers stay within the
sample's min..max (embedding indices), booleans keep their fraction of True, floats keep the
sample's mean and spread and its exact positions of +-inf (attention masks). Without a sample,
op-aware defaults apply (indices below the size they index).

Samples are ``<samples_dir>/<card key>/<n>.pt`` files holding ``{"args": [...], "kwargs": {}}``
with CPU tensors laid out as in the model (see ``kforge.capture.samples``); a tensor too large to
keep is left there as its spec and is filled with random values.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch

from kforge.core.argspec import (
    decode_call,
    is_tensor_spec,
    list_items,
    storage_span,
    tensor_specs,
    torch_dtype,
    walk,
)
from kforge.core.files import plain_file
from kforge.core.opcard import OpCard, key_folder
from kforge.errors import KforgeError
from kforge.eval.verify.placement import PRODUCTION, Shifts, fitted, placed

# Canary bytes on each side of a tensor's elements.
CANARY_BYTES = 256
# Ops whose float inputs must be positive to be meaningful (log, sqrt...).
POSITIVE_INPUT_OPS = frozenset({"log", "log2", "log10", "sqrt", "rsqrt", "reciprocal", "lgamma"})
# Elements of each tensor given new values by a partial update in place.
PARTIAL_UPDATE = 3
# Integer tensors that are not indices get values in this range.
DEFAULT_INT_RANGE = (0, 16)


def canary_value(dtype: torch.dtype) -> float | int | bool:
    if dtype == torch.bool:
        return True
    if dtype.is_floating_point or dtype.is_complex:
        return math.nan
    return torch.iinfo(dtype).max


@dataclass(frozen=True)
class Geometry:
    shape: tuple[int, ...]
    stride: tuple[int, ...]
    offset: int
    dtype: torch.dtype

    @classmethod
    def from_spec(cls, spec: dict) -> Geometry:
        if "stride" not in spec:
            raise KforgeError(f"tensor spec {spec} has no strides (a {spec.get('layout')} "
                              "tensor?): only strided tensors can be evaluated")
        return cls(tuple(spec["shape"]), tuple(spec["stride"]), int(spec.get("offset", 0)),
                   torch_dtype(spec["dtype"]))

    @property
    def span(self) -> int:
        return storage_span(self.shape, self.stride)

    @property
    def used(self) -> int:
        """Elements of its storage up to its last one: its storage offset, then its span."""
        return self.offset + self.span

    @property
    def nbytes(self) -> int:
        return self.used * self.dtype.itemsize

    def matches(self, t: torch.Tensor) -> bool:
        return (tuple(t.shape) == self.shape and tuple(t.stride()) == self.stride
                and t.dtype == self.dtype)


@dataclass
class Buffer:
    """One materialized tensor: ``view`` is what the op gets; ``base`` is a 1-D tensor over the
    whole allocation, canaries included, for integrity checks."""

    geometry: Geometry
    base: torch.Tensor
    view: torch.Tensor

    @property
    def start(self) -> int:
        """Where the view's first element sits in ``base``. Read from the storages' addresses,
        not the view's: a view of no elements has address 0."""
        storage = self.view.untyped_storage().data_ptr()
        return ((storage - self.base.data_ptr()) // self.base.element_size()
                + self.view.storage_offset())

    def region(self) -> torch.Tensor:
        """The elements from the view's first to its last, as a 1-D tensor."""
        return self.view.as_strided((self.geometry.span,), (1,), self.view.storage_offset())

    def view_mask(self) -> torch.Tensor:
        """Bool over ``base``: True from the view's first element to its last."""
        mask = torch.zeros(self.base.numel(), dtype=torch.bool, device=self.base.device)
        mask[self.start:self.start + self.geometry.span] = True
        return mask


def allocate(geometry: Geometry, device: torch.device, shift: int = PRODUCTION) -> Buffer:
    """An uninitialised tensor of ``geometry`` with canaries around it, its storage starting
    ``shift`` bytes (rounded to the item size) past a 512-byte boundary
    (``kforge.eval.verify.placement``)."""
    item = torch.empty((), dtype=geometry.dtype).element_size()
    pad = max(1, CANARY_BYTES // item)
    used = geometry.used
    raw, start = placed(used, geometry.dtype, device, pad, pad, fitted(shift, item))
    base = raw[start - pad:start + used + pad]  # laid out alike wherever it starts
    base.fill_(canary_value(geometry.dtype))
    try:
        # A storage that starts after the leading canary keeps the spec's exact storage offset.
        storage = raw.untyped_storage()[start * item:(start + used + pad) * item]
        view = torch.empty(0, dtype=geometry.dtype, device=device).set_(
            storage, geometry.offset, geometry.shape, geometry.stride)
    except (RuntimeError, TypeError, NotImplementedError):
        view = raw.as_strided(geometry.shape, geometry.stride, start + geometry.offset)
    return Buffer(geometry, base, view)


# ----- samples -----


def sample_tensors(value: Any) -> list[torch.Tensor | None]:
    """The tensors of a saved sample in spec order; None where the sample kept only a spec."""
    return [leaf if isinstance(leaf, torch.Tensor) else None for _, leaf in walk(value)
            if isinstance(leaf, torch.Tensor) or is_tensor_spec(leaf)]


def load_samples(samples_dir: Path | None, card: OpCard, limit: int) -> list[tuple[str, list]]:
    """Up to ``limit`` samples of ``card`` as ``(label, tensors in spec order)``; samples that
    cannot be read or whose tensors do not match the card are skipped."""
    if samples_dir is None or limit <= 0:
        return []
    try:
        folder = key_folder(Path(samples_dir), card.key)
    except ValueError:  # a key from a damaged database names no samples
        return []
    if folder.is_symlink() or not folder.is_dir():
        return []
    # a link or a pipe among them is skipped: a pipe would block the loader forever
    files = sorted(filter(plain_file, folder.glob("*.pt")),
                   key=lambda p: (int(p.stem) if p.stem.isdigit() else math.inf, p.name))
    geometries = [Geometry.from_spec(s) for s in all_tensor_specs(card)]
    found = []
    for path in files:
        try:
            # Mapped from the file: a sample takes no more memory than the file holds (a
            # compressed record, which would inflate to any size, cannot be mapped).
            saved = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
        except Exception:  # a damaged file is skipped: random inputs still verify the card
            continue
        if not isinstance(saved, dict) or "args" not in saved:
            continue
        kwargs = saved.get("kwargs") or {}
        tensors = sample_tensors(saved["args"]) + [
            t for name in card.kwargs for t in sample_tensors(kwargs.get(name))]
        if len(tensors) != len(geometries) or any(
                t is not None and (tuple(t.shape) != g.shape or t.dtype != g.dtype)
                for t, g in zip(tensors, geometries)):
            continue
        found.append((f"sample {path.stem}", tensors))
        if len(found) >= limit:
            break
    return found


def all_tensor_specs(card: OpCard) -> list[dict]:
    return tensor_specs([card.args, list(card.kwargs.values())])


# ----- values -----


@dataclass(frozen=True)
class ValueModel:
    """How to draw fresh values for one tensor."""

    low: float = DEFAULT_INT_RANGE[0]  # integers: inclusive
    high: float = DEFAULT_INT_RANGE[1]  # integers: exclusive
    true_fraction: float = 0.5
    mean: float = 0.0
    std: float = 1.0
    positive: bool = False
    template: torch.Tensor | None = None  # a sample's region on the device: +-inf kept there

    @classmethod
    def from_sample(cls, t: torch.Tensor, geometry: Geometry, device: torch.device,
                    default: ValueModel) -> ValueModel:
        values = t.to(device)  # values only: the layout may change here
        if t.dtype == torch.bool:
            return cls(true_fraction=values.float().mean().item() if t.numel() else 0.5)
        if not (t.dtype.is_floating_point or t.dtype.is_complex):
            if t.numel() == 0:
                return default
            return cls(low=values.min().item(), high=values.max().item() + 1)
        real = values.real if t.dtype.is_complex else values
        finite = real[torch.isfinite(real)].double()
        template = None
        if geometry.matches(t) and bool(torch.isinf(real).any()):
            template = region_of(t, geometry.span).to(device)
        if finite.numel() == 0:
            return cls(template=template)
        std = finite.std().item() if finite.numel() > 1 else 0.0
        return cls(mean=finite.mean().item(), std=std if math.isfinite(std) else 1.0,
                   positive=finite.min().item() >= 0, template=template)


def region_of(t: torch.Tensor, span: int) -> torch.Tensor:
    return t.as_strided((span,), (1,), t.storage_offset())


def random_values(model: ValueModel, dtype: torch.dtype, count: int,
                  generator: torch.Generator, device: torch.device) -> torch.Tensor:
    """``count`` fresh values of ``dtype`` drawn by ``model``."""
    if dtype == torch.bool:
        return torch.rand(count, generator=generator, device=device) < model.true_fraction
    if not (dtype.is_floating_point or dtype.is_complex):
        info = torch.iinfo(dtype)
        low = max(int(model.low), info.min)
        high = min(int(model.high), info.max)
        if high <= low:
            return torch.full((count,), low, dtype=dtype, device=device)
        return torch.randint(low, high, (count,), generator=generator, device=device, dtype=dtype)
    work = torch.complex64 if dtype.is_complex else torch.float32
    values = torch.randn(count, generator=generator, device=device, dtype=work)
    values = values * model.std + model.mean
    if model.positive:
        values = values.abs()
    if model.template is not None:
        template = model.template.to(work)
        values = torch.where(torch.isinf(template.real if dtype.is_complex else template),
                             template, values)
    return values.to(dtype)


def default_models(card: OpCard, geometries: list[Geometry]) -> list[ValueModel]:
    """Value models without a sample: op-aware bounds for index tensors."""
    models = [ValueModel() for _ in geometries]
    short = card.short_op
    if short in POSITIVE_INPUT_OPS:
        models = [ValueModel(positive=True) for _ in geometries]
    for flat, bound in index_bounds(short, card.args).items():
        if flat < len(models):
            models[flat] = ValueModel(low=0, high=max(1, bound))
    return models


def index_bounds(short_op: str, args: list) -> dict[int, int]:
    """``{flat tensor index: exclusive upper bound}`` for integer tensors that index another."""

    def flat_index(position: int) -> int:
        return len(tensor_specs(args[:position]))

    def size(position: int, dim: Any) -> int | None:
        spec = args[position] if position < len(args) else None
        if not isinstance(spec, dict) or "shape" not in spec:
            return None
        shape = spec["shape"]
        if not isinstance(dim, int) or not shape:
            return None
        return shape[dim % len(shape)]

    bounds: dict[int, int] = {}

    def put(position: int, bound: int | None) -> None:
        if bound is not None and position < len(args):
            bounds[flat_index(position)] = bound

    if short_op == "embedding":
        put(1, size(0, 0))
    elif short_op == "embedding_dense_backward" and len(args) > 2 and isinstance(args[2], int):
        put(1, args[2])
    elif short_op in ("index_select", "gather", "scatter", "scatter_add", "scatter_reduce",
                      "index_add", "index_copy", "index_fill", "scatter_", "scatter_add_",
                      "index_add_", "index_copy_", "index_fill_"):
        if len(args) > 1:
            put(2, size(0, args[1]))
    elif short_op in ("index", "index_put", "index_put_", "_index_put_impl_", "_unsafe_index"):
        indices = list_items(args[1]) if len(args) > 1 else None
        if indices is not None:
            first = flat_index(1)
            shape = args[0].get("shape", []) if isinstance(args[0], dict) else []
            k = 0
            for dim, item in enumerate(indices):
                if is_tensor_spec(item):
                    if dim < len(shape) and item["dtype"] != "bool":
                        bounds[first + k] = shape[dim]
                    k += 1
    elif short_op in ("nll_loss_forward", "nll_loss2d_forward", "nll_loss", "nll_loss_nd",
                      "cross_entropy_loss"):
        shape = args[0].get("shape", []) if args and isinstance(args[0], dict) else []
        if shape:
            put(1, shape[1] if len(shape) > 1 else shape[0])
    elif short_op == "take" and args and isinstance(args[0], dict):
        put(1, math.prod(args[0]["shape"]))
    return bounds


# ----- input sets -----


@dataclass
class InputSet:
    """One call's worth of arguments on the device, with a snapshot for integrity checks."""

    label: str
    args: tuple
    kwargs: dict
    buffers: list[Buffer]
    device: torch.device
    op: str
    args_spec: list = field(repr=False, default_factory=list)
    kwargs_spec: dict = field(repr=False, default_factory=dict)
    snapshot: list[torch.Tensor] = field(repr=False, default_factory=list)
    shift: int = PRODUCTION  # bytes past a 512-byte boundary its storages start at

    def take_snapshot(self) -> None:
        self.snapshot = [b.base.clone() for b in self.buffers]

    def restore(self, indices: list[int] | None = None) -> None:
        for i in range(len(self.buffers)) if indices is None else indices:
            self.buffers[i].base.copy_(self.snapshot[i])

    def differences(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Per buffer, whether its memory around the view and whether the view's elements
        differ from the snapshot, byte for byte (so NaN equals the same NaN and -0.0 differs from
        0.0): two 0-d bool tensors, queued on the device without waiting for it, so a call's
        integrity can be taken right after it while the stream is held and read later."""
        found = []
        for buf, snap in zip(self.buffers, self.snapshot):
            start = buf.start
            end = start + buf.geometry.span
            found.append((differs_in(buf.base, snap, 0, start) | differs_in(buf.base, snap, end),
                          differs_in(buf.base, snap, start, end)))
        return found

    def changed(self, written: set[int],
                differences: list[tuple[torch.Tensor, torch.Tensor]] | None = None) -> list[str]:
        """What differs from the snapshot, one line per tensor. For the tensors in ``written``
        (arguments the op writes) only the memory around the view counts. ``differences``: as
        ``differences()`` gave them right after a call, to judge that call later; by default the
        buffers against the snapshot now."""
        differences = self.differences() if differences is None else differences
        flags = torch.stack([torch.stack(pair) for pair in differences]).tolist() \
            if differences else []
        problems = []
        for i, (around, inside) in enumerate(flags):
            if around:
                problems.append(f"the memory around tensor argument {i}")
            elif inside and i not in written:
                problems.append(f"tensor argument {i}")
        return problems

    def fresh_copy(self, label: str | None = None) -> InputSet:
        """An independent set with the snapshot's values (for the eager reference)."""
        buffers = []
        for buf, snap in zip(self.buffers, self.snapshot):
            new = allocate(buf.geometry, self.device)
            new.base.copy_(snap)
            buffers.append(new)
        return build_set(label or self.label, self.op, self.args_spec, self.kwargs_spec,
                         buffers, self.device, snapshot=False)

    def load_values_from(self, other: InputSet) -> None:
        """Overwrite this set's memory with ``other``'s (same geometry), keeping addresses."""
        for mine, theirs in zip(self.buffers, other.buffers):
            mine.base.copy_(theirs.base)
        self.take_snapshot()

    def nbytes(self) -> int:
        return sum(b.base.numel() * b.base.element_size() for b in self.buffers)


def unravel(flat: torch.Tensor, shape: tuple[int, ...]) -> tuple[torch.Tensor, ...]:
    """Flat indices as one index tensor per dim of ``shape`` (``torch.unravel_index`` imports
    sympy, seconds on a worker's first call)."""
    index = []
    for size in reversed(shape):
        index.append(flat % size)
        flat = flat // size
    return tuple(reversed(index))


def as_bytes(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.uint8)


# Elements compared per step by ``differs_in``: a huge table (an embedding's) is compared without
# a temporary the size of its own.
COMPARE_CHUNK = 1 << 26
_SAME_SIZE_INTS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def differs_in(a: torch.Tensor, b: torch.Tensor, start: int = 0, end: int | None = None
               ) -> torch.Tensor:
    """Whether two 1-D tensors of one dtype differ anywhere in ``[start, end)``, byte for byte:
    a 0-d bool tensor, computed on their device without waiting for it."""
    end = a.numel() if end is None else min(end, a.numel())
    found = torch.zeros((), dtype=torch.bool, device=a.device)
    as_int = _SAME_SIZE_INTS.get(a.element_size())
    for at in range(start, end, COMPARE_CHUNK):
        x, y = a[at:min(end, at + COMPARE_CHUNK)], b[at:min(end, at + COMPARE_CHUNK)]
        step = (x.view(as_int) != y.view(as_int)) if as_int else elements_differ(x, y)
        found |= step.any()
    return found


def elements_differ(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Bool per element of two 1-D tensors of one dtype: True where their bytes differ
    (so NaN equals the same NaN and -0.0 differs from 0.0)."""
    size = a.element_size()
    return (as_bytes(a).view(-1, size) != as_bytes(b).view(-1, size)).any(1)


def build_set(label: str, op: str, args_spec: list, kwargs_spec: dict, buffers: list[Buffer],
              device: torch.device, snapshot: bool = True, shift: int = PRODUCTION) -> InputSet:
    """The call of ``op`` these arg specs describe, on ``device`` (``decode_call``: every device
    the card names is this one, and a factory naming none makes its tensor here too), its
    tensors the views of ``buffers`` in order."""
    views = iter([b.view for b in buffers])
    args, kwargs = decode_call(op, args_spec, kwargs_spec, lambda _: next(views), device)
    result = InputSet(label, tuple(args), kwargs, buffers, device, op, args_spec, kwargs_spec,
                      shift=shift)
    if snapshot:
        result.take_snapshot()
    return result


class InputFactory:
    """Builds input sets for one card on one device."""

    def __init__(self, card: OpCard, device: torch.device, samples_dir: Path | None = None,
                 max_samples: int = 2, shifts: tuple[int, ...] = (PRODUCTION,)) -> None:
        self.card = card
        self.device = device
        self.shifts = Shifts(shifts)  # each new set takes the next placement
        self.geometries = [Geometry.from_spec(s) for s in all_tensor_specs(card)]
        self.samples = load_samples(samples_dir, card, max_samples)
        defaults = default_models(card, self.geometries)
        if self.samples:
            first = self.samples[0][1]
            self.models = [ValueModel.from_sample(t, g, device, d) if t is not None else d
                           for t, g, d in zip(first, self.geometries, defaults)]
        else:
            self.models = defaults

    def build(self, label: str, fill, shift: int | None = None) -> InputSet:
        """A new set (at the next placement, or at ``shift``) whose buffer ``i``
        ``fill(i, buffer)`` fills; the sets that stress an op's semantics are built so
        (``kforge.eval.verify.stress``)."""
        buffers = []
        shift = self.shifts.next() if shift is None else shift
        for i, g in enumerate(self.geometries):
            buf = allocate(g, self.device, shift)
            if g.span:
                fill(i, buf)
            buffers.append(buf)
        return build_set(label, self.card.op, self.card.args, self.card.kwargs, buffers,
                         self.device, shift=shift)

    def random_set(self, seed: int, shift: int | None = None) -> InputSet:
        """Random values drawn from ``seed``, at the next placement or at ``shift``."""
        return self.build(f"seed {seed}", self._random_fill(seed), shift)

    def refill(self, inputs: InputSet, seed: int) -> None:
        """New random values (drawn as for ``random_set(seed)``) in a set built by this factory,
        at the same addresses; the set's snapshot is not retaken."""
        fill = self._random_fill(seed)
        for i, buf in enumerate(inputs.buffers):
            if self.geometries[i].span:
                fill(i, buf)

    def update_part(self, inputs: InputSet, generator: torch.Generator,
                    count: int = PARTIAL_UPDATE) -> None:
        """New values, drawn like the random sets' (booleans flipped), for ``count`` elements of
        every tensor of ``inputs`` at places ``generator`` (on the CPU) draws, in place: a model
        that updates part of a buffer between two calls. The snapshot is retaken."""
        for i, buf in enumerate(inputs.buffers):
            g = self.geometries[i]
            numel = math.prod(g.shape)
            if numel == 0:
                continue
            # Distinct places without a permutation of the whole tensor (a large op's inputs
            # hold hundreds of millions of elements).
            flat = (torch.randperm(numel, generator=generator)[:count] if numel <= 4 * count
                    else torch.randint(numel, (count,), generator=generator).unique())
            index = tuple(t.to(self.device) for t in unravel(flat, g.shape))
            if g.dtype == torch.bool:
                new = ~buf.view[index]
            else:
                new = random_values(replace(self.models[i], template=None), g.dtype,
                                    flat.numel(), generator, torch.device("cpu")).to(self.device)
            if index:
                buf.view[index] = new
            else:
                buf.view.fill_(new[0])
        inputs.take_snapshot()

    def _random_fill(self, seed: int) -> Callable[[int, Buffer], None]:
        generator = torch.Generator(device=self.device)
        generator.manual_seed(seed)

        def fill(i: int, buf: Buffer) -> None:
            g = self.geometries[i]
            values = random_values(self.models[i], g.dtype, g.span, generator, self.device)
            buf.region().copy_(values)

        return fill

    def sample_set(self, index: int) -> InputSet:
        label, tensors = self.samples[index]
        generator = torch.Generator(device=self.device)
        generator.manual_seed(index)

        def fill(i: int, buf: Buffer) -> None:
            g, t = self.geometries[i], tensors[i]
            if t is not None and g.matches(t):
                buf.region().copy_(region_of(t, g.span))
                return
            if t is not None and g.span >= math.prod(g.shape):  # no element stored twice
                buf.view.copy_(t)
                return
            # Too large to keep when captured (or laid out otherwise): random values.
            buf.region().copy_(random_values(self.models[i], g.dtype, g.span, generator,
                                             self.device))

        return self.build(label, fill)

    def sets(self, seeds: tuple[int, ...] | list[int]) -> list[InputSet]:
        """Every sample, then one random set per seed."""
        return ([self.sample_set(i) for i in range(len(self.samples))]
                + [self.random_set(s) for s in seeds])
