"""kforge as a ``torch.compile`` backend: Inductor compiles the model, and where an op call (or a
fusion region's chain of calls) has the exact variant a verified kernel won on, that call becomes
the kernel.

    compiled = torch.compile(model, backend=kforge.backend(table, mode="reduce-overhead"))

This module puts a given kernel table into Inductor's graphs; which kernels are worth it in a
model is decided elsewhere (``kforge.integrate.decide``), by measurement in the user's mode.

Each kernel becomes an operator ``kforge::<op>_<digest>`` defined with ``torch.library``
(``define`` + ``impl``: one dispatcher boundary per call, no Python custom-op wrapper), whose
inputs are the tensors of its op call and whose fake implementation is the original op. Kernels
enter through Inductor's pattern matcher (as vLLM's fusions do): for each kernel the op call, or
the region's chain of aten calls, is traced the way Inductor's decompositions write it
(``fwd_only``) and registered with ``register_replacement`` in a ``PatternMatcherPass`` that runs as
Inductor's post-grad custom pass, after Inductor's own rewrites. Only a matched call or chain whose
inputs have exactly the kernel's variant (shapes, strides, storage offset, dtypes, scalars,
device) becomes the kernel; everything around it stays aten for Inductor to fuse. The pass is a
``CustomGraphPass`` whose ``uuid()`` hashes the kernel table and this module, so Inductor's FX
graph cache keeps working. The operators are tagged ``needs_exact_strides`` (Inductor hands them
the traced strides) and never sync with the host, so CUDA graph trees capture them.

Calls with symbolic sizes (dynamic shapes) or on another device, and graphs that need gradients,
keep Inductor's code. Bad input never stops compilation: an empty or unloadable table, kernels
whose op cannot be an operator, failures inside kforge's part: the model compiles with Inductor
alone and one warning per cause says why.
"""

from __future__ import annotations

import hashlib
import inspect
import logging
import threading
import warnings
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch._inductor.custom_graph_pass import CustomGraphPass

from kforge.core.argspec import (
    ArgSpecError,
    bind,
    checked_op,
    decode,
    decode_call,
    encode_value,
    freeze,
    is_tensor_spec,
    resolve_op,
    torch_dtype,
    walk,
)
from kforge.errors import KforgeError
from kforge.runtime import regions as _regions
from kforge.runtime.regions import region_function, registered
from kforge.runtime.table import _MISS, Entry, KernelTable

log = logging.getLogger("kforge")

NAMESPACE = "kforge"
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
# Ops Inductor runs as library calls or autotuned templates rather than fusing them
EXTERN_OPS = frozenset({"mm", "bmm", "addmm", "baddbmm", "addbmm", "convolution", "_int_mm",
                        "_scaled_mm", "_convolution"})
# Why a call that has the structure of a kernel's call keeps Inductor's code (CompileReport.kept)
SYMBOLIC = "symbolic sizes (dynamic shapes)"
OTHER_DEVICE = "its tensors are on another device than the kernel"
OTHER_VARIANT = "no kernel for its exact variant"
# Inductor hands an operator tagged needs_exact_strides a buffer of the traced strides, made
# afresh: a view's storage offset is not kept, so the call would reach another variant.
VIEW_OFFSET = "an input is a view into a larger tensor, which Inductor hands over as a copy"
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


