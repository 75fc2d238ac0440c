"""Capture a model's forward as a CUDA graph, and serve it to callers with static shapes.

``capture`` records one forward (warmed up on a side stream first, as capture needs) and returns
the graph with the tensors it reads and writes, kept alive for its replays. ``StaticForward`` is
the user-facing form (``kforge.accelerate``): each call copies the new inputs into the captured
ones, replays the graph and returns the outputs. What cannot be captured is refused with one
message naming why: tensors on the CPU, a forward that synchronizes with the host, calls with
other shapes or other fixed arguments than the captured ones.
"""

from __future__ import annotations

import contextlib
import gc
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch.utils import _pytree as pytree

from kforge.capture.loader import first_line
from kforge.errors import KforgeError

HOST_SYNC_HINT = ("a forward replayed as a CUDA graph must not synchronize with the host "
                  "(.item(), .cpu(), .tolist(), printing a tensor, data-dependent shapes such as "
                  "nonzero or boolean masks) nor copy CPU tensors to the GPU")


@dataclass
class Captured:
    """A captured forward: ``replay()`` reruns it on the captured tensors, writing ``outputs``."""

    graph: torch.cuda.CUDAGraph
    outputs: Any
    keep: Any  # what the graph reads, alive while it replays
    setup_s: float

    def replay(self) -> Any:
        self.graph.replay()
        return self.outputs


def capture(step: Callable[[], Any], device: torch.device, *,
            prepare: Callable[[], Any] = lambda: None,
            scope: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext,
            warmup: int = 2) -> Captured:
    """Capture one call of ``step`` (after ``warmup`` calls on a side stream), with ``scope``
    active throughout (a kforge patch: its kernels are then part of the graph). ``prepare`` runs
    before every call (per-step state); what it returns before the captured call is kept alive
    for the graph's replays. A step that cannot be captured raises KforgeError saying why."""
    start = time.perf_counter()
    side = torch.cuda.Stream(device)
    try:
        with gc_paused(), scope():
            # Warm-up calls may synchronize (lazy initialization; libraries such as transformers
            # check values on the host unless a stream is capturing): only the captured call may
            # not.
            for _ in range(warmup):
                prepare()
                side.wait_stream(torch.cuda.current_stream(device))
                with torch.cuda.stream(side):
                    step()
                torch.cuda.current_stream(device).wait_stream(side)
            keep = prepare()
            graph = torch.cuda.CUDAGraph()
            with own_cublas_workspace(), torch.cuda.graph(graph):
                # Armed inside the capture (capture_begin itself synchronizes): a synchronizing
                # call raises before it reaches the driver, so the capture ends cleanly and later
                # graphs' memory stays sound.
                with no_host_sync():
                    outputs = step()
        graph.replay()
        torch.cuda.synchronize(device)
    except KforgeError:
        raise
    except Exception as exc:  # whatever stopped the capture, named in one line
        where = innermost_frame(exc)
        raise KforgeError(f"the forward cannot be captured as a CUDA graph: "
                          f"{type(exc).__name__}: {first_line(exc)}"
                          f"{f' (at {where})' if where else ''} ({HOST_SYNC_HINT})") from None
    return Captured(graph, outputs, keep, time.perf_counter() - start)


@contextlib.contextmanager
def gc_paused():
    """Python's cyclic garbage collector run once now, then held off until the block ends.

    Garbage can own CUDA resources whose finalizers call the driver: a Triton kernel Inductor let
    go (an autotuner's losing configurations, dropped at a compiled model's first call) unloads
    its module when collected (``cuModuleUnload``), a dropped ``CUDAGraph`` destroys its
    executable, a dropped cubin unloads its library. Run in the middle of a CUDA graph capture
    (torch >= 2.9 no longer collects before one), such a call is not permitted while a stream
    captures and invalidates the capture; a capture that fails part-way leaves the allocator
    serving memory from the failed graph's pool, and later kernels fault on it (``unspecified
    launch failure``). So every capture kforge makes or sets off
    (``capture``; the first calls and timed calls of a compiled model whose mode records
    Inductor's CUDA graphs) runs with collection paused, after collecting what is garbage
    already. Nested uses collect once, at the outermost."""
    enabled = gc.isenabled()
    if enabled:
        gc.collect()
        gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


@contextlib.contextmanager
def own_cublas_workspace():
    """cuBLAS's workspace made afresh for a capture, inside the graph's own memory pool.

    PyTorch keeps one cuBLAS workspace per stream and reuses it: a graph captured on a stream
    that has one bakes in its address, though another owns it (an earlier graph's pool, where the
    first capture on that stream made it). Code that clears the workspaces (torch.compile's
    CUDA graphs do, around every warm-up and recording) then frees memory the graph still writes
    to on every replay; once that pool is released, the replay faults (``unspecified launch
    failure``). Cleared before the capture, the workspace the graph needs is made during the
    capture, in its own pool, which lives as long as the graph; cleared after it, no later
    capture can take it over."""
    clear_cublas_workspaces()
    try:
        yield
    finally:
        clear_cublas_workspaces()


def clear_cublas_workspaces() -> None:
    torch._C._cuda_clearCublasWorkspaces()


def no_host_sync() -> contextlib.AbstractContextManager:
    """Make any synchronizing CUDA call an error."""
    return sync_debug_mode("error")


@contextlib.contextmanager
def sync_debug_mode(mode: str):
    """``torch.cuda.set_sync_debug_mode(mode)`` for the block, the previous mode after it."""
    previous = torch.cuda.get_sync_debug_mode()
    torch.cuda.set_sync_debug_mode(mode)
    try:
        yield
    finally:
        torch.cuda.set_sync_debug_mode(previous)


