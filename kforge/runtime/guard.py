"""The guard: each op that has kernels gets a kernel registered at the op's device dispatch key,
in front of the op's own kernel (kept), which runs for every call that is not an exact variant
with a kernel.

That level is reached by every call of the op, whoever issued it: code under no_grad or
inference_mode, a composite op decomposed in C++ (``softmax`` into ``_softmax``), a CUDA graph
being captured. Ops without kernels are not touched, so the guard costs nothing outside the ops
it serves (a TorchDispatchMode would put Python in front of every op the model runs). The
registration is process-wide while a ``Patch`` is active.

The kernel in front is the native guard (``kforge.runtime.native``: C++, no Python per call)
where it can serve every kernel of the op, else a Python kernel registered with
``torch.library``.
"""

from __future__ import annotations

import threading
import warnings
from collections.abc import Iterable
from typing import Any

import torch

from kforge.core.argspec import resolve_op
from kforge.errors import KforgeError
from kforge.runtime.native import (
    ENV_DISABLE,
    NativeRoute,
    NativeVariant,
    available,
    describable,
    variant_for,
)
from kforge.runtime.table import _MISS, Entry, KernelTable, Report, _OpEntries

_NUMBERS = (bool, int, float, complex)  # in the order of their promotion categories
_WRAPPED_DTYPE = {bool: torch.bool, int: torch.int64, float: torch.float64,
                  complex: torch.complex128}


def _dtype_category(dtype: torch.dtype) -> int:
    """bool < integer < floating < complex, as type promotion ranks them."""
    if dtype == torch.bool:
        return 0
    if dtype.is_complex:
        return 3
    return 2 if dtype.is_floating_point else 1


def number_as_tensor(value: bool | int | float | complex, others: list[torch.Tensor]
                     ) -> torch.Tensor:
    """A 0-dim CPU tensor standing for a Python number in a ``Tensor`` argument.

    The dispatcher hands a Python kernel a number where a ``Tensor`` argument held a wrapped
    scalar (``x * 0.125``), and the original kernel wants a tensor back; a wrapped number cannot
    be made from Python. Where a dimensioned tensor of the number's category or higher leads
    type promotion (nearly always), the number cannot change the result's dtype and goes in at a
    wrapped number's own precision (double, int64), so the kernel computes exactly what it did
    eager. Otherwise it takes the dtype it promotes to with the leading tensor: the same result
    dtype, its value rounded to that dtype first (a last-bit difference is possible only when
    that dtype is a half-precision float). Tensors are reused across calls (ops never write an
    operand other than ``self`` or ``out``), as making one costs more than the call it serves."""
    kind = type(value)
    key = (kind, repr(value) if kind is float or kind is complex else value,
           tuple([(t.dtype, t.dim() > 0) for t in others]))
    found = _number_tensors.get(key)
    if found is None:
        if len(_number_tensors) >= _NUMBER_CACHE_SIZE:
            _number_tensors.clear()
        found = _number_tensors[key] = _make_number_tensor(value, others)
    return found


_number_tensors: dict[tuple, torch.Tensor] = {}
_NUMBER_CACHE_SIZE = 4096


def _make_number_tensor(value: bool | int | float | complex, others: list[torch.Tensor]
                        ) -> torch.Tensor:
    if not others:
        return torch.tensor(value)
    leader = max(others, key=lambda t: (_dtype_category(t.dtype), t.dim() > 0))
    if leader.dim() > 0 and _dtype_category(leader.dtype) >= _NUMBERS.index(type(value)):
        return torch.tensor(value, dtype=_WRAPPED_DTYPE[type(value)])
    return torch.tensor(value, dtype=torch.result_type(leader, value))


class _Route:
    """What stands in front of one (op, dispatch key) for the active tables: the native guard
    when it can serve all their kernels, else the Python kernel."""

    def __init__(self, op: str, dispatch_key: str) -> None:
        self.op = op
        self.dispatch_key = dispatch_key
        self.tables: list[_OpEntries] = []
        self._python: _PythonRoute | None = None
        self._native: NativeRoute | None = None

    def refresh(self) -> None:
        """Put the right guard in front of the op for the tables now attached."""
        variants = _native_variants(self.tables)
        if variants is not None and self._native is None:
            try:
                self._native = NativeRoute(self.op, self.dispatch_key)
            except RuntimeError as exc:
                _warn_python_guard(str(exc))
                variants = None
        if variants is None:
            self._close_native()
            if self._python is None:
                self._python = _PythonRoute(self.op, self.dispatch_key, self.tables)
            return
        if self._python is not None:
            self._python.close()
            self._python = None
        self._native.set(variants)
        for table in self.tables:
            table.native_route = self._native

    def _close_native(self) -> None:
        if self._native is not None:
            self._native.close()
            self._native = None
        for table in self.tables:
            table.native_route = None

    def close(self) -> None:
        self._close_native()
        if self._python is not None:
            self._python.close()
            self._python = None


def _native_variants(tables: list[_OpEntries]) -> list[NativeVariant] | None:
    """Every kernel of the tables as the native guard holds it, in table order; None when the
    native guard cannot serve one of them (or at all)."""
    entries = [entry for table in tables for entry in table.variants.values()]
    if any(table.ranges for table in tables) or not all(
            entry.disabled or describable(entry) for entry in entries):
        return None  # range entries are matched in Python
    why = available()
    if why is not None:
        _warn_python_guard(why)
        return None
    variants = []
    for table in tables:
        for entry in table.variants.values():
            variant = variant_for(entry)
            if variant is None and not entry.disabled:
                return None
            if variant is not None:
                variants.append(variant)
    return variants


