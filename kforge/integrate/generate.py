"""Real generation: tokens per second of a transformers ``generate`` of N new tokens from a prompt,
in each way a user may run it, without and with kforge's kernels, and each run's tokens against
eager's.

The modes (``MODES``), every one a real ``model.generate`` (greedy, ``min_new_tokens`` = N so all
runs produce N tokens):

- ``eager``: the decode steps run eagerly (transformers' automatic compile off); ``+kforge``: the
  guard in front of the patched ops (range kernels included: the KV length grows every token);
- ``graphs``: each decode step traced by TorchDynamo and replayed as CUDA graphs of eager's own
  kernels (torch.compile's ``cudagraphs`` backend, no Inductor); ``+kforge``: the guard active
  while the graphs are captured, so kforge's kernels are in them;
- ``compile``: transformers compiles the decode step with Inductor (``compile_mode``, by default
  ``reduce-overhead`` as transformers does for a static cache); ``+kforge``: kforge's compile
  backend (``kforge.integrate.backend``) in the same mode, with the kernels ``kforge.backend``
  takes from a session: those of ops Inductor does not fuse.

The cache is the one users take for speed, a static cache (``cache_implementation="static"``:
fixed shapes, so CUDA graphs and torch.compile apply), where the model supports one; otherwise
the dynamic cache, with a note, and the CUDA graph and compiled modes are not measured
(transformers compiles static-cache decodes only). Each mode runs once untimed (compiling or
capturing), once as its trial, then ``reps`` timed generates; tokens per second are the new
tokens of the whole batch over the median wall time of one ``generate`` (prefill included, as a
user waits for it). The modes run one after another, each on the same prompt. A ``+kforge`` mode
whose trial is no faster than its mode's trial is handed back, as kforge hands a mode back
wherever its kernels do not make the whole model faster: its row shows the mode's own figures,
labelled so, with the speed kforge's kernels were tried at (the choice is made on the trials, the
figures are the timed runs, so the choice does not pick the luckier of two timings).
"""

from __future__ import annotations

import contextlib
import itertools
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from kforge.capture.loader import first_line
from kforge.errors import KforgeError
from kforge.integrate.measure import KFORGE_SUFFIX, named_modes, own_run
from kforge.integrate.patching import SessionPatch
from kforge.runtime.guard import Patch

STATIC, DYNAMIC = "static", "dynamic"
EAGER, GRAPHS, COMPILE = "eager", "graphs", "compile"


@dataclass(frozen=True)
class GenerationMode:
    """One way to run ``generate``: eagerly, as CUDA graph replays or compiled, without or with
    kforge's kernels."""

    id: str
    label: str
    kind: str  # EAGER, GRAPHS or COMPILE
    kforge: bool

    @property
    def base(self) -> str:
        return self.id.removesuffix(KFORGE_SUFFIX)


_BASES = ((EAGER, "eager"), (GRAPHS, "CUDA graphs"), (COMPILE, "torch.compile"))
MODES: dict[str, GenerationMode] = {
    mode.id: mode for kind, label in _BASES for mode in (
        GenerationMode(kind, label, kind, False),
        GenerationMode(kind + KFORGE_SUFFIX, label + " + kforge", kind, True))}


def parse_modes(text: str | None, kforge: bool = True) -> list[GenerationMode]:
    """Comma-separated mode ids (``graphs+kforge``) or bases (``graphs``: with and without
    kforge), or ``all`` (the default). Eager, the reference, is always run; without ``kforge``
    (no session to take kernels from) the kforge modes are left out. In table order."""
    wanted = named_modes(text, list(MODES), [kind for kind, _ in _BASES], "generation mode")
    return [m for m in MODES.values() if m.id in wanted and (kforge or not m.kforge)]


@dataclass
class GenerationRun:
    """One mode's generation: its speed, its tokens and how they compare with eager's."""

    mode: GenerationMode
    seconds: list[float] = field(default_factory=list)  # wall time of each timed generate
    setup_s: float | None = None  # the untimed first generate (compiling, capturing)
    tokens: torch.Tensor | None = None  # the new tokens, [batch, N], on the CPU
    first_divergence: int | None = None  # the first new token that differs from eager's
    kernels: str = ""  # what kforge's kernels did in one generate
    error: str = ""
    trial_s: float | None = None  # one generate after the setup, for the keep-or-hand-back choice
    tried: float | None = None  # a +kforge mode handed back: its trial's speed over its base's

    @property
    def median_s(self) -> float | None:
        return statistics.median(self.seconds) if self.seconds else None

    def tokens_per_s(self) -> float | None:
        if self.tokens is None or not self.median_s:
            return None
        return self.tokens.numel() / self.median_s


