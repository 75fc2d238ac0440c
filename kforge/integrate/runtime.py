"""Run verified kernels in place of the aten op variants they won on, and nothing else.

Standalone on purpose: it needs torch, numpy and cuda-python (cuda.core, cuda.bindings) only, and
``kforge export`` copies it into every artifact (with ``spec.py``, the arg-spec encoder capture
used, so a call is named the same way here as when the model was profiled).

The guard: for each op that has kernels, a Python kernel is registered with ``torch.library`` at
the op's device dispatch key (``CUDA``), in front of the op's own kernel, which is kept
(``torch.library.get_kernel``) and called for every call that is not an exact variant with a
kernel. That level is reached by every call of the op, whoever issued it: code under no_grad or
inference_mode, a composite op decomposed in C++ (``softmax`` into ``_softmax``), a CUDA graph
being captured. Ops without kernels are not touched, so the guard costs nothing outside the ops
it serves (a TorchDispatchMode would put Python in front of every op the model runs). The
registration is process-wide while a ``Patch`` is active.
"""

from __future__ import annotations

import math
import threading
import types
import warnings
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from kforge.capture.spec import encode_call

# Dynamic shared memory a kernel may use without opting in to more.
DEFAULT_SHARED_LIMIT = 48 * 1024
# NVRTC options a kernel may carry, as ProgramOptions fields (same allow-list as kforge).
_FLAG_OPTIONS = {"--use_fast_math": "use_fast_math",
                 "--extra-device-vectorization": "extra_device_vectorization",
                 "-lineinfo": "lineinfo"}
_MISS = object()


# ----- naming a call -----


_TENSOR_KEYS = frozenset({"t", "shape", "stride", "dtype", "offset"})


def freeze(spec: Any) -> Any:
    """An arg spec as a hashable value, equal exactly when the specs' canonical JSON is equal:
    dict keys in any order, lists and tuples alike, but ``1``, ``1.0`` and ``True`` apart. (A
    strided tensor's shape and strides, always integers, are compared as integer tuples: the
    fast path, since this runs on every call of a patched op.)"""
    kind = type(spec)
    if kind is dict:
        if spec.keys() == _TENSOR_KEYS and spec["t"] == "tensor":
            return ("tensor", tuple(spec["shape"]), tuple(spec["stride"]), spec["dtype"],
                    spec["offset"])
        return (dict, tuple(sorted((key, freeze(value)) for key, value in spec.items())))
    if kind is list or kind is tuple:
        return (list, tuple([freeze(value) for value in spec]))
    if kind is float:
        return (float, repr(spec))  # repr: NaN equals NaN, -0.0 differs from 0.0
    if kind is bool or kind is int:
        return (kind, spec)
    return spec


def device_arch(device: torch.device | int) -> str:
    """The NVRTC architecture of a CUDA device: ``sm_90`` on an H200, ``sm_121`` on a GB10."""
    major, minor = torch.cuda.get_device_capability(device)
    return f"sm_{major}{minor}"


# ----- kernels: cubins loaded with cuda.core -----