_warned: set[str] = set()


def _warn_python_guard(why: str) -> None:
    if why in _warned or why == f"{ENV_DISABLE}=0":
        return
    _warned.add(why)
    warnings.warn(f"kforge's native guard is not available ({why}); patched ops go through "
                  "the Python guard, which costs more host time per call", RuntimeWarning,
                  stacklevel=4)


# Set while a kernel table serves a call: the torch ops a kernel's own host side runs (its
# allocations; on a machine without a GPU, the emulated kernel) are eager's, never a kforge kernel
# again, which would recurse.
_serving = threading.local()


class _PythonRoute:
    """The Python kernel registered for one (op, dispatch key): the active tables' kernels,
    else the original kernel."""

    def __init__(self, op: str, dispatch_key: str, tables: list[_OpEntries]) -> None:
        get_kernel = getattr(torch.library, "get_kernel", None)
        if get_kernel is None:
            raise RuntimeError(f"patching needs torch >= 2.9 (torch.library.get_kernel); this "
                               f"is torch {torch.__version__}")
        self.func = resolve_op(op)
        self.tables = tables  # the route's own list: attached and detached in place
        self.original = get_kernel(self.func, dispatch_key)
        schema = self.func._schema
        self.tensor_slots = [(i, a.name, a.kwarg_only) for i, a in enumerate(schema.arguments)
                             if _is_tensor_type(a.type)]
        namespace, name, overload = op.split(".")
        self.library = torch.library.Library(namespace, "IMPL")
        with warnings.catch_warnings():  # "overriding a previously registered kernel": intended
            warnings.simplefilter("ignore")
            self.library.impl(name if overload == "default" else f"{name}.{overload}",
                              self.__call__, dispatch_key, with_keyset=True)

    def __call__(self, keyset: Any, *args: Any, **kwargs: Any) -> Any:
        if not getattr(_serving, "active", False):
            _serving.active = True
            try:
                for table in self.tables:
                    result = table.run(args, kwargs)
                    if result is not _MISS:
                        return result
            finally:
                _serving.active = False
        if self.tensor_slots:
            args, kwargs = self._numbers_as_tensors(args, kwargs)
        return self.original.call_boxed(keyset, *args, **kwargs)

    def _numbers_as_tensors(self, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        numbers = [(i, name, kw) for i, name, kw in self.tensor_slots
                   if type(kwargs.get(name) if kw else args[i] if i < len(args) else None)
                   in _NUMBERS]
        if not numbers:
            return args, kwargs
        others = [v for v in (*args, *kwargs.values()) if isinstance(v, torch.Tensor)]
        args, kwargs = list(args), dict(kwargs)
        for i, name, kw in numbers:
            if kw:
                kwargs[name] = number_as_tensor(kwargs[name], others)
            else:
                args[i] = number_as_tensor(args[i], others)
        return tuple(args), kwargs

    def close(self) -> None:
        self.library._destroy()


def _is_tensor_type(kind: Any) -> bool:
    if isinstance(kind, torch._C.OptionalType):
        kind = kind.getElementType()
    return isinstance(kind, torch._C.TensorType)


_routes: dict[tuple[str, str], _Route] = {}
_routes_lock = threading.Lock()


def active_routes() -> list[tuple[str, str]]:
    """(op, dispatch key) of every op that has a kforge kernel in front of it now."""
    with _routes_lock:
        return sorted(_routes)


class Patch:
    """A table's kernels put in front of their ops while the patch is active (``with``)."""

    def __init__(self, table: KernelTable, notes: Iterable[str] = ()) -> None:
        self.table = table
        self.notes = list(notes)
        self.active = False
        self._attached: list[tuple[tuple[str, str], _OpEntries]] = []
        self._entered = 0  # nested ``with`` blocks of this patch: the outermost removes it

    def __enter__(self) -> Patch:
        self._entered += 1
        if self._entered == 1:
            try:
                self.install()
            except BaseException:
                self._entered = 0
                raise
        return self

    def __exit__(self, *exc: object) -> None:
        self._entered -= 1
        if self._entered == 0:
            self.remove()

    def __reduce_ex__(self, protocol: object) -> Any:
        # a patch holds loaded kernels and routes in this process's dispatcher
        raise KforgeError("a kforge patch cannot be copied or pickled: make another one with "
                          "kforge.patch(...) where it is needed")

    def install(self) -> None:
        """Route the table's ops through the guard; nothing at all is registered for an empty
        table."""
        if self.active:
            return
        with _routes_lock:
            try:
                for (op, device_type), entries in self.table.ops().items():
                    slot = (op, device_type.upper())
                    route = _routes.get(slot)
                    if route is None:
                        route = _routes[slot] = _Route(op, slot[1])
                    route.tables.append(entries)
                    self._attached.append((slot, entries))
                    route.refresh()
            except BaseException:
                self._detach()
                raise
        self.active = True

    def remove(self) -> None:
        with _routes_lock:
            self._detach()
        self.active = False

    def _detach(self) -> None:
        for slot, entries in self._attached:
            route = _routes[slot]
            route.tables.remove(entries)
            entries.native_route = None
            if not route.tables:
                route.close()
                del _routes[slot]
            else:
                route.refresh()
        self._attached.clear()

    def subset(self, entries: Iterable[Entry], notes: Iterable[str] = ()) -> Patch:
        """A patch of some of this one's kernels (to try them apart, or keep those chosen)."""
        return Patch(KernelTable(entries), notes)

    def report(self) -> Report:
        report = self.table.report()
        return Report(report.kernels, report.misses, self.notes)