@dataclass
class GenerationResult:
    """Every mode's run of one generation."""

    runs: list[GenerationRun]
    cache: str  # STATIC or DYNAMIC
    prompt_tokens: int
    new_tokens: int
    batch: int
    notes: list[str] = field(default_factory=list)

    def run(self, mode_id: str) -> GenerationRun | None:
        return next((r for r in self.runs if r.mode.id == mode_id), None)

    def gain(self, base: str) -> float | None:
        """What kforge's kernels gain in mode ``base``: tokens/s with them over without."""
        without, with_kforge = self.run(base), self.run(base + KFORGE_SUFFIX)
        if without is None or with_kforge is None:
            return None
        slow, fast = without.tokens_per_s(), with_kforge.tokens_per_s()
        return fast / slow if slow and fast else None

    def table(self) -> str:
        """The runs side by side, as aligned text."""
        eager = self.run(EAGER)
        reference = eager.tokens_per_s() if eager else None
        header = ("mode", "tokens/s", "vs eager", "kforge gain", "setup s", "tokens", "kforge")
        rows = [header]
        for run in self.runs:
            speed = run.tokens_per_s()
            gain = self.gain(run.mode.base) if run.mode.kforge else None
            rows.append((run.mode.label,
                         f"{speed:.1f}" if speed else "-",
                         f"{speed / reference:.2f}x" if speed and reference else "-",
                         f"{gain:.2f}x" if gain else "-",
                         f"{run.setup_s:.1f}" if run.setup_s is not None else "-",
                         agreement(run), run.kernels or "-"))
        widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
        lines = ["  ".join(cell.ljust(w) if i in (0, 5, 6) else cell.rjust(w)
                           for i, (cell, w) in enumerate(zip(row, widths))).rstrip()
                 for row in rows]
        lines += [f"{run.mode.label}: {run.error}" for run in self.runs if run.error]
        return "\n".join([*lines, *(f"note: {note}" for note in self.notes)])

    def to_dict(self) -> dict:
        return {"cache": self.cache, "prompt_tokens": self.prompt_tokens,
                "new_tokens": self.new_tokens, "batch": self.batch, "notes": list(self.notes),
                "runs": [{"mode": r.mode.id, "tokens_per_s": r.tokens_per_s(),
                          "median_s": r.median_s, "seconds": r.seconds, "setup_s": r.setup_s,
                          "first_divergence": r.first_divergence, "kernels": r.kernels,
                          "error": r.error, "kforge_gain": self.gain(r.mode.base)
                          if r.mode.kforge else None, "trial_s": r.trial_s,
                          "handed_back_tried": r.tried} for r in self.runs]}


def agreement(run: GenerationRun) -> str:
    """How a run's tokens compare with eager's: ``same``, or where they first diverge."""
    if run.tokens is None:
        return "-"
    if run.mode.id == EAGER:
        return "reference"
    if run.first_divergence is None:
        return "same"
    return f"differ from token {run.first_divergence}"


def first_divergence(reference: torch.Tensor, tokens: torch.Tensor) -> int | None:
    """The index of the first new token (over the batch) where ``tokens`` differs from
    ``reference``; None where they are equal."""
    if reference.shape != tokens.shape:
        return 0
    differs = (reference != tokens).any(dim=0).nonzero()
    return int(differs[0]) if len(differs) else None


# ----- running generate -----


def generate_tokens(model: Any, input_ids: torch.Tensor, new_tokens: int, *, cache: str,
                    compile_config: Any = None) -> torch.Tensor:
    """The new tokens of one greedy ``generate`` of exactly ``new_tokens`` tokens."""
    options: dict[str, Any] = {"max_new_tokens": new_tokens, "min_new_tokens": new_tokens,
                               "do_sample": False,
                               "attention_mask": torch.ones_like(input_ids)}
    if cache == STATIC:
        options["cache_implementation"] = STATIC
    if compile_config is None:
        options["disable_compile"] = True
    else:
        options["compile_config"] = compile_config
    with torch.no_grad():
        output = model.generate(input_ids, **options)
    return output[:, input_ids.shape[1]:]