class KernelOp:
    """One kernel table entry defined as the operator ``kforge::<name>``: its inputs are the
    tensors of the entry's op call (in schema order), its other arguments are fixed as the
    variant has them; it returns what the op returns. At run time the entry's kernel runs; where
    the entry declines (switched off after a failure, a tensor elsewhere or of another shape,
    dtype, stride or storage offset than the variant's) the original op does. ``specs``: the
    variant's tensor arg specs, in input order."""

    def __init__(self, entry: Entry, name: str, library: torch.library.Library) -> None:
        self.entry = entry
        self.earlier: list[Entry] = []  # entries it ran before this one, kept loaded
        # What the entry's call runs as (a checked twin takes the same arguments, first).
        self.func = checked_op(entry.op)
        self.paths = tensor_paths(entry.op, entry.args, entry.kwargs)
        positional = [a.name for a in self.func._schema.arguments]
        slots = {path: _Slot(i) for i, path in enumerate(self.paths)}
        # The call's tensors in the order it passes them, each the slot of its place in schema
        # order; its other arguments as data holds them, run on the kernel's device.
        passed = [*zip(positional, entry.args), *entry.kwargs.items()]
        order = iter([slots[(name, path)] for name, spec in passed
                      for path, leaf in walk(spec) if is_tensor_spec(leaf)])
        self.args, self.kwargs = decode_call(entry.op, entry.args, entry.kwargs,
                                             lambda _: next(order), entry.device, make_list=list)
        self.layouts = tuple(_layout(leaf) for leaf in _leaves_at(entry, self.paths))
        returns = len(self.func._schema.returns)
        result = "Tensor" if returns == 1 else f"({', '.join(['Tensor'] * returns)})"
        inputs = ", ".join(f"Tensor t{i}" for i in range(len(self.paths)))
        library.define(f"{name}({inputs}) -> {result}", tags=(torch.Tag.needs_exact_strides,))
        library.impl(name, self.run, "CompositeExplicitAutograd")
        torch.library.register_fake(f"{NAMESPACE}::{name}", self.fake, lib=library)
        self.name = name
        self.overload: torch._ops.OpOverload = getattr(getattr(torch.ops, NAMESPACE), name).default
        self.label = entry.label or entry.op
        self.specs = tuple(freeze(leaf) for leaf in _leaves_at(entry, self.paths))

    def call(self, tensors: tuple) -> tuple[list, dict]:
        """The entry's op call with ``tensors`` in its tensor slots."""
        return _fill(self.args, tensors), {k: _fill(v, tensors) for k, v in self.kwargs.items()}

    def search(self) -> Callable[..., Any]:
        """The kernel's op call (a region: its chain of aten calls) as a function of the
        tensors, for the pattern matcher to trace."""
        region = registered(self.entry.op)
        if region is not None:
            return region_function(region)
        return self.fake

    def example_inputs(self) -> list[torch.Tensor]:
        """Tensors of the kernel's variant, to trace its call on: on the kernel's device (some
        decompositions differ by device), or without data where that device is not here. The
        pattern matcher traces with real tensors, running the op on them: they hold zeros, so
        that an index op (an embedding, a gather) reads in bounds, as it would not on
        uninitialized memory."""
        device = self.entry.device
        if device.type == "cuda" and not torch.cuda.is_available():
            device = torch.device("meta")
        return [torch.empty_strided(leaf["shape"], leaf["stride"], device=device,
                                    dtype=torch_dtype(leaf["dtype"])).zero_()
                for leaf in _leaves_at(self.entry, self.paths)]

    def run(self, *tensors: torch.Tensor) -> Any:
        """The kernel's result where every tensor has the variant's layout (the plan's constants
        are that variant's: another shape, stride or offset would have it read and write out of
        place), else the original op's. Inductor hands the traced layouts over
        (``needs_exact_strides``); this holds should it not."""
        args, kwargs = self.call(tensors)
        if all(_has_layout(t, layout) for t, layout in zip(tensors, self.layouts)):
            result = self.entry.run(tuple(args), kwargs)
            if result is not _MISS:
                return result
        else:
            self.entry.fallbacks += 1
        return self.func(*args, **kwargs)

    def fake(self, *tensors: torch.Tensor) -> Any:
        args, kwargs = self.call(tensors)
        return self.func(*args, **kwargs)


def _layout(spec: dict) -> tuple:
    """What a call's tensor must match for a kernel made for ``spec``: shape, dtype, storage
    offset and the strides of its dimensions longer than one (a stride along a dimension of size
    one addresses nothing; Inductor does not keep it)."""
    if "stride" not in spec:
        raise ArgSpecError(f"a tensor of layout {spec.get('layout')} cannot be a kernel's input")
    shape = tuple(spec["shape"])
    strides = tuple((i, s) for i, (n, s) in enumerate(zip(shape, spec["stride"])) if n != 1)
    return shape, torch_dtype(spec["dtype"]), int(spec.get("offset", 0)), strides


def _has_layout(t: torch.Tensor, layout: tuple) -> bool:
    shape, dtype, offset, strides = layout
    if t.shape != shape or t.dtype != dtype or t.storage_offset() != offset \
            or t.layout is not torch.strided:
        return False
    stride = t.stride()
    return all(stride[i] == s for i, s in strides)


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