class KernelModule:
    """A cubin loaded on one GPU. ``module.NAME(grid, block, *params, shared_mem=0)`` (or
    ``module["NAME"](...)``) launches kernel NAME on PyTorch's current stream of that GPU:
    tensors go in as their data pointers, numpy scalars by value."""

    def __init__(self, cubin: bytes, device: torch.device | int) -> None:
        from cuda.core import Device, ObjectCode

        self.device_index = device if isinstance(device, int) else _cuda_index(device)
        with torch.cuda.device(self.device_index):  # the caller's current device is restored
            Device(self.device_index).set_current()
            self._object = ObjectCode.from_cubin(cubin)
        self._kernels: dict[str, Any] = {}
        self._streams: dict[int, Any] = {}
        self._configs: dict[tuple, Any] = {}
        self._shared_allowed: dict[str, int] = {}
        self._launchers: dict[str, Callable[..., None]] = {}

    def kernel(self, name: str) -> Any:
        """The cuda.core Kernel NAME; KeyError when the cubin has none."""
        found = self._kernels.get(name)
        if found is None:
            try:
                found = self._object.get_kernel(name)
            except Exception:  # cuda.core raises its CUDAError for an unknown symbol
                raise KeyError(name) from None
            self._kernels[name] = found
        return found

    def stream(self) -> Any:
        """PyTorch's current stream of this GPU, as cuda.core sees it (the capturing stream
        while a CUDA graph is captured)."""
        handle = torch.cuda.current_stream(self.device_index).cuda_stream
        stream = self._streams.get(handle)
        if stream is None:
            from cuda.core import Stream

            try:
                stream = Stream.from_handle(handle)
            except AttributeError:  # a cuda.core without from_handle takes the stream protocol
                stream = ForeignStream(handle)
            self._streams[handle] = stream
        return stream

    def allow_shared(self, name: str, nbytes: int) -> None:
        """Opt kernel NAME into ``nbytes`` of dynamic shared memory (beyond 48 KiB);
        RuntimeError when the GPU cannot give that much."""
        if self._shared_allowed.get(name, DEFAULT_SHARED_LIMIT) >= nbytes:
            return
        from cuda.bindings import driver

        handle = self.kernel(name).handle
        attribute = driver.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
        try:
            (err,) = driver.cuKernelSetAttribute(attribute, nbytes, handle, self.device_index)
        except TypeError:  # a CUfunction handle rather than a CUkernel
            (err,) = driver.cuFuncSetAttribute(handle, attribute, nbytes)
        if err != driver.CUresult.CUDA_SUCCESS:
            raise RuntimeError(f"{name} cannot use {nbytes} bytes of dynamic shared memory on "
                               f"this GPU ({err.name})")
        self._shared_allowed[name] = nbytes

    def launch(self, name: str, grid: int | tuple[int, ...], block: int | tuple[int, ...],
               values: Sequence[Any], shared_mem: int = 0) -> None:
        """Launch NAME with parameter values already converted (pointers as ints)."""
        from cuda.core import LaunchConfig, launch

        kernel = self.kernel(name)
        if shared_mem > DEFAULT_SHARED_LIMIT:
            self.allow_shared(name, shared_mem)
        shape = (grid, block, shared_mem)
        config = self._configs.get(shape)
        if config is None:
            config = self._configs[shape] = LaunchConfig(grid=grid, block=block,
                                                         shmem_size=shared_mem)
        launch(self.stream(), config, kernel, *values)

    def __getattr__(self, name: str) -> Callable[..., None]:
        if name.startswith("_"):
            raise AttributeError(name)
        return self[name]

    def __getitem__(self, name: str) -> Callable[..., None]:
        launcher = self._launchers.get(name)
        if launcher is None:
            def launcher(grid: Any, block: Any, *params: Any, shared_mem: int = 0) -> None:
                values = [p.data_ptr() if isinstance(p, torch.Tensor) else p for p in params]
                self.launch(name, grid, block, values, shared_mem)

            self._launchers[name] = launcher
        return launcher


class ForeignStream:
    """A stream handle in the ``__cuda_stream__`` protocol."""

    def __init__(self, handle: int) -> None:
        self.handle = handle

    def __cuda_stream__(self) -> tuple[int, int]:
        return (0, self.handle)


def _cuda_index(device: torch.device) -> int:
    return device.index if device.index is not None else torch.cuda.current_device()


def nvrtc_options(arch: str, options: Iterable[str], include_dirs: list[str],
                  ptxas_verbose: bool = False) -> Any:
    """cuda.core ProgramOptions for a kernel: C++17 for ``arch``, with the allow-listed options
    (``--use_fast_math``, ``--extra-device-vectorization``, ``-lineinfo``, ``-maxrregcount=N``);
    ``ptxas_verbose`` adds ptxas' register and spill report to the log."""
    from cuda.core import ProgramOptions

    values: dict[str, Any] = {"ptxas_options": ["-v"]} if ptxas_verbose else {}
    for option in options:
        if option in _FLAG_OPTIONS:
            values[_FLAG_OPTIONS[option]] = True
        elif option.startswith("-maxrregcount="):
            values["max_register_count"] = int(option.split("=", 1)[1])
        else:
            raise ValueError(f"NVRTC option not allowed: {option}")
    return ProgramOptions(arch=arch, std="c++17", include_path=include_dirs, **values)