def static_cache_problem(model: Any, input_ids: torch.Tensor) -> str | None:
    """Why ``model`` cannot generate with a static cache, or None when it can."""
    from transformers import StaticCache

    try:
        with torch.no_grad():
            out = model.generate(input_ids[:, :2], max_new_tokens=2, do_sample=False,
                                 cache_implementation=STATIC, disable_compile=True,
                                 attention_mask=torch.ones_like(input_ids[:, :2]),
                                 return_dict_in_generate=True)
    except Exception as exc:  # transformers refuses the static cache for this model
        return f"{type(exc).__name__}: {first_line(exc)}"
    kind = type(getattr(out, "past_key_values", None))
    if not issubclass(kind, StaticCache):
        return f"it generates with a {kind.__name__} instead"
    return None


_backend_names = itertools.count(1)


def compile_config(mode: GenerationMode, compile_mode: str, kernels: Patch | None,
                   device: torch.device) -> tuple[Any, Any]:
    """transformers' ``CompileConfig`` for a CUDA graph or compiled mode, and kforge's compile
    backend where the mode uses one (its ``report`` says what it replaced): None for a compiled
    ``+kforge`` mode left no kernel, which Inductor then compiles alone."""
    from transformers import CompileConfig

    chosen = None
    if mode.kind == GRAPHS:
        backend, inductor_mode = "cudagraphs", "default"
    else:
        backend, inductor_mode = "inductor", compile_mode
    if mode.kind == COMPILE and mode.kforge:
        from torch._dynamo import register_backend

        from kforge.integrate.backend import Backend, unfused

        assert kernels is not None
        # as kforge.backend(session) takes them: a kernel of an op Inductor fuses takes that op
        # out of its fusions, which a generate does not measure kernel by kernel
        table, left = unfused(kernels.table)
        if table.entries:
            chosen = Backend(table, mode=compile_mode, notes=[*kernels.notes, *left])
            # by name: transformers deep-copies its compile config, and the backend holds kernels
            backend = f"kforge_generate_{next(_backend_names)}"
            register_backend(chosen, name=backend)
            inductor_mode = "default"  # the backend applies compile_mode itself
    config = CompileConfig(fullgraph=False, backend=backend, mode=inductor_mode)
    if device.type != "cuda":
        config._compile_all_devices = True  # transformers compiles on GPUs only, unless told
    return config, chosen


def run_generation(model: Any, input_ids: torch.Tensor, new_tokens: int, *,
                   modes: list[GenerationMode], kernels: Patch | None = None,
                   eager_kernels: Patch | None = None, cache: str = STATIC,
                   compile_mode: str = "reduce-overhead", reps: int = 3,
                   hand_back: bool = True) -> GenerationResult:
    """Generate ``new_tokens`` tokens after ``input_ids`` in each of ``modes``. ``kernels``:
    kforge's kernels for the CUDA graph and compiled modes (every winner), ``eager_kernels`` for
    eager + kforge (default: the same). ``cache``: STATIC, falling back to DYNAMIC with a note
    where the model has no static cache.

    With ``hand_back``, a ``+kforge`` mode whose trial generate (the one after its setup, before
    the timed ones) is no faster than its mode's runs that mode alone, as a user of kforge would:
    its row shows the mode's own figures and says so, with the speed its kernels were tried at."""
    if not hasattr(model, "generate"):
        raise KforgeError(f"{type(model).__name__} has no generate(): the generation benchmark "
                          "runs transformers language models")
    if cache not in (STATIC, DYNAMIC):
        raise KforgeError(f"unknown cache {cache!r}: use {STATIC} or {DYNAMIC}")
    if new_tokens < 1 or reps < 1:
        raise KforgeError("the generation needs at least one new token and one timed run")
    if any(mode.kforge for mode in modes) and kernels is None:
        raise KforgeError("the +kforge modes need kforge's kernels (a session)")
    device = input_ids.device
    notes: list[str] = []
    if cache == STATIC and (why := static_cache_problem(model, input_ids)) is not None:
        notes.append(f"{type(model).__name__} cannot generate with a static cache ({why}): the "
                     "dynamic cache is used, and CUDA graphs and torch.compile are not measured "
                     "(transformers compiles static-cache decodes only)")
        cache = DYNAMIC
    eager_kernels = eager_kernels or kernels
    # a region kernel replaces the forward of the module that is its region: the patch must
    # know the model, or those kernels never run
    kernels, eager_kernels = (k.for_model(model) if isinstance(k, SessionPatch) else k
                              for k in (kernels, eager_kernels))
    runs = []
    for mode in modes:
        run = GenerationRun(mode)
        runs.append(run)
        if mode.kind != EAGER and cache != STATIC:
            run.error = "not measured: it needs a static cache"
            continue
        if mode.kind == GRAPHS and device.type != "cuda":
            run.error = "not measured: CUDA graphs need a CUDA GPU"
            continue
        base = next((r for r in runs if r.mode.id == mode.base), None) if mode.kforge else None
        _measure(run, model, input_ids, new_tokens, cache=cache, compile_mode=compile_mode,
                 kernels=eager_kernels if mode.kind == EAGER else kernels, reps=reps,
                 against=base if hand_back and base is not None and base.trial_s else None)
    result = GenerationResult(runs, cache, input_ids.shape[1], new_tokens, input_ids.shape[0],
                              notes)
    eager = result.run(EAGER)
    if eager is not None and eager.tokens is not None:
        for run in runs:
            if run is not eager and run.tokens is not None:
                run.first_divergence = first_divergence(eager.tokens, run.tokens)
    return result


