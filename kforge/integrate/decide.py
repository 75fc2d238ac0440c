"""Which of a session's kernels go into a model, decided by measuring the whole model in the way
the user runs it; ``kforge.integrate.measure`` does the measuring, this module the deciding, and
``kforge.integrate.api`` offers it to the user.

* Eager and CUDA graphs (``patch(model=...)``, ``choose``): each winner is tried in whole
  forwards and kept only where they get faster beyond noise (``kforge.integrate.winners.select``).
* torch.compile (``compile(..., example_inputs=...)``, ``choose_compiled``): a kernel takes its op
  out of Inductor's fusions, so it must win *in* the compiled model, in the user's mode. Each
  candidate is tried in a few whole-model compiles in that mode's kernel choice (reduce-overhead
  compiles the same kernels as default; max-autotune as max-autotune-no-cudagraphs, so their
  searches are reused) and timed by device time, as replays of the compiled forward captured in a
  CUDA graph, with a minimum gain. Then the final model is timed against torch.compile alone in the
  user's own mode; unless kforge's version is faster beyond noise, Inductor's own result is handed
  back, with one line saying so (``hand_back`` does the same for ``kforge e2e``'s rows). So a
  compiled model with kforge is never slower than without it, by that measurement.
* With no measurement (``backend(session_id)``), ops and regions that Inductor fuses (pointwise,
  norms, softmax, activation chains) stay Inductor's, as vLLM does with its own kernels; kernels
  of ops Inductor calls as they are (matmuls, convolutions, attention) go in.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import torch

from kforge.capture.loader import LoadedModel
from kforge.core.candidate import Timing
from kforge.core.reward import significant_win
from kforge.errors import KforgeError
from kforge.integrate.backend import Backend, KforgeWarning
from kforge.integrate.graphs import gc_paused
from kforge.integrate.measure import (
    MODES,
    E2eResult,
    Measured,
    Mode,
    _graphed,
    compare_once,
    compiled_step,
    own_run,
    ran_kernels,
    run_modes,
    time_forwards,
)
from kforge.integrate.patching import (
    SessionPatch,
    by_saving,
    projected_patch,
    unused_message,
)
from kforge.integrate.winners import Selection, TrialFailed, combined_spread, select
from kforge.runtime.guard import Patch
from kforge.runtime.table import Entry, KernelTable
from kforge.runtime.timing import ForwardRun

# A compiled model keeps kforge's kernels only when they make it at least this much faster
# (and faster beyond the timing noise): a compile that changes nothing measurable is not worth
# the opaque calls it puts in Inductor's graph.
MIN_COMPILED_GAIN = 1.02
MAX_COMPILED_TRIALS = 4
# The mode whose compile chooses the same kernels as each torch.compile mode, without CUDA
# graphs: the trials capture it in a graph of their own and time its replays.
TRIAL_MODES = {"default": "default", "reduce-overhead": "default",
               "max-autotune": "max-autotune-no-cudagraphs",
               "max-autotune-no-cudagraphs": "max-autotune-no-cudagraphs"}
INDUCTORS_OWN = "Inductor's own result is handed back"


# ----- eager and CUDA graphs -----


def choose(loaded: LoadedModel, patch: Patch, *, cuda_graphs: bool,
           order: list[Entry] | None = None, reps: int = 20,
           warmup: int = 3) -> tuple[KernelTable, Selection[Entry]]:
    """The patch's kernels that make the whole forward faster beyond noise (``select``), run
    eagerly or (``cuda_graphs``) as CUDA graph replays; tried in ``order`` (default: the
    table's)."""
    entries = order if order is not None else list(patch.table.entries)

    def measure(subset: frozenset[Entry]) -> Timing:
        trial = patch.subset([e for e in entries if e in subset])
        subject = ForwardRun("trial", loaded.step, lambda: trial)
        if cuda_graphs:
            try:
                subject = _graphed(loaded, subject, Measured("trial"), None)
            except KforgeError as exc:  # a kernel's launch path that a graph cannot hold
                if not subset:
                    raise
                raise TrialFailed(str(exc)) from None
        return time_forwards(loaded, [subject], reps, warmup)["trial"]

    selection = select(entries, measure)
    patch.table.reset_counts()  # the trials ran the kernels; what counts is what runs next
    return KernelTable(selection.kept), selection


def select_measured(patch: SessionPatch, loaded: LoadedModel, *, cuda_graphs: bool,
                    reps: int = 20, warmup: int = 3) -> SessionPatch:
    """The patch with only the kernels that make ``loaded``'s whole forward faster beyond noise
    (run eagerly, or as CUDA graph replays); a note for each one dropped, saying why."""
    bound = patch if patch.model is not None else patch.for_model(loaded.model)
    table, selection = choose(loaded, bound, cuda_graphs=cuda_graphs, order=by_saving(patch),
                              reps=reps, warmup=warmup)
    notes = [*patch.notes, *(f"{t.winner.label or t.winner.op}: kept on eager, {t.reason}"
                             for t in selection.dropped)]
    return SessionPatch(patch.plan, table, notes, selection, patch.model or loaded.model)


# ----- torch.compile -----


def by_compiled_saving(patch: SessionPatch) -> list[Entry]:
    """The patch's kernels that beat the card's compiled baseline (or whose card has none), by
    the operator time they would save over Inductor's code, largest first."""
    saving: dict[str, float] = {}
    for d in patch.plan.winners:
        card = d.card
        if not d.speedup or not card.eager_us:
            continue
        kernel_us = card.eager_us / d.speedup
        against = card.compiled_us or card.eager_us
        if kernel_us < against:
            saving[card.key] = card.calls * (against - kernel_us)
    return sorted((e for e in patch.table.entries if e.key in saving),
                  key=lambda e: -saving[e.key])


def compiled_subject(loaded: LoadedModel, compile_mode: str, table: KernelTable | None,
                     name: str) -> tuple[ForwardRun, Backend | None]:
    """The model compiled (by a first forward) in ``compile_mode``, through kforge's backend
    with ``table`` (None: torch.compile alone), as a subject timed by device time: replays of
    one compiled forward captured in a CUDA graph where the mode has no graphs of its own and the
    forward can be captured, else forwards with the host released ahead of the GPU."""
    from torch._inductor import list_mode_options

    with warnings.catch_warnings(), gc_paused():  # a mode with CUDA graphs records in its calls
        warnings.simplefilter("ignore", KforgeWarning)
        step, chosen = compiled_step(loaded, compile_mode, table)
        loaded.prepare()
        step()  # compiles
    subject = ForwardRun(name, step)
    if loaded.device.type == "cuda" and not list_mode_options(compile_mode).get(
            "triton.cudagraphs"):
        try:
            subject = _graphed(loaded, subject, Measured(name), None)
        except KforgeError:
            pass  # a forward that cannot be captured: timed with the host released ahead
    return subject, chosen


def choose_compiled(loaded: LoadedModel, patch: SessionPatch, mode: str = "default", *,
                    reps: int = 20, warmup: int = 3, trials: int = MAX_COMPILED_TRIALS
                    ) -> tuple[KernelTable, Selection[Entry]]:
    """The patch's kernels that make the model compiled in ``mode`` faster, beyond noise and by
    at least ``MIN_COMPILED_GAIN``: a kernel takes its op (or region) out of Inductor's fusions,
    so it must beat them in the model. Candidates are the winners whose kernel beats the card's
    compiled baseline (or that have none), the largest savings first, at most ``trials`` of them;
    each is tried by compiling the model in ``TRIAL_MODES[mode]`` with the kernels kept so far
    and it, against the model compiled with none, timed by device time."""
    if mode not in TRIAL_MODES:
        raise KforgeError(f"unknown torch.compile mode {mode!r}: use one of "
                          f"{', '.join(TRIAL_MODES)}")
    candidates = by_compiled_saving(patch)[:trials]

    def measure(subset: frozenset[Entry]) -> Timing:
        torch._dynamo.reset()  # each trial compiles afresh
        trial = KernelTable([e for e in candidates if e in subset])
        subject, _ = compiled_subject(loaded, TRIAL_MODES[mode], trial, "trial")
        return time_forwards(loaded, [subject], reps, warmup)["trial"]

    selection = select(candidates, measure, min_gain=MIN_COMPILED_GAIN)
    torch._dynamo.reset()
    patch.table.reset_counts()
    return KernelTable(selection.kept), selection


@dataclass(frozen=True)
class ModeVerdict:
    """kforge's compiled model against torch.compile alone, in one mode: whether kforge's
    version is kept, and the line that says so."""

    kept: bool
    line: str


def verdict(mode: str, alone: Timing | None, with_kforge: Timing | None,
            kernels: int) -> ModeVerdict:
    """Keep kforge's compiled model only if it runs kforge kernels and is faster than torch.compile
    alone in the same mode beyond noise, by at least ``MIN_COMPILED_GAIN``."""
    if not kernels:
        return ModeVerdict(False, f"{mode}: no kforge kernel is in the compiled model: "
                              f"{INDUCTORS_OWN}")
    if alone is None or with_kforge is None:
        return ModeVerdict(False, f"{mode}: kforge's compiled model could not be timed against "
                              f"torch.compile alone: {INDUCTORS_OWN}")
    speedup = alone.median_us / with_kforge.median_us
    spread = combined_spread(with_kforge, alone)
    if significant_win(speedup, spread) and speedup >= MIN_COMPILED_GAIN:
        return ModeVerdict(True, f"{mode}: kforge's {kernels} kernel(s) make the compiled model "
                             f"{speedup:.3f}x faster than torch.compile alone "
                             f"(noise ±{spread:.1%})")
    return ModeVerdict(False, f"{mode}: with kforge's kernels the compiled model is {speedup:.3f}x "
                          f"of torch.compile alone (noise ±{spread:.1%}, at least "
                          f"{MIN_COMPILED_GAIN:.2f}x needed): {INDUCTORS_OWN}")


def hand_back(result: E2eResult) -> None:
    """For each compiled mode measured with and without kforge: where kforge's version is not
    faster beyond noise (or runs no kforge kernel), its row becomes torch.compile's own result,
    as ``kforge.compile`` would hand it back (kforge's own timing stays in ``tried``), with one
    note saying so."""
    for measured in result.subjects:
        mode = MODES.get(measured.mode)
        if mode is None or not mode.kforge or mode.compile is None:
            continue
        alone = result.subject(mode.base)
        if alone is None or alone.timing is None or measured.error or (
                measured.timing is None and measured.ran != 0):
            continue
        if measured.timing is alone.timing:  # no kernel was chosen: run_modes gave it alone's
            result.notes.append(verdict(mode.label, None, None, 0).line)
            continue
        judged = verdict(mode.label, alone.timing, measured.timing, measured.ran or 0)
        if judged.kept:
            continue
        measured.tried = measured.timing
        measured.timing, measured.host = alone.timing, alone.host
        measured.difference = alone.difference
        measured.ran = 0
        measured.kernels = own_run(mode.base)
        result.notes.append(judged.line)


def measure_session(patch: SessionPatch, loaded: LoadedModel, modes: list[Mode], *,
                    select: bool = True, reps: int = 20, warmup: int = 3,
                    trials: int = MAX_COMPILED_TRIALS) -> E2eResult:
    """Every mode of ``modes`` for a session's model, ``patch`` holding all its winners: eager +
    kforge with the winners that make eager forwards faster by measurement (without ``select``:
    those projected to pay for their guard), CUDA graphs + kforge with those that make replays
    faster (without ``select``: all), each compiled mode with those that make the model compiled
    in that mode faster (``choose_compiled``, then ``hand_back``; without ``select``: all of
    them). Notes say which winners each kforge mode left out, and why."""
    patch = patch.for_model(loaded.model)  # region kernels replace module forwards in eager
    # Every winner in place once, before minutes of timing: a forward that runs none of them is
    # another model than the session's. (After selection none may run: that is a measured result.)
    if message := unused_message(patch, compare_once(loaded, patch)[1]):
        raise KforgeError(message)
    ids = {m.id for m in modes}

    def kernels(graphs: bool) -> SessionPatch:
        if ("graphs+kforge" if graphs else "eager+kforge") not in ids:
            return patch
        if not select:
            return patch if graphs else projected_patch(patch)
        try:
            return select_measured(patch, loaded, cuda_graphs=graphs, reps=reps, warmup=warmup)
        except KforgeError:
            if not graphs:
                raise
            return patch  # the forward cannot be captured at all: the graph rows say why

    eager, graphed = kernels(False), kernels(True)
    compiled: dict[str, KernelTable] = {}
    compile_notes: list[str] = []
    by_trial_mode: dict[str, KernelTable] = {}
    for mode in modes:
        if not (mode.compile and mode.kforge) or mode.control or mode.compile in compiled:
            continue
        if not select:
            compiled[mode.compile] = patch.table
            continue
        trial_mode = TRIAL_MODES[mode.compile]
        if trial_mode not in by_trial_mode:
            by_trial_mode[trial_mode], selection = choose_compiled(
                loaded, patch, mode.compile, reps=reps, warmup=warmup, trials=trials)
            compile_notes += [f"{trial_mode} + kforge: {t.winner.label or t.winner.op}: left to "
                              f"Inductor, {t.reason}" for t in selection.dropped]
        compiled[mode.compile] = by_trial_mode[trial_mode]
    result = run_modes(loaded, modes, patched=eager, graphed=graphed, compiled=compiled,
                       projected=patch.projected, reps=reps, warmup=warmup)
    if select:
        hand_back(result)
    result.notes[:0] = [*patch.notes,
                        *(f"{MODES['eager+kforge'].label}: {n}" for n in eager.notes
                          if n not in patch.notes),
                        *(f"{MODES['graphs+kforge'].label}: {n}" for n in graphed.notes
                          if n not in patch.notes),
                        *compile_notes]
    return result


def final_verdict(loaded: LoadedModel, mode: str, table: KernelTable, reps: int,
                  warmup: int) -> ModeVerdict:
    """The model compiled in ``mode`` with ``table``'s kernels against torch.compile alone in
    the same mode, interleaved, by device time."""
    if not len(table):
        return verdict(mode, None, None, 0)
    torch._dynamo.reset()
    with torch._dynamo.config.patch(recompile_limit=64):  # both compiled models stay live
        alone, _ = compiled_subject(loaded, mode, None, "alone")
        with_kforge, chosen = compiled_subject(loaded, mode, table, "kforge")
        times = time_forwards(loaded, [alone, with_kforge], reps, warmup)
    assert chosen is not None
    judged = verdict(mode, times["alone"], times["kforge"], len(ran_kernels(chosen)))
    torch._dynamo.reset()
    return judged