def cuda_include_dirs() -> list[str]:
    """Where cuda_fp16.h is: the nvidia-cuda-runtime wheel's headers, else $CUDA_HOME/include."""
    import os

    try:
        from cuda import pathfinder

        found = pathfinder.find_nvidia_header_directory("cudart")
    except Exception:  # pathfinder missing, or its own lookup error
        found = None
    if found:
        return [found]
    home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    if home and os.path.exists(os.path.join(home, "include", "cuda_fp16.h")):
        return [os.path.join(home, "include")]
    raise RuntimeError("CUDA headers (cuda_fp16.h) not found: pip install nvidia-cuda-runtime, "
                       "or set CUDA_HOME to a CUDA toolkit")


def compile_cubin(source: str, arch: str, prelude: str, options: Iterable[str] = ()) -> bytes:
    """Compile a kernel's source (after ``prelude``) to a cubin for ``arch`` with NVRTC.
    RuntimeError with NVRTC's log when it does not compile."""
    from cuda.core import Program

    program = Program(prelude + source, code_type="c++",
                      options=nvrtc_options(arch, options, cuda_include_dirs()))
    try:
        return bytes(program.compile("cubin").code)
    except Exception as exc:  # NVRTCError carries the compile log
        raise RuntimeError(f"NVRTC could not compile it for {arch}: {exc}") from None


# ----- launchers -----


def _launcher_globals() -> dict[str, Any]:
    return {"__name__": "launcher", "torch": torch, "np": np, "numpy": np, "math": math}


_IMMUTABLE = (int, float, complex, str, bytes, bool, type(None), torch.dtype, torch.device,
              torch.layout, torch.memory_format, type, types.ModuleType, np.generic)


def _immutable(value: Any) -> bool:
    if isinstance(value, (tuple, frozenset)):
        return all(_immutable(v) for v in value)
    if isinstance(value, types.FunctionType):
        defaults = (value.__defaults__ or ()) + tuple((value.__kwdefaults__ or {}).values())
        return all(_immutable(v) for v in defaults)
    return isinstance(value, _IMMUTABLE)


def load_launcher(source: str, name: str = "launcher.py") -> Callable[..., Any]:
    """The ``launch(kernels, *args, **kwargs)`` function of a launcher, with torch, np (numpy)
    and math in scope. A verified launcher was run as a fresh module on every call, so one that
    keeps anything mutable at module level (a list, a dict, a mutable default) is run that way
    here too; the others are executed once."""
    code = compile(source, name, "exec")
    scope = _launcher_globals()
    exec(code, scope)  # noqa: S102 - a verified launcher
    launch = scope.get("launch")
    if not callable(launch):
        raise ValueError(f"{name} defines no launch(kernels, *args) function")
    if all(_immutable(v) for k, v in scope.items() if k != "__builtins__"):
        return launch

    def fresh(kernels: Any, *args: Any, **kwargs: Any) -> Any:
        module = _launcher_globals()
        exec(code, module)  # noqa: S102 - a verified launcher
        return module["launch"](kernels, *args, **kwargs)

    return fresh


# ----- the table of kernels -----