def output_mismatch(entry: Entry) -> str | None:
    """Why the outputs the kernel's launch plan makes are not what compiled code takes its
    operator to return, or None. Inductor plans every buffer after the operator's fake outputs
    (the original op's shapes, dtypes and strides) and reuses or reinterprets them so; an output
    laid out otherwise is read and written out of place, and an output that is one of the inputs
    is an alias the operator's schema does not declare. A runner without a plan (a stand-in)
    passes."""
    plan = getattr(entry.runner, "plan", None)
    outputs = getattr(plan, "outputs", None)
    if outputs is None:
        return None
    if any(o.kind == "arg" for o in outputs):
        return ("its launch plan returns one of the op's inputs, which an operator of compiled "
                "code may not alias")
    from torch._subclasses.fake_tensor import FakeTensorMode

    def fake(leaf: dict) -> torch.Tensor:
        return torch.empty_strided(leaf["shape"], leaf["stride"], device=entry.device,
                                   dtype=torch_dtype(leaf["dtype"]))

    try:
        with FakeTensorMode():
            args = [decode(spec, fake, make_list=list) for spec in entry.args]
            kwargs = {k: decode(v, fake, make_list=list) for k, v in entry.kwargs.items()}
            result = resolve_op(entry.op)(*args, **kwargs)
    except Exception:  # the op cannot run on fake tensors here: Inductor's own trace will say
        return None
    results = list(result) if isinstance(result, (tuple, list)) else [result]
    if len(results) != len(outputs):
        return (f"its launch plan makes {len(outputs)} output(s) where the op returns "
                f"{len(results)}")
    for i, (made, fake) in enumerate(zip(outputs, results)):
        mine = (tuple(made.shape), made.dtype,
                [s for s, n in zip(made.stride, made.shape) if n != 1])
        theirs = (tuple(fake.shape), str(fake.dtype).removeprefix("torch."),
                  [s for s, n in zip(fake.stride(), fake.shape) if n != 1])
        if mine != theirs:
            return (f"its launch plan makes output {i} as {made.dtype}{list(made.shape)} with "
                    f"strides {list(made.stride)}, where compiled code takes it to be "
                    f"{theirs[1]}{list(fake.shape)} with strides {list(fake.stride())}")
    return None


def _leaves_at(entry: Entry, paths: list[tuple[str, str]]) -> list[dict]:
    bound = bind(entry.op, list(entry.args), dict(entry.kwargs))
    leaves = {(name, path): leaf for name, value in bound.items() for path, leaf in walk(value)}
    return [leaves[p] for p in paths]


_lock = threading.Lock()
_registered: dict[str, KernelOp] = {}  # operator name -> its op, for the life of the process
_library: torch.library.Library | None = None


def operator_name(entry: Entry) -> str:
    """The kernel's operator name: the same in every process for the same kernel variant, so
    that graphs from Inductor's FX graph cache call the operator this process defines."""
    short = entry.op.split(".")[1].strip("_") or "op"
    what = repr((entry.op, freeze([entry.args, entry.kwargs]), str(entry.device), entry.key,
                 entry.label))
    return f"{short}_{hashlib.sha256(what.encode()).hexdigest()[:12]}"


def kernel_op(entry: Entry) -> KernelOp:
    """The operator of ``entry``, defined once per process (compiled code may call it for as
    long as the process lives); an operator defined for an equal entry before now runs this
    one's kernel. Every entry an operator has run stays loaded with it: CUDA graphs captured
    while it ran may launch its kernel for as long as they live."""
    global _library
    name = operator_name(entry)
    with _lock:
        op = _registered.get(name)
        if op is None:
            if _library is None:
                _library = torch.library.Library(NAMESPACE, "FRAGMENT")
            op = _registered[name] = KernelOp(entry, name, _library)
        if op.entry is not entry:
            if not any(e is op.entry for e in op.earlier):  # tables swapped back and forth
                op.earlier.append(op.entry)
            op.entry = entry
        return op


# ----- kernels in Inductor's graphs, through its pattern matcher -----


def _symbolic(value: Any) -> bool:
    if isinstance(value, torch.Tensor):
        return any(isinstance(s, torch.SymInt)
                   for s in (*value.shape, *value.stride(), value.storage_offset()))
    return isinstance(value, (torch.SymInt, torch.SymFloat, torch.SymBool))


def inductor_fuses(op: str) -> bool:
    """Whether Inductor fuses ``op`` with its neighbours (a pointwise op, or one it decomposes:
    norms, softmax, activations); a region, whether it fuses all of its ops. Such kernels stay
    out of compiled graphs unless measurement in the model says they win there."""
    region = registered(op)
    if region is not None:
        return all(inductor_fuses(node["op"]) for node in region.nodes)
    name = op.split(".")[1] if op.count(".") >= 1 else op
    if name in EXTERN_OPS or "attention" in name:
        return False  # Inductor calls a library kernel or a template (its decomposition of a
        # matmul is only for tiny shapes)
    from torch._inductor.decomposition import select_decomp_table

    try:
        func = resolve_op(op)
    except ArgSpecError:
        return False
    return torch.Tag.pointwise in func.tags or func in select_decomp_table()


