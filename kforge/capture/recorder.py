"""Watch a model run at the aten level: which op variants it calls, from which module, with which
inputs.

Two TorchDispatchModes share one job each: ``CallRecorder`` names every call (card key), notes the
module that issued it and wraps it in a profiler range named after its key, so kernel time can be
joined back to the card; ``SampleRecorder`` saves the inputs of chosen calls. A dispatch mode sees
ops after composite ops (``linear``, ``scaled_dot_product_attention``) have been decomposed, which
is exactly the level that guarded integration replaces.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import torch
from torch._C._profiler import _RecordFunctionFast
from torch._ops import HigherOrderOperator
from torch.utils._python_dispatch import TorchDispatchMode

from kforge.capture.classify import is_view_or_copy
from kforge.capture.samples import SampleBudget, save_sample
from kforge.core.argspec import allow_namespace, encode_call, walk
from kforge.core.opcard import variant_key

RANGE_PREFIX = "kforge:"
PROGRESS_EVERY = 256  # calls between progress reports while saving samples
# Namespaces whose ops are bookkeeping, not model work.
SKIPPED_NAMESPACES = frozenset({"profiler"})


@dataclass(frozen=True)
class CallSpec:
    """One op variant as first seen: what a card is made of."""

    op: str
    args: list
    kwargs: dict
    view_or_copy: bool
    random: bool = False  # draws from the random generator: no kernel can match eager's values


class _Call(NamedTuple):
    key: str
    op: str
    args: list
    kwargs: dict


def hookable_modules(model: torch.nn.Module) -> list[tuple[str, torch.nn.Module]]:
    """The submodules of ``model`` that take forward hooks, by dotted path: not TorchScript ones
    (nor those inside them), whose ops are then said to come from the nearest module that does."""
    found: list[tuple[str, torch.nn.Module]] = []
    scripted: list[str] = []
    for name, module in model.named_modules():
        if not name or any(name.startswith(s + ".") for s in scripted):
            continue
        if isinstance(module, torch.jit.ScriptModule):
            scripted.append(name)
            continue
        found.append((name, module))
    return found


class ModuleTracker:
    """Knows which module of ``model`` is running, as its dotted path (``model.layers.3.mlp``).

    Ops issued by the root module itself get the empty path.
    """

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model
        self.stack: list[str] = [""]
        self.scopes: list[str] = [""]  # the same, each with its call number: "mlp#12"
        self.entered = 0
        self._handles: list[Any] = []
        self._thread = threading.get_ident()
        # modules the forward ran on other threads (a thread pool): dispatch modes are
        # per-thread, so their ops go unseen; kept out of the stack, which is this thread's
        self.elsewhere: dict[str, None] = {}

    def on_its_thread(self, name: str) -> bool:
        """Whether module ``name`` runs on the thread that entered the tracker (else noted)."""
        if threading.get_ident() == self._thread:
            return True
        self.elsewhere[name] = None
        return False

    @property
    def current(self) -> str:
        return self.stack[-1]

    @property
    def scope(self) -> str:
        """The module call now running: one call of one module (``layers.3.mlp#41``)."""
        return self.scopes[-1]

    def __enter__(self) -> ModuleTracker:
        self._thread = threading.get_ident()
        for name, module in hookable_modules(self.model):
            self._handles.append(module.register_forward_pre_hook(self._enter(name)))
            self._handles.append(module.register_forward_hook(self._leave(name),
                                                              always_call=True))
        return self

    def __exit__(self, *exc: object) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        del self.stack[1:]
        del self.scopes[1:]

    def _enter(self, name: str):
        def hook(module: torch.nn.Module, args: Any) -> None:
            if self.on_its_thread(name):
                self.stack.append(name)
                self.entered += 1
                self.scopes.append(f"{name}#{self.entered}")
        return hook

    def _leave(self, name: str):
        def hook(module: torch.nn.Module, args: Any, output: Any) -> None:
            if self.on_its_thread(name) and len(self.stack) > 1:
                self.stack.pop()
                self.scopes.pop()
        return hook


def elsewhere_note(modules: dict[str, None]) -> str | None:
    """What a profile says of modules its forward ran on other threads."""
    if not modules:
        return None
    names = [n for n in modules  # the outermost: a child's ops are its parent's
             if not any(n.startswith(other + ".") for other in modules)]
    shown = ", ".join(names[:4]) + (f" and {len(names) - 4} more" if len(names) > 4 else "")
    return (f"modules {shown} ran on other threads (a thread pool in the forward?): kforge "
            "watches the thread that calls the model, so their ops have no op cards")


class HigherOrderPassThrough(TorchDispatchMode):
    """A mode that lets higher-order operators (``torch.cond``, ``while_loop``,
    ``flex_attention``) run as they are: their bodies are functions, not aten calls, and run out
    of the mode's sight; ``unwatched`` counts their calls by name."""

    supports_higher_order_operators = True

    def __init__(self) -> None:
        super().__init__()
        self.unwatched: dict[str, int] = {}

    def pass_through(self, func: HigherOrderOperator, args: tuple, kwargs: dict) -> Any:
        name = func.name()
        self.unwatched[name] = self.unwatched.get(name, 0) + 1
        return func(*args, **kwargs)


def unwatched_note(unwatched: dict[str, int]) -> str | None:
    """What a profile says of the higher-order operators it could not look into."""
    if not unwatched:
        return None
    calls = ", ".join(f"{n} x{c}" if c > 1 else n for n, c in sorted(unwatched.items()))
    return (f"the ops inside higher-order operators ({calls}) have no op cards: kforge records "
            "aten calls, and these run their bodies as functions")


class _KeyedMode(HigherOrderPassThrough):
    """Computes each call's card key; subclasses decide what to do around the call."""

    def __init__(self) -> None:
        super().__init__()
        self._names: dict[Any, str] = {}

    def _describe(self, func: Any, args: tuple, kwargs: dict) -> _Call | None:
        """The call's card key and arg specs; None for bookkeeping ops that are no model work."""
        op = self._names.get(func)
        if op is None:
            op = self._names[func] = str(func)
            allow_namespace(func.namespace)  # an operator the model registered and called
        if op.split(".", 1)[0] in SKIPPED_NAMESPACES:
            return None
        args_spec, kwargs_spec = encode_call(func, args, kwargs)
        return _Call(variant_key(op, args_spec, kwargs_spec), op, args_spec, kwargs_spec)


class CallRecorder(_KeyedMode):
    """Records every call (key, module) and runs it inside a profiler range named by its key."""

    def __init__(self, tracker: ModuleTracker) -> None:
        super().__init__()
        self.tracker = tracker
        self.specs: dict[str, CallSpec] = {}
        self.calls: dict[str, int] = {}
        self.modules: dict[str, dict[str, None]] = {}  # ordered sets of module paths per key

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (),
                           kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        if isinstance(func, HigherOrderOperator):
            return self.pass_through(func, args, kwargs)
        call = self._describe(func, args, kwargs)
        if call is None:
            return func(*args, **kwargs)
        if call.key not in self.specs:
            view = is_view_or_copy(call.op, func.is_view, torch.Tag.view_copy in func.tags,
                                   any("Tensor" in str(r.type) for r in func._schema.returns))
            self.specs[call.key] = CallSpec(call.op, call.args, call.kwargs, view,
                                            torch.Tag.nondeterministic_seeded in func.tags)
            self.modules[call.key] = {}
        self.calls[call.key] = self.calls.get(call.key, 0) + 1
        self.modules[call.key][self.tracker.current] = None
        with _RecordFunctionFast(RANGE_PREFIX + call.key):
            return func(*args, **kwargs)


class SampleRecorder(_KeyedMode):
    """Saves the inputs of the planned calls (``plan[key]`` = call indices) before they run.

    ``on_progress(calls passed)`` is called every ``PROGRESS_EVERY`` calls.
    """

    def __init__(self, plan: dict[str, set[int]], samples_dir: Path, budget: SampleBudget,
                 on_progress: Callable[[int], None] | None = None,
                 region_reads: dict[int, list[tuple[int, str, int, int, int]]] | None = None
                 ) -> None:
        super().__init__()
        self.plan = plan
        # Region inputs: call index -> (tensor leaf, card key, input index, instance, inputs);
        # an instance's inputs are saved together once all are read.
        self.region_reads = region_reads or {}
        self._pending: dict[tuple[str, int], dict[int, Any]] = {}
        self.samples_dir = samples_dir
        self.budget = budget
        self.on_progress = on_progress
        self.passed = 0
        self.seen: dict[str, int] = {}
        self.saved: dict[str, int] = {}

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (),
                           kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        if isinstance(func, HigherOrderOperator):  # uncounted, as the trace's recorder does
            return self.pass_through(func, args, kwargs)
        self.passed += 1
        if self.on_progress is not None and self.passed % PROGRESS_EVERY == 0:
            self.on_progress(self.passed)
        if self.passed - 1 in self.region_reads:
            self._read_region_inputs(self.region_reads[self.passed - 1], args, kwargs)
        call = self._describe(func, args, kwargs)
        if call is not None and call.key in self.plan:
            key = call.key
            index = self.seen.get(key, 0)
            self.seen[key] = index + 1
            if index in self.plan[key]:
                number = self.saved.get(key, 0)
                save_sample(self.samples_dir / key / f"{number}.pt", key, args, kwargs,
                            self.budget)
                self.saved[key] = number + 1
        return func(*args, **kwargs)

    def _read_region_inputs(self, reads: list[tuple[int, str, int, int, int]], args: tuple,
                            kwargs: dict) -> None:
        tensors = [v for _, v in walk([list(args), list(kwargs.values())])
                   if isinstance(v, torch.Tensor)]
        for leaf, key, index, instance, count in reads:
            pending = self._pending.setdefault((key, instance), {})
            pending[index] = tensors[leaf]
            if len(pending) == count:
                del self._pending[(key, instance)]
                number = self.saved.get(key, 0)
                save_sample(self.samples_dir / key / f"{number}.pt", key,
                            [pending[i] for i in range(count)], {}, self.budget)
                self.saved[key] = number + 1
