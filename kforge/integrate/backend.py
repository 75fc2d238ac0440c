"""kforge as a ``torch.compile`` backend: Inductor compiles the model, and every op call whose
exact variant has a verified kernel calls that kernel instead.

    compiled = kforge.compile(model, 3, mode="max-autotune")      # session 3's winners
    compiled = torch.compile(model, backend=kforge.backend(3, mode="reduce-overhead"))

Each kernel becomes a ``torch.library`` custom op (``kforge::<op>_<n>``) whose inputs are the
tensors of its op call and whose fake implementation is the original op, so Inductor treats it as
an opaque call with known output shapes and strides, passes it inputs of exactly the traced
strides (``needs_exact_strides``) and can capture it in its CUDA graphs (it never syncs with the
host). The choice is made once, at compile time, while AOT autograd traces the graph: the
backend's decomposition table holds, for each op with kernels, a function that emits the kernel's
custom op where the call's variant (op, shapes, strides, storage offset, dtypes, scalar arguments,
bound to the op's schema) is one a kernel was verified on, and otherwise decomposes the op as
Inductor would (or leaves it to Inductor's lowering). Calls with symbolic sizes (dynamic shapes)
or on another device, and graphs that need gradients, keep Inductor's code. Everything else is
Inductor with the user's mode and options.

Bad input never stops compilation: an empty or unloadable table, a session from another GPU
architecture, kernels whose op cannot be a custom op, graphs on another device, failures inside
kforge's part: the model compiles with Inductor alone and one warning per cause says why.
"""

from __future__ import annotations

import functools
import logging
import os
import threading
import warnings
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch._inductor.custom_graph_pass import CustomGraphPass

from kforge.core.argspec import (
    ArgSpecError,
    bind,
    decode,
    encode_call,
    freeze,
    resolve_op,
    walk,
)
from kforge.errors import KforgeError
from kforge.runtime.guard import Patch
from kforge.runtime.regions import region_function, registered
from kforge.runtime.table import _MISS, Entry, KernelTable

log = logging.getLogger("kforge")

NAMESPACE = "kforge"
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
# Why a call of an op with kernels keeps Inductor's code (keys of CompileReport.kept)...
SYMBOLIC = "symbolic sizes (dynamic shapes)"
OTHER_DEVICE = "its tensors are on another device than the kernel"
OTHER_VARIANT = "no kernel for its exact variant"
# ... and why a whole graph does.
GRADIENTS = "it needs gradients, and kforge's kernels serve inference graphs"


class KforgeWarning(UserWarning):
    """kforge's kernels are not used where they could have been; the model still runs."""


# ----- kernels as custom ops -----


@dataclass(frozen=True)
class _Slot:
    """Where the i-th tensor input of a kernel's custom op goes in its op call."""

    index: int


def _fill(value: Any, tensors: tuple) -> Any:
    if type(value) is _Slot:
        return tensors[value.index]
    if type(value) is list:
        return [_fill(item, tensors) for item in value]
    return value


def tensor_paths(op: str, args: list | tuple, kwargs: dict) -> list[tuple[str, str]]:
    """``(argument name, path inside it)`` of every tensor of one call of ``op`` (values or arg
    specs), in schema order: the same list for every way of passing the same arguments."""
    found = []
    for name, value in bind(op, list(args), dict(kwargs)).items():
        for path, leaf in walk(value):
            if isinstance(leaf, torch.Tensor) or (isinstance(leaf, dict)
                                                  and leaf.get("t") == "tensor"):
                found.append((name, path))
    return found


def _tensors_at(op: str, args: tuple, kwargs: dict, paths: list[tuple[str, str]]) -> list:
    bound = bind(op, list(args), dict(kwargs))
    leaves = {(name, path): leaf for name, value in bound.items() for path, leaf in walk(value)}
    return [leaves[p] for p in paths]