def _measure(run: GenerationRun, model: Any, input_ids: torch.Tensor, new_tokens: int, *,
             cache: str, compile_mode: str, kernels: Patch | None, reps: int,
             against: GenerationRun | None = None) -> None:
    """Set up ``run``'s mode (the first generate), try it once, then time ``reps`` generates;
    with ``against`` (its mode without kforge), a trial no faster than that mode's hands the
    mode back: ``run`` takes the mode's own figures."""
    mode = run.mode
    device = input_ids.device
    patch = kernels if mode.kforge and mode.kind != COMPILE else None
    scope: Callable[[], contextlib.AbstractContextManager] = (
        (lambda: patch) if patch is not None else contextlib.nullcontext)
    config, chosen = None, None
    try:
        if mode.kind != EAGER:
            torch._dynamo.reset()  # each compiled mode starts from nothing
            config, chosen = compile_config(mode, compile_mode, kernels, device)
            if mode.kind == COMPILE and mode.kforge and chosen is None:
                run.kernels = f"{own_run(mode.base)}: every kernel is of an op Inductor fuses"
                if against is not None:  # its own figures, without compiling it again
                    run.seconds, run.tokens = list(against.seconds), against.tokens
                    return

        def one() -> torch.Tensor:
            _sync(device)
            start = time.perf_counter()
            tokens = generate_tokens(model, input_ids, new_tokens, cache=cache,
                                     compile_config=config)
            _sync(device)
            run.seconds.append(time.perf_counter() - start)
            return tokens

        with torch._dynamo.config.patch(recompile_limit=64), scope():
            if patch is not None:
                patch.table.reset_counts()
            one()
            run.setup_s = run.seconds.pop()
            if patch is not None:  # graphs are captured in the first generate, then replayed
                hits = patch.report().hits
                run.kernels = f"{hits} calls" + (" while capturing" if mode.kind == GRAPHS
                                                 else "")
            tokens = one()
            run.trial_s = run.seconds.pop()
            if against is not None and against.trial_s <= run.trial_s:
                run.tried = against.trial_s / run.trial_s
                run.seconds, run.tokens = list(against.seconds), against.tokens
                run.kernels = f"{own_run(mode.base)}: kforge's tried at {run.tried:.2f}x"
                return
            for _ in range(reps):
                tokens = one()
        run.tokens = tokens.cpu()
        if chosen is not None:
            left = len(kernels.table.entries) - len(chosen.table.entries) if kernels else 0
            run.kernels = f"{chosen.report.nodes} nodes" + (
                f", {left} kernels left to Inductor (it fuses their ops)" if left else "")
    except Exception as exc:  # Dynamo, Inductor, graph capture or the model gave up
        run.error = f"{type(exc).__name__}: {first_line(exc)}"
        run.seconds.clear()
    finally:
        if mode.kind != EAGER:
            torch._dynamo.reset()


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)