def unfused(table: KernelTable) -> tuple[KernelTable, list[str]]:
    """The kernels a compiled model takes without a measurement in it: those of ops Inductor does
    not fuse (``inductor_fuses``); and a note for each one left to Inductor."""
    fused = [e for e in table.entries if inductor_fuses(e.op)]
    notes = [f"{e.label or e.op}: left to Inductor, which fuses it (kforge.compile(..., "
             "example_inputs=...) tries it in the model)" for e in fused]
    return KernelTable(e for e in table.entries if e not in fused), notes


@dataclass
class GraphReport:
    """What kforge did in one compiled graph."""

    replaced: Counter[str] = field(default_factory=Counter)  # kernel label -> nodes
    kept: Counter[str] = field(default_factory=Counter)  # reason -> calls on Inductor's code
    cached: bool = False  # Inductor's FX graph cache served it: kforge's pass did not run


@dataclass
class CompileReport:
    """What the backend did over every graph it compiled: nodes replaced per kernel, calls
    shaped like a kernel's call left to Inductor and why, and notes (why kforge stood aside)."""

    graphs: int = 0
    cached: int = 0  # graphs served by Inductor's FX graph cache (their nodes are not counted)
    replaced: Counter[str] = field(default_factory=Counter)
    kept: Counter[str] = field(default_factory=Counter)
    notes: list[str] = field(default_factory=list)

    @property
    def nodes(self) -> int:
        return sum(self.replaced.values())

    def kernels(self) -> set[str]:
        """The labels of the kernels that are in the compiled graphs."""
        return {label for label, n in self.replaced.items() if n}

    def add(self, graph: GraphReport) -> None:
        self.graphs += 1
        self.cached += graph.cached
        self.replaced.update(graph.replaced)
        self.kept.update(graph.kept)

    def __str__(self) -> str:
        head = f"kforge: {self.nodes} node(s) run a kforge kernel in {self.graphs} compiled graph(s)"
        if self.cached:
            head += f" ({self.cached} from Inductor's FX graph cache, not counted)"
        lines = [head]
        lines += [f"  {label}: {n} node(s)" for label, n in sorted(self.replaced.items())]
        lines += [f"  kept on Inductor's code: {n} call(s), {why}"
                  for why, n in sorted(self.kept.items())]
        return "\n".join([*lines, *(f"note: {n}" for n in self.notes)])


class _Group:
    """Kernels whose calls have the same structure (one op and its fixed arguments, or one
    region), registered as one replacement: the matched call becomes the kernel of its exact
    variant, found by ``check``."""

    def __init__(self, kernels: list[KernelOp], outputs: tuple[int, ...] | None) -> None:
        self.kernels = kernels
        self.outputs = outputs  # which results the pattern covers; None: the op's own result
        self.chosen: KernelOp | None = None
        self.rejected: dict[torch.fx.Node, str] = {}  # calls this graph keeps, and why

    def search(self, *tensors: torch.Tensor) -> Any:
        return self._pick(self.kernels[0].search()(*tensors))

    def replace(self, *tensors: torch.Tensor) -> Any:
        assert self.chosen is not None  # check() chose it for this very match
        return self._pick(self.chosen.overload(*tensors))

    def _pick(self, result: Any) -> Any:
        if self.outputs is None:
            return result
        picked = tuple(result[i] for i in self.outputs)
        return picked[0] if len(picked) == 1 else picked

    def check(self, match: Any) -> bool:
        """Whether the matched call has a kernel's exact variant; that kernel is then chosen."""
        nodes = [match.kwargs.get(f"t{i}") for i in range(len(self.kernels[0].paths))]
        values = [n.meta.get("val") if isinstance(n, torch.fx.Node) else None for n in nodes]
        anchor = match.output_nodes()[0]
        if any(not isinstance(v, torch.Tensor) for v in values):
            return False
        if any(_symbolic(v) for v in values):
            self.rejected[anchor] = SYMBOLIC
            return False
        specs = tuple(freeze(encode_value(v)) for v in values)
        same = [k for k in self.kernels if k.specs == specs]
        if same and any(v.storage_offset() for v in values):
            self.rejected[anchor] = VIEW_OFFSET
            return False
        self.chosen = next((k for k in same if all(v.device == k.entry.device for v in values)),
                           None)
        if self.chosen is None:
            self.rejected[anchor] = OTHER_DEVICE if same else OTHER_VARIANT
            return False
        return True