class KernelOp:
    """One kernel table entry registered as the custom op ``kforge::<name>``: its inputs are the
    tensors of the entry's op call (in schema order), its other arguments are fixed as the
    variant has them; it returns what the op returns. At run time the entry's kernel runs; where
    the entry declines (switched off after a failure, a tensor elsewhere, an unexpected storage
    offset) the original op does."""

    def __init__(self, entry: Entry, name: str, library: torch.library.Library) -> None:
        self.entry = entry
        self.func = resolve_op(entry.op)
        self.paths = tensor_paths(entry.op, entry.args, entry.kwargs)
        positional = [a.name for a in self.func._schema.arguments]
        slots = {path: _Slot(i) for i, path in enumerate(self.paths)}
        self.args = [self._template(positional[i], spec, slots)
                     for i, spec in enumerate(entry.args)]
        self.kwargs = {key: self._template(key, spec, slots) for key, spec in entry.kwargs.items()}
        offsets = {(name, path): leaf.get("offset", 0)
                   for name, value in bind(entry.op, entry.args, entry.kwargs).items()
                   for path, leaf in walk(value) if isinstance(leaf, dict)}
        self.offsets = tuple(offsets[p] for p in self.paths)
        returns = len(self.func._schema.returns)
        result = "Tensor" if returns == 1 else f"({', '.join(['Tensor'] * returns)})"
        inputs = ", ".join(f"Tensor t{i}" for i in range(len(self.paths)))
        library.define(f"{name}({inputs}) -> {result}", tags=(torch.Tag.needs_exact_strides,))
        library.impl(name, self.run, "CompositeExplicitAutograd")
        torch.library.register_fake(f"{NAMESPACE}::{name}", self.fake, lib=library)
        self.name = name
        self.overload: torch._ops.OpOverload = getattr(getattr(torch.ops, NAMESPACE), name).default

    @staticmethod
    def _template(name: str, spec: Any, slots: dict[tuple[str, str], _Slot]) -> Any:
        leaves = iter([slots[(name, path)] for path, leaf in walk(spec)
                       if isinstance(leaf, dict) and leaf.get("t") == "tensor"])
        return decode(spec, lambda _: next(leaves), make_list=list)

    def call(self, tensors: tuple) -> tuple[list, dict]:
        """The entry's op call with ``tensors`` in its tensor slots."""
        return _fill(self.args, tensors), {k: _fill(v, tensors) for k, v in self.kwargs.items()}

    def run(self, *tensors: torch.Tensor) -> Any:
        args, kwargs = self.call(tensors)
        if all(t.storage_offset() == o for t, o in zip(tensors, self.offsets)):
            result = self.entry.run(tuple(args), kwargs)
            if result is not _MISS:
                return result
        else:
            self.entry.fallbacks += 1
        return self.func(*args, **kwargs)

    def fake(self, *tensors: torch.Tensor) -> Any:
        args, kwargs = self.call(tensors)
        return self.func(*args, **kwargs)


def unsupported(entry: Entry) -> str | None:
    """Why ``entry``'s op cannot be a kernel custom op, or None when it can."""
    try:
        func = resolve_op(entry.op)
    except ArgSpecError as exc:
        return str(exc)
    schema = func._schema
    if any(a.alias_info is not None for a in (*schema.arguments, *schema.returns)):
        return f"{entry.op} writes to or returns a view of its inputs"
    if not schema.returns or any(str(r.type) != "Tensor" for r in schema.returns):
        return f"{entry.op} returns {schema.returns or 'nothing'}, not tensors"
    try:
        paths = tensor_paths(entry.op, entry.args, entry.kwargs)
    except ArgSpecError as exc:
        return f"its arguments do not fit {entry.op} ({exc})"
    if not paths:
        return f"its call of {entry.op} has no tensor argument"
    return None


_lock = threading.Lock()
_registered: dict[int, KernelOp] = {}  # id(entry) -> its op; entries stay alive with their op
_library: torch.library.Library | None = None


