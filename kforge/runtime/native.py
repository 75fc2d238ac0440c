"""The native guard from Python: build ``native_guard.cpp`` once per torch build, and describe
each kernel's exact variant to it as constants.

With the native guard a patched op's calls never enter Python: the dispatcher calls kforge's C++
kernel, which compares the call with its variants and launches a match's kernels itself, or runs
the op's own kernel. ``describe`` says which entries it can serve (a launch plan on a cubin, with
arguments it can compare); the others stay with the Python guard (``kforge.runtime.guard``).
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import warnings
from collections.abc import Sequence
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np
import torch

from kforge.core.argspec import bind, is_tensor_spec, list_items, resolve_op
from kforge.core.launch_plan import Pointer, Scalar
from kforge.runtime.cache import cache_dir

SOURCE = Path(__file__).with_name("native_guard.cpp")
ENV_DISABLE = "KFORGE_NATIVE_GUARD"  # "0": the Python guard serves every op
_ERROR_SIZE = 1024

# Argument kinds, parameter sources and return forms, numbered as native_guard.cpp reads them.
_NONE, _TENSOR, _INT, _DOUBLE, _BOOL, _INT_LIST, _TENSOR_LIST = range(7)
_WRAPPED_INT, _WRAPPED_DOUBLE, _WRAPPED_BOOL = 7, 8, 9
_SCALAR, _ARG, _OUTPUT, _SCRATCH = range(4)
_RETURNS = {"single": 0, "tuple": 1, "list": 2}
_NUMPY = {"i32": np.int32, "u32": np.uint32, "i64": np.int64, "u64": np.uint64,
          "f32": np.float32, "f64": np.float64, "bool": np.bool_}


class NativeUnavailable(Exception):
    """The native guard cannot be built or loaded here; the message says why."""


def enabled() -> bool:
    return os.environ.get(ENV_DISABLE, "1") != "0"


_build_lock = threading.Lock()


@cache
def library() -> ctypes.CDLL:
    """The built guard, compiled on first use into the cache (a few seconds, once per torch
    build and source); NativeUnavailable when it cannot be."""
    with _build_lock:
        target = _build(cache_dir() / "native")
    try:
        lib = ctypes.CDLL(str(target))
    except OSError as exc:
        raise NativeUnavailable(f"cannot load {target}: {exc}") from None
    _declare(lib)
    return lib


def available() -> str | None:
    """None when the native guard can serve here, else why not (once built, cheap)."""
    if not enabled():
        return f"{ENV_DISABLE}=0"
    try:
        library()
    except NativeUnavailable as exc:
        return str(exc)
    return None


def _build(folder: Path) -> Path:
    import torch.utils.cpp_extension as ext

    flags = ["-O2", "-std=c++20", "-shared", "-fPIC",
             f"-D_GLIBCXX_USE_CXX11_ABI={int(torch._C._GLIBCXX_USE_CXX11_ABI)}"]
    source = SOURCE.read_bytes()
    key = hashlib.sha256(b"\0".join([source, torch.__version__.encode(),
                                     str(torch.version.git_version).encode(),
                                     sys.version.encode(), " ".join(flags).encode()]))
    target = folder / f"guard-{key.hexdigest()[:16]}.so"
    if target.exists():
        return target
    compiler = os.environ.get("CXX") or shutil.which("c++") or shutil.which("g++")
    if compiler is None:
        raise NativeUnavailable("no C++ compiler (c++ or g++, or $CXX) to build it with")
    includes = [f"-I{path}" for path in ext.include_paths()]
    libraries = ext.library_paths()
    links = [*[f"-L{path}" for path in libraries], "-lc10", "-ltorch_cpu",
             *[f"-Wl,-rpath,{path}" for path in libraries], "-ldl"]
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=folder) as scratch:
            built = Path(scratch) / target.name
            result = subprocess.run([compiler, *flags, *includes, str(SOURCE), "-o", str(built),
                                     *links], capture_output=True, text=True, timeout=600)
            if result.returncode != 0:
                errors = [line for line in result.stderr.splitlines() if "error" in line]
                raise NativeUnavailable(f"{Path(compiler).name} failed: "
                                        f"{(errors or result.stderr.splitlines() or ['?'])[0]}")
            built.replace(target)  # atomic: a concurrent build finds the whole file or none
    except OSError as exc:
        raise NativeUnavailable(f"cannot build it in {folder}: {exc}") from None
    except subprocess.TimeoutExpired:
        raise NativeUnavailable("the C++ compiler took over 10 minutes") from None
    return target


def _declare(lib: ctypes.CDLL) -> None:
    p, i64, cstr, size = ctypes.c_void_p, ctypes.c_int64, ctypes.c_char_p, ctypes.c_size_t
    signatures = {
        "kforge_route_new": ([cstr, cstr, cstr, cstr, size], p),
        "kforge_route_free": ([p], None),
        "kforge_route_misses": ([p], i64),
        "kforge_route_reset": ([p], None),
        "kforge_route_set": ([p, ctypes.POINTER(p), i64], None),
        "kforge_variant_new": ([ctypes.POINTER(i64), i64, cstr, cstr, size], p),
        "kforge_variant_free": ([p], None),
        "kforge_variant_counts": ([p, ctypes.POINTER(i64), cstr, size], None),
        "kforge_variant_reset": ([p], None),
        "kforge_dtype_code": ([cstr], i64),
        "kforge_device_type_code": ([cstr], i64),
    }
    for name, (argtypes, restype) in signatures.items():
        function = getattr(lib, name)
        function.argtypes, function.restype = argtypes, restype


class NativeVariant:
    """One kernel for one exact variant, as the native guard holds it, with its counts. ``owner``
    (the entry's runner, with the loaded cubin) is kept alive as long as the variant: the guard
    holds raw driver handles of its kernels, which must not be unloaded while a route may launch
    them."""

    def __init__(self, words: Sequence[int], label: str, owner: Any = None) -> None:
        self._owner = owner
        lib = library()
        self._free = lib.kforge_variant_free
        data = (ctypes.c_int64 * max(len(words), 1))(*words)
        error = ctypes.create_string_buffer(_ERROR_SIZE)
        handle = lib.kforge_variant_new(data, len(words), label.encode(), error, _ERROR_SIZE)
        if not handle:
            raise ValueError(f"native guard refused the variant: {error.value.decode()}")
        self.handle = handle

    def counts(self) -> tuple[int, int, str]:
        """Hits, fallbacks, and why the kernel is off ("" while on)."""
        out = (ctypes.c_int64 * 3)()
        reason = ctypes.create_string_buffer(_ERROR_SIZE)
        library().kforge_variant_counts(self.handle, out, reason, _ERROR_SIZE)
        return out[0], out[1], reason.value.decode() if out[2] else ""

    def reset(self) -> None:
        library().kforge_variant_reset(self.handle)

    def __del__(self) -> None:
        if getattr(self, "handle", None):
            self._free(self.handle)


class NativeRoute:
    """The native guard in front of one aten op at one dispatch key, until ``close``."""

    def __init__(self, op: str, dispatch_key: str) -> None:
        namespace, name, overload = op.split(".")
        error = ctypes.create_string_buffer(_ERROR_SIZE)
        self.handle = library().kforge_route_new(
            f"{namespace}::{name}".encode(), ("" if overload == "default" else overload).encode(),
            dispatch_key.encode(), error, _ERROR_SIZE)
        if not self.handle:
            raise RuntimeError(f"cannot put the native guard in front of {op}: "
                               f"{error.value.decode()}")
        self._variants: list[NativeVariant] = []  # kept alive while the route holds them

    def set(self, variants: Sequence[NativeVariant]) -> None:
        self._variants = list(variants)
        handles = (ctypes.c_void_p * max(len(variants), 1))(*[v.handle for v in variants])
        library().kforge_route_set(self.handle, handles, len(variants))

    def misses(self) -> int:
        return library().kforge_route_misses(self.handle)

    def reset(self) -> None:
        library().kforge_route_reset(self.handle)

    def close(self) -> None:
        if self.handle:
            library().kforge_route_free(self.handle)
            self.handle = None


# ----- describing a variant -----


class _Unsupported(Exception):
    """What the native guard cannot compare or launch; the Python guard serves the op."""


def describe(op: str, args_spec: list, kwargs_spec: dict, plan: Any, functions: Any,
             device: torch.device) -> list[int]:
    """The int64 words describing one variant's kernel to the native guard: the expected
    arguments in schema order, the plan's outputs, scratch and launches (``functions(name,
    shared_mem)`` gives a kernel's driver address). _Unsupported when it cannot be described."""
    schema = resolve_op(op)._schema
    positions = {a.name: i for i, a in enumerate(schema.arguments)}
    types = {a.name: a.type for a in schema.arguments}
    words = [*_device_words(device)]
    bound = bind(op, args_spec, kwargs_spec)
    words.append(len(bound))
    for name, spec in bound.items():
        words += _argument_words(spec, types[name], device)
    words.append(len(plan.outputs))
    output_index = {o.name: i for i, o in enumerate(plan.outputs)}
    for output in plan.outputs:
        if output.kind == "arg":
            words += [1, positions[output.arg]]
        else:
            words += [0, _dtype_code(output.dtype), len(output.shape), *output.shape,
                      *output.stride]
    words.append(_RETURNS[plan.returns])
    words.append(len(plan.scratch))
    for scratch in plan.scratch:
        words += [scratch.nbytes, int(scratch.zero)]
    scratch_index = {s.name: i for i, s in enumerate(plan.scratch)}
    words.append(len(plan.launches))
    for launch in plan.launches:
        function = functions(launch.kernel, launch.shared_mem)
        unaligned = (functions(launch.unaligned_kernel, launch.shared_mem)
                     if launch.unaligned_kernel else 0)
        if function is None or unaligned is None:
            raise _Unsupported("a kernel handle cuLaunchKernel cannot take")
        words += [function, unaligned, launch.align or 0, *launch.grid, *launch.block,
                  launch.shared_mem, len(launch.params)]
        for param in launch.params:
            if isinstance(param, Scalar):
                words += [_SCALAR, _scalar_bits(param)]
            elif isinstance(param, Pointer) and param.source == "arg":
                words += [_ARG, positions[param.name],
                          -1 if param.index is None else param.index]
            elif isinstance(param, Pointer) and param.source == "output":
                words += [_OUTPUT, output_index[param.name], -1]
            else:
                words += [_SCRATCH, scratch_index[param.name], -1]
    return words