@dataclass(eq=False)
class Entry:
    """One kernel for one exact op variant (``args``/``kwargs`` are its arg specs) on one
    device. ``launch(kernels, *args, **kwargs)`` returns what the op returns."""

    op: str
    args: list
    kwargs: dict
    launch: Callable[..., Any]
    kernels: Any
    device: torch.device
    label: str = ""
    key: str = ""  # the op card's key, for reports that join back to a session
    hits: int = 0
    fallbacks: int = 0  # calls of this variant that ran the original op anyway
    disabled: str = ""  # why the kernel is off for good, once it failed

    def __post_init__(self) -> None:
        if self.device.type == "cuda" and self.device.index is None:
            self.device = torch.device("cuda", torch.cuda.current_device())

    def run(self, args: tuple, kwargs: dict) -> Any:
        """The kernel's result, or _MISS when the original op must run instead."""
        if self.disabled or not _all_on(self.device, args, kwargs):
            self.fallbacks += 1
            return _MISS
        # launchers receive list arguments as tuples, as the evaluator passed them
        args = tuple(tuple(a) if type(a) is list else a for a in args)
        try:
            if self.device.type == "cuda" and torch.cuda.current_device() != self.device.index:
                with torch.cuda.device(self.device):  # as the op's own kernel would set it
                    result = self.launch(self.kernels, *args, **kwargs)
            else:
                result = self.launch(self.kernels, *args, **kwargs)
        except Exception as exc:  # any failure of the kernel: the original op takes over
            self.disable(f"{type(exc).__name__}: {exc}")
            self.fallbacks += 1
            return _MISS
        self.hits += 1
        return result

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
    first argument's shape and dtype so that most other calls skip the full encoding."""

    def __init__(self, func: Any) -> None:
        self.func = func
        self.variants: dict[Any, Entry] = {}
        self.quick: set[tuple] | None = set()
        self.misses = 0

    def add(self, entry: Entry) -> None:
        key = freeze([entry.args, entry.kwargs])
        if key in self.variants:
            raise ValueError(f"two kernels for one variant of {entry.op}")
        self.variants[key] = entry
        first = entry.args[0] if entry.args else None
        if self.quick is not None and isinstance(first, dict) and first.get("t") == "tensor" \
                and "stride" in first:
            self.quick.add((tuple(first["shape"]), getattr(torch, first["dtype"])))
        else:
            self.quick = None

    def run(self, args: tuple, kwargs: dict) -> Any:
        if self.quick is not None:
            first = args[0] if args else None
            if not isinstance(first, torch.Tensor) or (first.shape, first.dtype) not in self.quick:
                self.misses += 1
                return _MISS
        args_spec, kwargs_spec = encode_call(self.func, args, kwargs)
        entry = self.variants.get(freeze([args_spec, kwargs_spec]))
        if entry is None:
            self.misses += 1
            return _MISS
        return entry.run(args, kwargs)


def resolve_op(name: str) -> Any:
    """``"aten._softmax.default"`` -> ``torch.ops.aten._softmax.default``."""
    namespace, op_name, overload = name.split(".")
    return getattr(getattr(getattr(torch.ops, namespace), op_name), overload)


class KernelTable:
    """Kernels by op and exact variant, with their hit counts."""

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
            kernels=[KernelCount(e.label or e.op, e.op, e.key, e.hits, e.fallbacks, e.disabled)
                     for e in self.entries],
            misses={op: slot.misses for (op, _), slot in self._by_op.items()})

    def reset_counts(self) -> None:
        for entry in self.entries:
            entry.hits = entry.fallbacks = 0
        for slot in self._by_op.values():
            slot.misses = 0


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


# ----- the guard: torch.library kernels in front of the originals -----


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
    """The Python kernel registered for one (op, dispatch key): the active tables' kernels,
    else the original kernel."""

    def __init__(self, op: str, dispatch_key: str) -> None:
        get_kernel = getattr(torch.library, "get_kernel", None)
        if get_kernel is None:
            raise RuntimeError(f"patching needs torch >= 2.9 (torch.library.get_kernel); this "
                               f"is torch {torch.__version__}")
        self.func = resolve_op(op)
        self.tables: list[_OpEntries] = []
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
        for table in self.tables:
            result = table.run(args, kwargs)
            if result is not _MISS:
                return result
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

    def __enter__(self) -> Patch:
        self.install()
        return self

    def __exit__(self, *exc: object) -> None:
        self.remove()

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
            if not route.tables:
                route.close()
                del _routes[slot]
        self._attached.clear()

    def report(self) -> Report:
        report = self.table.report()
        return Report(report.kernels, report.misses, self.notes)