def _signature(count: int) -> inspect.Signature:
    """``(t0, t1, ...)``: the pattern matcher names a pattern's inputs by its function's
    parameters."""
    return inspect.Signature([inspect.Parameter(f"t{i}", inspect.Parameter.POSITIONAL_OR_KEYWORD)
                              for i in range(count)])


def _traced(group: _Group, method: Callable[..., Any]) -> Callable[..., Any]:
    def call(*tensors: torch.Tensor) -> Any:
        return method(*tensors)

    call.__signature__ = _signature(len(group.kernels[0].paths))  # type: ignore[attr-defined]
    return call


def _trace(fn: Callable[..., Any], args: Any, **options: Any) -> torch.fx.GraphModule:
    """``fn`` traced as Inductor's post-grad graph has it: its decompositions (``fwd_only``),
    and views as reshapes (Inductor turns every view into a reshape before its passes)."""
    from torch._inductor.fx_passes.post_grad import view_to_reshape
    from torch._inductor.pattern_matcher import fwd_only

    gm = fwd_only(fn, args, **options)
    view_to_reshape(gm)
    return gm


def _groups(kernels: Iterable[KernelOp]) -> list[_Group]:
    """The kernels grouped by the structure of their calls; an op or region of several results
    gets a group for its first result alone and one for its last alone (inference graphs drop
    the others: a norm's statistics), and one for all of them."""
    by_structure: dict[str, list[KernelOp]] = {}
    for kernel in kernels:
        region = registered(kernel.entry.op)
        structure = region.name if region is not None else repr(
            (kernel.entry.op, kernel.args, kernel.kwargs))
        by_structure.setdefault(structure, []).append(kernel)
    groups = []
    for same in by_structure.values():
        results = len(same[0].func._schema.returns)
        if results == 1:
            groups.append(_Group(same, None))
        else:
            groups += [_Group(same, picked) for picked in
                       dict.fromkeys([(0,), (results - 1,), tuple(range(results))])]
    return groups