def kernel_op(entry: Entry) -> KernelOp:
    """The custom op of ``entry``, registered once per process (compiled code may call it for as
    long as the process lives)."""
    global _library
    with _lock:
        op = _registered.get(id(entry))
        if op is None:
            if _library is None:
                _library = torch.library.Library(NAMESPACE, "FRAGMENT")
            short = entry.op.split(".")[1].strip("_") or "op"
            op = _registered[id(entry)] = KernelOp(entry, f"{short}_{len(_registered)}",
                                                   _library)
        return op


# ----- matching calls to kernels, at trace time -----


def variant_key(op: str, args: Any, kwargs: Any) -> Any:
    """The exact variant of one call (its arg specs), independent of how the arguments
    were passed (by position, by keyword, or left at their defaults)."""
    return freeze(bind(op, list(args), dict(kwargs)))


def _symbolic(value: Any) -> bool:
    if isinstance(value, torch.Tensor):
        return any(isinstance(s, torch.SymInt)
                   for s in (*value.shape, *value.stride(), value.storage_offset()))
    if isinstance(value, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        return True
    if isinstance(value, (list, tuple)):
        return any(_symbolic(v) for v in value)
    if isinstance(value, dict):
        return any(_symbolic(v) for v in value.values())
    return False


@dataclass
class GraphReport:
    """What kforge did in one compiled graph."""

    replaced: Counter[str] = field(default_factory=Counter)  # kernel label -> nodes
    kept: Counter[str] = field(default_factory=Counter)  # reason -> calls on Inductor's code
    unmatched_ops: Counter[str] = field(default_factory=Counter)  # op -> calls, no kernel's variant
    regions: Counter[str] = field(default_factory=Counter)  # region op -> chains found


@dataclass
class CompileReport:
    """What the backend did over every graph it compiled: nodes replaced per kernel, calls of
    ops with kernels left to Inductor and why, and notes (why kforge stood aside)."""

    graphs: int = 0
    replaced: Counter[str] = field(default_factory=Counter)
    kept: Counter[str] = field(default_factory=Counter)
    notes: list[str] = field(default_factory=list)

    @property
    def nodes(self) -> int:
        return sum(self.replaced.values())

    def add(self, graph: GraphReport) -> None:
        self.graphs += 1
        self.replaced.update(graph.replaced)
        self.kept.update(graph.kept)

    def __str__(self) -> str:
        head = f"kforge: {self.nodes} node(s) run a kforge kernel in {self.graphs} compiled graph(s)"
        lines = [head]
        lines += [f"  {label}: {n} node(s)" for label, n in sorted(self.replaced.items())]
        lines += [f"  kept on Inductor's code: {n} call(s), {why}"
                  for why, n in sorted(self.kept.items())]
        return "\n".join([*lines, *(f"note: {n}" for n in self.notes)])


class _CountKernels(CustomGraphPass):
    """Post-grad pass that counts the kernel custom ops that reached Inductor's graph."""

    def __init__(self, labels: dict[Any, str], graph: GraphReport) -> None:
        self.labels = labels
        self.graph = graph

    def __call__(self, graph: torch.fx.Graph) -> None:
        for node in graph.nodes:
            label = self.labels.get(node.target) if node.op == "call_function" else None
            if label is not None:
                self.graph.replaced[label] += 1

    def uuid(self) -> None:
        # None keeps Inductor's caches out: a cached graph would skip the kernels' choice and
        # call custom ops that only this process has registered.
        return None


def _inductor_wrapper(mode: str | None, options: dict | None, dynamic: bool | None) -> Any:
    """Inductor's own torch.compile backend for ``mode`` and ``options``: its config patches
    are what ``torch.compile(mode=..., options=...)`` would apply."""
    if mode is not None and mode not in COMPILE_MODES:
        raise KforgeError(f"unknown torch.compile mode {mode!r}: use one of "
                          f"{', '.join(COMPILE_MODES)}")
    wrapper = getattr(torch, "_TorchCompileInductorWrapper", None)
    if wrapper is None:
        raise KforgeError(f"kforge's compile backend needs torch >= 2.9; this is torch "
                          f"{torch.__version__}")
    try:
        return wrapper(mode, options, dynamic)
    except RuntimeError as exc:
        raise KforgeError(f"bad Inductor options: {exc}") from None


class Backend:
    """A ``torch.compile`` backend: Inductor with ``mode`` and ``options``, and the table's
    kernels for the exact op variants they were verified on. ``report`` says what was replaced."""

    compiler_name = "kforge"

    def __init__(self, table: KernelTable, *, mode: str | None = None,
                 options: dict | None = None, dynamic: bool | None = None,
                 notes: Iterable[str] = ()) -> None:
        self.inductor = _inductor_wrapper(mode, options, dynamic)
        self.mode = mode or "default"
        self.table = table
        self.report = CompileReport(notes=list(notes))
        self._warned: set[str] = set()
        self.kernels: dict[tuple[str, Any], list[KernelOp]] = {}
        skipped = []
        for entry in table.entries:
            why = unsupported(entry)
            try:
                op = kernel_op(entry) if why is None else None
            except (ArgSpecError, RuntimeError) as exc:  # an argument that cannot be rebuilt
                op, why = None, f"its call cannot be rebuilt ({_first_line(exc)})"
            if op is None:
                skipped.append(f"{entry.label or entry.op}: {why}")
                continue
            key = (entry.op, variant_key(entry.op, entry.args, entry.kwargs))
            self.kernels.setdefault(key, []).append(op)
        self.ops = {resolve_op(op): op for op, _ in self.kernels}
        # fusion regions with kernels: their chains are found in each graph (kforge.integrate.
        # fusion) and called as the region's operator, which a kernel then serves
        self.regions = {op: region for op, _ in self.kernels
                        if (region := registered(op)) is not None}
        self.labels = {k.overload: k.entry.label or k.entry.op
                       for ops in self.kernels.values() for k in ops}
        if skipped:
            self.report.notes += skipped
            self.warn("unsupported", "kforge kernels that cannot be called from compiled code "
                                     "stay out: " + "; ".join(skipped))
        if not self.kernels:
            why = "; ".join(self.report.notes) or "the kernel table is empty"
            self.warn("empty", f"kforge has no kernel to put in compiled graphs ({why}): "
                               "Inductor alone compiles the model")

    def warn(self, kind: str, message: str) -> None:
        """One warning per cause and backend."""
        if kind not in self._warned:
            self._warned.add(kind)
            warnings.warn(message, KforgeWarning, stacklevel=3)

    def __call__(self, gm: torch.fx.GraphModule, example_inputs: list) -> Any:
        from torch._inductor.compile_fx import compile_fx

        if not self.kernels:
            return compile_fx(gm, example_inputs, config_patches=self.inductor.config)
        if torch.is_grad_enabled() and any(
                isinstance(t, torch.Tensor) and t.requires_grad
                for t in (*example_inputs, *gm.parameters())):
            # AOT autograd traces a joint forward and backward graph: no kernel has a backward
            self.warn(GRADIENTS, f"kforge's kernels are not used in a compiled graph: {GRADIENTS} "
                                 "(run the model under torch.no_grad() or "
                                 "torch.inference_mode()); Inductor alone compiles it")
            self.report.notes.append(f"a graph compiled without kforge: {GRADIENTS}")
            return compile_fx(gm, example_inputs, config_patches=self.inductor.config)
        graph = GraphReport()
        traced = self._with_regions(gm, example_inputs, graph) if self.regions else gm
        patches = dict(self.inductor.config)
        user_passes = patches.get("post_grad_custom_pre_pass")
        counter = _CountKernels(self.labels, graph)
        patches["post_grad_custom_pre_pass"] = (
            [counter, *(user_passes if isinstance(user_passes, (list, tuple)) else [user_passes])]
            if user_passes is not None else counter)
        try:
            compiled = compile_fx(traced, example_inputs, config_patches=patches,
                                  decompositions=self._decompositions(patches, graph))
        except torch._dynamo.exc.TorchDynamoException:
            raise  # Dynamo's own signals (restart the analysis, skip the frame) pass through
        except Exception as exc:  # kforge's part failed on this graph: Inductor takes it whole
            self.warn("failed", f"kforge's kernels are left out of a graph that failed to compile "
                                f"with them ({type(exc).__name__}: {_first_line(exc)}): Inductor "
                                "alone compiles it")
            self.report.notes.append(f"a graph compiled without kforge: {_first_line(exc)}")
            return compile_fx(gm, example_inputs, config_patches=self.inductor.config)
        self.report.add(graph)
        self._explain(graph)
        log.info("kforge: graph %d: %s", self.report.graphs,
                 ", ".join(f"{label} x{n}" for label, n in graph.replaced.items()) or
                 "no kernel applies")
        return compiled

    def _with_regions(self, gm: torch.fx.GraphModule, example_inputs: list,
                      graph: GraphReport) -> torch.fx.GraphModule:
        """``gm`` as aten calls with every chain of a region that has kernels called as the
        region's operator; ``gm`` itself where none is found or it cannot be traced."""
        from kforge.integrate.fusion import aten_graph, replace

        if _symbolic(list(example_inputs)):
            return gm
        try:
            traced = aten_graph(gm, example_inputs)
            for op, region in self.regions.items():
                variants = [k.entry.args for (name, _), kernels in self.kernels.items()
                            if name == op for k in kernels]
                graph.regions[op] += replace(traced, region, resolve_op(op), variants)
        except Exception as exc:  # a graph make_fx cannot trace: the ops' own kernels still apply
            self.warn("regions", f"kforge's region kernels are left out of a graph whose chains "
                                 f"could not be found ({type(exc).__name__}: "
                                 f"{_first_line(exc)})")
            return gm
        return traced if graph.regions.total() else gm

    def _decompositions(self, patches: dict, graph: GraphReport) -> dict:
        from torch._inductor import config
        from torch._inductor.decomposition import select_decomp_table

        with config.patch(patches):
            table = dict(select_decomp_table())
        for func, op in self.ops.items():
            region = self.regions.get(op)
            # a region call no kernel serves becomes its chain of aten calls again, for
            # Inductor to fuse as it would have
            otherwise = region_function(region) if region is not None else table.get(func)
            table[func] = functools.partial(self._decompose, func, otherwise, graph)
        return table

    def _decompose(self, func: Any, inductor: Callable | None, graph: GraphReport, *args: Any,
                   **kwargs: Any) -> Any:
        """Emit a kernel for a call of ``func`` of a variant one was verified on; else what
        Inductor does with the op (its decomposition, or its lowering after NotImplemented)."""
        kernel = self._kernel_for(func, args, kwargs, graph)
        if kernel is not None:
            return kernel.overload(*_tensors_at(kernel.entry.op, args, kwargs, kernel.paths))
        return NotImplemented if inductor is None else inductor(*args, **kwargs)

    def _kernel_for(self, func: Any, args: tuple, kwargs: dict,
                    graph: GraphReport) -> KernelOp | None:
        op = self.ops[func]
        if _symbolic((args, kwargs)):
            graph.kept[SYMBOLIC] += 1
            return None
        candidates = self.kernels.get((op, variant_key(op, *encode_call(func, args, kwargs))))
        if candidates is None:
            graph.kept[OTHER_VARIANT] += 1
            graph.unmatched_ops[op] += 1
            return None
        tensors = [v for _, v in walk([list(args), list(kwargs.values())])
                   if isinstance(v, torch.Tensor)]
        for kernel in candidates:
            if all(t.device == kernel.entry.device for t in tensors):
                return kernel
        graph.kept[OTHER_DEVICE] += 1
        return None

    def _explain(self, graph: GraphReport) -> None:
        """Warn once per cause where a graph calls ops with kernels and none of them ran."""
        if graph.replaced:
            return
        for why in (SYMBOLIC, OTHER_DEVICE):
            if graph.kept[why]:
                self.warn(why, f"kforge's kernels are not used in a compiled graph: "
                               f"{graph.kept[why]} call(s) of ops with kernels: {why}; "
                               "Inductor's code runs for them")
                return
        if graph.unmatched_ops:
            calls = ", ".join(f"{op} x{n}" for op, n in sorted(graph.unmatched_ops.items()))
            self.warn("variant", f"kforge's kernels are not used in a compiled graph: it calls "
                                 f"{calls}, never with a variant a kernel was verified on (do the "
                                 "model and its inputs differ from the profiled ones?)")
        elif self.regions and not graph.regions.total():
            self.warn("no regions", f"kforge's region kernels are not used in a compiled graph: "
                                    f"none of the {len(self.regions)} region(s) with kernels has "
                                    "its chain of calls there at a variant a kernel won on "
                                    "(other shapes, code that differs from the profiled model, "
                                    "or an intermediate result used elsewhere)")

    def reset(self) -> None:
        self.inductor.reset()

    def get_compiler_config(self) -> Any:
        return self.inductor.get_compiler_config()


def _first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return lines[0][:300] if lines else type(exc).__name__


def backend(source: int | KernelTable | Patch, *, mode: str | None = None,
            options: dict | None = None, dynamic: bool | None = None,
            db: str | os.PathLike[str] | None = None,
            device: str | torch.device | None = None) -> Backend:
    """A ``torch.compile`` backend running Inductor (``mode``, ``options`` as for
    ``torch.compile``) with kforge's kernels: those of session ``source`` (loaded on ``device``
    from database ``db``), or of a ``KernelTable`` or ``Patch``. A session that cannot be loaded
    here (no GPU, another GPU architecture) leaves Inductor alone, with a warning."""
    notes: list[str] = []
    if isinstance(source, Patch):
        table, notes = source.table, list(source.notes)
    elif isinstance(source, KernelTable):
        table = source
    else:
        from kforge.integrate.patching import patch

        try:
            # every winner: compiled code calls a kernel only for its exact variant, with no
            # guard in front of the op's other calls
            table = patch(source, db=db, device=device, cuda_graphs=True).table
        except KforgeError as exc:
            table, notes = KernelTable(), [str(exc)]
    return Backend(table, mode=mode, options=options, dynamic=dynamic, notes=notes)


def compile(model: Any, source: int | KernelTable | Patch, *, mode: str | None = None,
            options: dict | None = None, dynamic: bool | None = None, fullgraph: bool = False,
            db: str | os.PathLike[str] | None = None,
            device: str | torch.device | None = None, example_inputs: Any = None,
            example_kwargs: dict | None = None) -> Any:
    """``torch.compile(model, backend=kforge.backend(source, ...))``; the backend, with its
    ``report``, is the compiled model's ``kforge_backend`` attribute. With ``example_inputs`` (a
    tensor or a tuple of arguments) and a session as ``source``, only the session's kernels that
    make the compiled model faster on them are used, by measurement
    (``kforge.integrate.measure.choose_compiled``)."""
    if example_inputs is not None:
        source = _measured_choice(model, source, example_inputs, example_kwargs, db, device)
    chosen = backend(source, mode=mode, options=options, dynamic=dynamic, db=db, device=device)
    compiled = torch.compile(model, backend=chosen, dynamic=dynamic, fullgraph=fullgraph)
    compiled.kforge_backend = chosen
    return compiled


def _measured_choice(model: Any, source: int | KernelTable | Patch, example_inputs: Any,
                     example_kwargs: dict | None, db: str | os.PathLike[str] | None,
                     device: str | torch.device | None) -> KernelTable:
    from kforge.integrate.measure import choose_compiled, loaded_forward
    from kforge.integrate.patching import SessionPatch, patch

    if isinstance(source, int):
        source = patch(source, db=db, device=device, cuda_graphs=True)
    if not isinstance(source, SessionPatch):
        raise KforgeError("kforge.compile(..., example_inputs=...) chooses among a session's "
                          "kernels: pass the session id (or its kforge.patch)")
    args = example_inputs if isinstance(example_inputs, tuple) else (example_inputs,)
    with torch.no_grad():
        chosen, _ = choose_compiled(loaded_forward(model, args, example_kwargs), source)
    return chosen