def _device_words(device: torch.device) -> list[int]:
    code = library().kforge_device_type_code(device.type.encode())
    if code < 0:
        raise _Unsupported(f"device type {device.type}")
    return [code, -1 if device.index is None else device.index]


def _dtype_code(name: str) -> int:
    code = library().kforge_dtype_code(name.encode())
    if code < 0:
        raise _Unsupported(f"dtype {name}")
    return code


def _tensor_words(spec: dict, device: torch.device) -> list[int]:
    if "stride" not in spec:
        raise _Unsupported(f"a tensor of layout {spec.get('layout')}")
    shape = list(spec["shape"])
    return [_dtype_code(spec["dtype"]), *_device_words(device), len(shape), *shape,
            *spec["stride"], int(spec.get("offset", 0))]


def _argument_words(spec: Any, kind: Any, device: torch.device) -> list[int]:
    if isinstance(kind, torch._C.OptionalType):
        kind = kind.getElementType()
    wants_tensor = isinstance(kind, torch._C.TensorType)
    if spec is None:
        return [_NONE]
    if is_tensor_spec(spec):
        return [_TENSOR, *_tensor_words(spec, device)]
    if isinstance(spec, bool):
        return [_WRAPPED_BOOL if wants_tensor else _BOOL, int(spec)]
    if isinstance(spec, int):
        return [_WRAPPED_INT if wants_tensor else _INT, spec]
    if isinstance(spec, float):
        bits = int(np.array(spec, dtype=np.float64).view(np.int64))
        return [_WRAPPED_DOUBLE if wants_tensor else _DOUBLE, bits]
    items = list_items(spec)
    if items is not None and all(type(i) is int for i in items) and not wants_tensor:
        return [_INT_LIST, len(items), *items]
    if items is not None and items and all(is_tensor_spec(i) for i in items):
        words = [_TENSOR_LIST, len(items)]
        for item in items:
            words += _tensor_words(item, device)
        return words
    if isinstance(spec, dict) and spec.get("t") == "dtype":
        return [_INT, _dtype_code(spec["v"])]
    raise _Unsupported(f"an argument {spec!r}")