def host_syncs(step: Callable[[], Any]) -> list[str]:
    """Where one call of ``step`` synchronizes with the host: each place once, in order, as
    ``package/module.py:line``."""
    places: list[str] = []
    with warnings.catch_warnings(record=True) as caught, sync_debug_mode("warn"):
        warnings.simplefilter("always")
        step()
    for w in caught:
        place = f"{short_path(w.filename)}:{w.lineno}"
        if SYNC_WARNING in str(w.message) and place not in places:
            places.append(place)
    return places


SYNC_WARNING = "called a synchronizing CUDA operation"  # torch's words, warning or error


def innermost_frame(exc: BaseException) -> str:
    """The innermost Python frame ``exc`` passed through, as ``package/module.py:line``."""
    tb = exc.__traceback__
    if tb is None:
        return ""
    while tb.tb_next is not None:
        tb = tb.tb_next
    return f"{short_path(tb.tb_frame.f_code.co_filename)}:{tb.tb_lineno}"


def short_path(filename: str) -> str:
    """A source file as its package names it (``transformers/masking_utils.py``), or its last
    two path parts."""
    path = Path(filename)
    for marker in ("site-packages", "dist-packages"):
        if marker in path.parts:
            return "/".join(path.parts[path.parts.index(marker) + 1:])
    return "/".join(path.parts[-2:])


def describe(t: torch.Tensor) -> str:
    """``float16[2, 4, 64] on cuda:0``."""
    return f"{str(t.dtype).removeprefix('torch.')}{list(t.shape)} on {t.device}"


def _where(path: Any) -> str:
    """A pytree key path as the caller wrote it: ``input 0``, ``input 1[2]``, ``argument
    'mask'``."""
    text = pytree.keystr(path)  # "[0][0]" for args, "[1]['mask']" for kwargs
    kind, rest = text[:3], text[3:]
    if kind == "[0]":
        index, _, tail = rest[1:].partition("]")
        return f"input {index}{tail}"
    name, _, tail = rest[2:].partition("']")
    return f"argument {name!r}{tail}"


def cuda_device_of(model: Any, args: tuple, kwargs: dict) -> torch.device:
    """The one CUDA device a model and its inputs are on; KforgeError naming the first tensor
    that is elsewhere (a CUDA graph replays GPU work only)."""
    if not torch.cuda.is_available():
        raise KforgeError("CUDA graphs need a CUDA GPU and this torch sees none")
    found: list[tuple[str, torch.Tensor]] = []
    for path, leaf in pytree.tree_flatten_with_path((args, kwargs))[0]:
        if isinstance(leaf, torch.Tensor):
            found.append((_where(path), leaf))
    if isinstance(model, torch.nn.Module):
        found += [(f"parameter {n!r}", p) for n, p in model.named_parameters()]
        found += [(f"buffer {n!r}", b) for n, b in model.named_buffers()]
    if not found:
        raise KforgeError("the forward has no tensor input or parameter to tell its device")
    device = next((t.device for _, t in found if t.device.type == "cuda"), None)
    for where, t in found:
        if device is None or t.device != device:
            raise KforgeError(f"{where} is a {describe(t)}: a CUDA graph replays GPU work only "
                              f"(move the model and its inputs to {device or 'the GPU'})")
    assert device is not None
    return device


class StaticForward:
    """``forward(*args, **kwargs)`` captured once as a CUDA graph for the example inputs' shapes,
    dtypes and devices; each call copies its tensors into the captured ones and replays."""

    def __init__(self, forward: Callable[..., Any], args: tuple, kwargs: dict | None = None, *,
                 scope: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext,
                 clone_outputs: bool = True, warmup: int = 2) -> None:
        kwargs = kwargs or {}
        self.device = cuda_device_of(forward, args, kwargs)
        leaves, self.spec = pytree.tree_flatten((args, kwargs))
        self.paths = [p for p, _ in pytree.tree_flatten_with_path((args, kwargs))[0]]
        self.static = [leaf.detach().clone() if isinstance(leaf, torch.Tensor) else leaf
                       for leaf in leaves]
        static_args, static_kwargs = pytree.tree_unflatten(self.static, self.spec)
        self.clone_outputs = clone_outputs

        def step() -> Any:
            with torch.no_grad():
                return forward(*static_args, **static_kwargs)

        self.step = step  # one uncaptured forward on the captured inputs
        self.captured = capture(step, self.device, prepare=lambda: self.static, scope=scope,
                                warmup=warmup)

    def _load(self, args: tuple, kwargs: dict) -> None:
        leaves, spec = pytree.tree_flatten((args, kwargs))
        if spec != self.spec:
            raise KforgeError("the call's arguments are not structured as the captured ones "
                              "(a CUDA graph replays one fixed call)")
        for path, new, old in zip(self.paths, leaves, self.static, strict=True):
            if isinstance(old, torch.Tensor):
                if not isinstance(new, torch.Tensor) or (
                        new.shape, new.dtype, new.device) != (old.shape, old.dtype, old.device):
                    got = describe(new) if isinstance(new, torch.Tensor) else repr(new)
                    raise KforgeError(
                        f"{_where(path)} was captured as {describe(old)} and is now {got}: a "
                        "CUDA graph replays fixed shapes (capture once per shape, or use "
                        "kforge.compile with dynamic shapes)")
                old.copy_(new)
            elif new != old:
                raise KforgeError(f"{_where(path)} was {old!r} when captured and is now {new!r}: "
                                  "a CUDA graph replays the values it was captured with")

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        self._load(args, kwargs)
        outputs = self.captured.replay()
        if not self.clone_outputs:
            return outputs
        return pytree.tree_map_only(torch.Tensor, torch.Tensor.clone, outputs)