class KernelPass(CustomGraphPass):
    """Inductor's post-grad custom pass putting the table's kernels in: a ``PatternMatcherPass``
    with one replacement per kernel call structure. ``uuid()`` hashes the kernels and kforge's
    pass code, for Inductor's FX graph cache."""

    def __init__(self, kernels: list[KernelOp]) -> None:
        from torch._inductor.pattern_matcher import PatternMatcherPass, register_replacement

        self.patterns = PatternMatcherPass()
        self.groups = _groups(kernels)
        self.labels = {k.overload: k.label for k in kernels}
        self.user_pass: Any = None  # the user's own post-grad post pass, run after kforge's
        self.report = GraphReport()
        self.failed: list[str] = []
        for group in self.groups:
            try:
                register_replacement(_traced(group, group.search), _traced(group, group.replace),
                                     group.kernels[0].example_inputs(), _trace,
                                     [self.patterns], extra_check=group.check)
            except Exception as exc:  # a call the pattern matcher cannot trace: Inductor's code
                self.failed += [f"{k.label}: its call cannot be traced as a pattern "
                                f"({type(exc).__name__}: {_first_line(exc)})"
                                for k in group.kernels]
        # the pass's code: this module and the region interpreter its patterns are traced from
        code = hashlib.sha256(b"".join(Path(f).read_bytes() for f in (__file__, _regions.__file__)))
        self._key = repr((sorted(self.labels.values()), sorted(k.name for k in kernels),
                          code.hexdigest()))

    def __call__(self, graph: torch.fx.Graph) -> None:
        for group in self.groups:
            group.rejected.clear()
        self.patterns.apply(graph)
        alive = set(graph.nodes)
        kept = {node: why for group in self.groups for node, why in group.rejected.items()
                if node in alive}
        self.report.kept.update(kept.values())
        for node in graph.nodes:
            label = self.labels.get(node.target) if node.op == "call_function" else None
            if label is not None:
                self.report.replaced[label] += 1
        if self.user_pass is not None:
            self.user_pass(graph)

    def uuid(self) -> Any:
        user = self.user_pass
        own = user.uuid() if isinstance(user, CustomGraphPass) else (
            None if user is not None else "")
        if own is None:  # a user pass without a uuid keeps Inductor's cache out
            return None
        return hashlib.sha256(repr((self._key, own)).encode()).hexdigest()


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
        self.kernels: list[KernelOp] = []
        skipped = []
        for entry in table.entries:
            why = unsupported(entry) or output_mismatch(entry)
            try:
                op = kernel_op(entry) if why is None else None
            except (ArgSpecError, RuntimeError) as exc:  # an argument that cannot be rebuilt
                op, why = None, f"its call cannot be rebuilt ({_first_line(exc)})"
            if op is None:
                skipped.append(f"{entry.label or entry.op}: {why}")
                continue
            self.kernels.append(op)
        self.kernel_pass = KernelPass(self.kernels)
        skipped += self.kernel_pass.failed
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
        from torch._dynamo.utils import counters
        from torch._inductor.compile_fx import compile_fx

        if torch.is_grad_enabled() and any(
                isinstance(t, torch.Tensor) and t.requires_grad
                for t in (*example_inputs, *gm.parameters())):
            # AOT autograd traces a joint forward and backward graph: no kernel has a backward
            if self.kernels:
                self.warn(GRADIENTS, f"kforge's kernels are not used in a compiled graph: "
                                     f"{GRADIENTS} (run the model under torch.no_grad() or "
                                     "torch.inference_mode()); Inductor alone compiles it")
                self.report.notes.append(f"a graph compiled without kforge: {GRADIENTS}")
            return compile_fx(gm, example_inputs, config_patches=self.inductor.config)
        from torch._inductor import config

        graph = self.kernel_pass.report = GraphReport()
        if (user := self.inductor.config.get("post_grad_custom_post_pass",
                                             config.post_grad_custom_post_pass)) \
                is not self.kernel_pass:
            self.kernel_pass.user_pass = user
        patches = {**self.inductor.config, "post_grad_custom_post_pass": self.kernel_pass}
        hits = counters["inductor"]["fxgraph_cache_hit"]
        try:
            compiled = compile_fx(gm, example_inputs, config_patches=patches)
        except Exception as exc:  # kforge's part failed on this graph: Inductor takes it whole
            if isinstance(exc, torch._dynamo.exc.TorchDynamoException) and not isinstance(
                    exc, torch._dynamo.exc.BackendCompilerFailed):
                raise  # Dynamo's own signals (restart the analysis, skip the frame) pass through
            self.warn("failed", f"kforge's kernels are left out of a graph that failed to compile "
                                f"with them ({type(exc).__name__}: {_first_line(exc)}): Inductor "
                                "alone compiles it")
            self.report.notes.append(f"a graph compiled without kforge: {_first_line(exc)}")
            return compile_fx(gm, example_inputs, config_patches=self.inductor.config)
        graph.cached = counters["inductor"]["fxgraph_cache_hit"] > hits
        self.report.add(graph)
        self._explain(graph)
        log.info("kforge: graph %d: %s", self.report.graphs,
                 ", ".join(f"{label} x{n}" for label, n in graph.replaced.items()) or
                 ("from Inductor's cache" if graph.cached else "no kernel applies"))
        return compiled

    def _explain(self, graph: GraphReport) -> None:
        """Warn once per cause where a graph has calls shaped like a kernel's and none of them
        became one."""
        if graph.replaced or graph.cached or not self.kernels:
            return
        for why in (SYMBOLIC, OTHER_DEVICE, VIEW_OFFSET, OTHER_VARIANT):
            if graph.kept[why]:
                self.warn(why, f"kforge's kernels are not used in a compiled graph: "
                               f"{graph.kept[why]} call(s) shaped like a kernel's: {why}; "
                               "Inductor's code runs for them (do the model and its inputs "
                               "differ from the profiled ones?)" if why == OTHER_VARIANT else
                               f"kforge's kernels are not used in a compiled graph: "
                               f"{graph.kept[why]} call(s) shaped like a kernel's: {why}; "
                               "Inductor's code runs for them")
                return
        self.warn("absent", f"kforge's kernels are not used in a compiled graph: none of the "
                            f"{len(self.kernels)} kernel(s) has its op call or region chain "
                            "there (other code than the profiled model, or an intermediate "
                            "result used elsewhere)")

    def reset(self) -> None:
        self.inductor.reset()

    def get_compiler_config(self) -> Any:
        return self.inductor.get_compiler_config()


def _first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return lines[0][:300] if lines else type(exc).__name__