def _scalar_bits(param: Scalar) -> int:
    raw = np.array(param.value, dtype=_NUMPY[param.ctype]).tobytes().ljust(8, b"\0")
    return int.from_bytes(raw, "little", signed=True)


def describable(entry: Any) -> bool:
    """Whether the entry's runner is a launch plan on a backend that gives driver addresses: the
    kind of kernel the native guard can run (before building the guard to ask more)."""
    plan = getattr(entry.runner, "plan", None)
    has_functions = hasattr(getattr(entry.runner, "backend", None), "function_address")
    return plan is not None and (has_functions or not plan.launches)


def variant_for(entry: Any) -> NativeVariant | None:
    """The native guard's copy of a table entry, made once and kept on the entry; None when the
    entry is not a launch plan the native guard can run (the Python guard serves it)."""
    if entry.native is not None:
        return entry.native
    if entry.disabled or not describable(entry):
        return None
    runner = entry.runner
    functions = getattr(runner.backend, "function_address", None)
    try:
        words = describe(entry.op, entry.args, entry.kwargs, runner.plan, functions,
                         entry.device)
        entry.native = NativeVariant(words, entry.label or entry.op, owner=runner)
    except _Unsupported:
        return None
    except ValueError as exc:  # a description the guard refuses: a bug here, not the user's
        warnings.warn(str(exc), RuntimeWarning, stacklevel=2)
        return None
    return entry.native
