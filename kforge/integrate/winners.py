"""Which kernels go into a model, and why the others stay on eager PyTorch: the rules, pure.

Per card (``decide``): a card's kernel replaces eager only when it passed verification and beats
eager by more than the timing noise of both measurements, and only on the GPU architecture it
was verified on; it then runs for that exact op variant alone (op, dtypes, shapes, strides,
scalar arguments), which the runtime's guard enforces.

In the model (``select``): a kernel that beats its op in isolation can still lose in the model:
outside CUDA graphs its launch path costs CPU time, and under torch.compile it takes the op out
of Inductor's fusions. So winners are tried in the model one at a time, greedily, in the
caller's order (the most promising first): ``measure(subset)`` times a whole forward with that
subset of winners in place, and a winner is kept only when the model with it is faster than
without it beyond the timing noise of both measurements (``significant_win`` over
``combined_spread``, the rule and noise estimate every kforge speedup decision uses). Every kept
winner makes the measured median strictly smaller, so the selection is never slower than the
model without any winner, by the same measure; ``measure`` is the only effect, called
``len(winners) + 1`` times. A trial that ``measure`` cannot run (``TrialFailed``: the forward
with that winner cannot be captured as a CUDA graph, say) leaves the winner out with the reason;
the model without any winner must run. ``kforge.integrate.decide`` applies these rules by
measuring the model as the user runs it.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Hashable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Generic, TypeVar

from kforge.core.candidate import Candidate, EvalOutcome, Timing
from kforge.core.opcard import VIEW_OR_COPY, OpCard
from kforge.core.reward import significant_win
from kforge.store.records import CardRow, NodeDetail, NodeRow

NO_GPU_ARCH = "none"
LABEL_WIDTH = 60
# What the guard costs on the CPU per call outside CUDA graphs, as bench/bench_guard.py measured
# it on an H200 host (docs/BENCHMARKS.md): a call of a patched op whose variant has no kernel,
# and a call that runs a kernel. The second is only the estimate for outcomes recorded before the
# evaluator measured each kernel's launch path against eager's own call (``host_extra_us``).
GUARD_MISS_US = 10.0
KERNEL_CALL_US = 15.0


@dataclass(frozen=True)
class CardChoice:
    """One card's fate: ``replaced`` by its best kernel, or kept on eager for ``reason``."""

    card: OpCard
    replaced: bool
    reason: str
    node_id: int | None = None
    speedup: float | None = None
    spread: float | None = None  # combined relative p10..p90 width of kernel and eager timings
    candidate: Candidate | None = None
    modules: list[str] = field(default_factory=list)
    # host time per call of the kernel's launch path minus eager's own call, as the evaluator
    # measured them; None where the outcome predates that measurement
    host_extra_us: float | None = None


def card_label(card: OpCard) -> str:
    """``#12 _softmax(f32[8,1024], -1, False)``, cut to a table's width."""
    text = f"#{card.id} {card.short_op}({card.signature})"
    return text if len(text) <= LABEL_WIDTH else text[:LABEL_WIDTH - 4] + "...)"


def combined_spread(kernel: Timing | None, eager: Timing | None) -> float:
    """Relative timing noise of a speedup: the p10..p90 widths of both measurements, added in
    quadrature (independent noise). Infinite when either timing is missing."""
    if kernel is None or eager is None:
        return math.inf
    return math.hypot(kernel.spread, eager.spread)


def best_nodes(nodes: Iterable[NodeRow]) -> dict[int, NodeRow]:
    """Per card id, its fastest confirmed node outside pruned subtrees (a user's prune says the
    branch must not be used); a kernel not (yet) confirmed is never used."""
    rows = {n.id: n for n in nodes}

    def pruned(node: NodeRow) -> bool:
        seen: set[int] = set()
        current: NodeRow | None = node
        while current is not None and current.id not in seen:
            if current.pruned:
                return True
            seen.add(current.id)
            current = rows.get(current.parent_id) if current.parent_id else None
        return False

    best: dict[int, NodeRow] = {}
    for node in rows.values():
        if not node.ok or not node.confirmed or node.speedup is None or pruned(node):
            continue
        held = best.get(node.card_id)
        if held is None or node.speedup > held.speedup:  # type: ignore[operator]
            best[node.card_id] = node
    return best


def decide(row: CardRow, best: NodeDetail | None, *, made_on: str,
           runs_on: str | None = None) -> CardChoice:
    """The fate of one card. ``best`` is its best usable node (see ``best_nodes``) with code and
    outcome; ``made_on`` the architecture the session was searched on; ``runs_on`` the one the
    model is about to run on (None when packaging for any)."""
    card = row.card

    def kept(reason: str, outcome: EvalOutcome | None = None, spread: float | None = None
             ) -> CardChoice:
        return CardChoice(card, False, reason, best.row.id if best else None,
                        outcome.speedup if outcome else None, spread, modules=row.modules)

    if not card.target:
        return kept("not a target (view/copy)" if card.library == VIEW_OR_COPY
                    else "not a target (it draws random numbers)")
    if best is None:
        return kept("not searched yet" if row.spent == 0 else "no verified kernel")
    outcome = best.outcome
    if outcome is None or not outcome.ok or outcome.speedup is None or best.candidate is None:
        return kept("no verified kernel")
    if made_on == NO_GPU_ARCH:
        return kept("made without a GPU", outcome)
    if runs_on is not None and runs_on != made_on:
        return kept(f"made for {made_on}, this GPU is {runs_on}", outcome)
    spread = combined_spread(outcome.timing, outcome.eager)
    speedup = outcome.speedup
    if not math.isfinite(spread):
        return kept("its timing has no spread recorded", outcome, spread)
    if speedup < 1.0:
        return kept(f"slower than eager ({speedup:.2f}x)", outcome, spread)
    if not significant_win(speedup, spread):
        return kept(f"{speedup:.2f}x is inside the timing noise (±{spread:.0%})", outcome, spread)
    return CardChoice(card, True, f"{speedup:.2f}x faster than eager (noise ±{spread:.0%})",
                    best.row.id, speedup, spread, best.candidate, row.modules,
                    measured_host_extra_us(outcome))


def measured_host_extra_us(outcome: EvalOutcome) -> float | None:
    """What a call through the kernel's launch path costs the CPU beyond eager's own call
    (``HostCost.extra_us``), or None where it was not measured."""
    return outcome.host.extra_us if outcome.host is not None else None


def projected_speedup(decisions: Iterable[CardChoice]) -> float:
    """Amdahl's law over operator time: ``1 / (1 - sum(share * (1 - 1/speedup)))`` for the
    replaced cards. A fusion region's time is its ops' time: where a region and some of its ops
    both have kernels, only the larger of the two savings counts."""
    counted = [d for d in decisions if d.replaced and d.speedup]
    saving = {id(d): d.card.share * (1.0 - 1.0 / d.speedup) for d in counted}
    for region in sorted((d for d in counted if d.card.region is not None),
                         key=lambda d: -saving[id(d)]):
        if id(region) not in saving:
            continue
        keys = set(region.card.region.get("members", ()))
        members = [id(d) for d in counted if d.card.key in keys and id(d) in saving]
        if saving[id(region)] >= sum(saving[m] for m in members):
            for member in members:
                del saving[member]
        else:
            del saving[id(region)]
    return 1.0 / max(1.0 - sum(saving.values()), 1e-9)


def worth_routing(decisions: list[CardChoice], miss_us: float = GUARD_MISS_US,
                  call_us: float = KERNEL_CALL_US) -> list[CardChoice]:
    """Outside CUDA graphs every call of a patched op passes through Python, matched or not. Keep
    an op's kernels only where the GPU time they save per forward exceeds that CPU cost, so a
    patched model is never slower than eager; under CUDA graphs (replays skip Python) every
    winner pays off and this filter is not applied. The eager-mode decision thus uses both
    figures explicitly: the saving in *device* time (the card's eager device time and the
    device-time speedup) against the extra *host* time of the launch path.

    Every call of the op pays the guard (``miss_us``); a call that runs a kernel pays its launch
    path instead of eager's own call: the measured difference where the outcome has one (a path
    measured cheaper than eager's is credited nothing, so that noise in two small host timings
    cannot let a kernel through), else the estimate ``call_us - miss_us``."""
    calls: dict[str, int] = defaultdict(int)
    saved: dict[str, float] = defaultdict(float)
    cost: dict[str, float] = defaultdict(float)
    for d in decisions:
        calls[d.card.op] += d.card.calls
        if d.replaced and d.speedup and d.card.eager_us:
            saved[d.card.op] += d.card.calls * d.card.eager_us * (1.0 - 1.0 / d.speedup)
            launch_us = (call_us - miss_us if d.host_extra_us is None
                         else max(d.host_extra_us, 0.0))
            cost[d.card.op] += d.card.calls * launch_us
    for op in cost:
        cost[op] += calls[op] * miss_us
    return [replace(d, replaced=False, reason=(
                f"{d.speedup:.2f}x, but routing {d.card.short_op} through the guard costs about "
                f"{cost[d.card.op]:.0f} us per forward outside CUDA graphs, more than its kernels "
                f"save ({saved[d.card.op]:.0f} us)"))
            if d.replaced and saved[d.card.op] <= cost[d.card.op] else d for d in decisions]


# ----- in the model: measured selection -----

K = TypeVar("K", bound=Hashable)


class TrialFailed(Exception):
    """``measure`` could not run the model with a subset of winners; the message says why."""


@dataclass(frozen=True)
class Trial(Generic[K]):
    """One winner tried on top of the winners kept before it."""

    winner: K
    timing: Timing | None  # the model with the kept winners and this one (None: it failed)
    speedup: float  # the model's time without this winner over its time with it
    spread: float  # the combined relative noise of the two timings
    kept: bool
    failed: str = ""  # why the model could not run with this winner

    @property
    def reason(self) -> str:
        if self.failed:
            return f"the model cannot run with it: {self.failed}"
        if self.kept:
            return f"the model is {self.speedup:.3f}x faster with it (noise ±{self.spread:.1%})"
        if self.speedup < 1.0:
            return f"the model is slower with it ({self.speedup:.3f}x)"
        if self.speedup > 1.0 + self.spread:
            return f"the model is {self.speedup:.3f}x with it, below the minimum gain"
        return (f"the model is {self.speedup:.3f}x with it, inside the timing noise "
                f"(±{self.spread:.1%})")


@dataclass(frozen=True)
class Selection(Generic[K]):
    """The winners kept, the model's time without any and with those kept, and every trial."""

    kept: tuple[K, ...]
    baseline: Timing
    final: Timing
    trials: tuple[Trial[K], ...]

    @property
    def speedup(self) -> float:
        """The model without any winner over the model with the kept ones (medians)."""
        return self.baseline.median_us / self.final.median_us

    @property
    def dropped(self) -> tuple[Trial[K], ...]:
        return tuple(t for t in self.trials if not t.kept)


def select(winners: Sequence[K], measure: Callable[[frozenset[K]], Timing], *,
           min_gain: float = 1.0) -> Selection[K]:
    """Greedy forward selection of ``winners`` (tried in the given order) by whole-model time;
    a winner is kept where it makes the model faster beyond noise and by at least
    ``min_gain``."""
    kept: list[K] = []
    baseline = current = measure(frozenset())
    trials = []
    for winner in winners:
        try:
            timing = measure(frozenset([*kept, winner]))
        except TrialFailed as failed:
            trials.append(Trial(winner, None, 0.0, 0.0, False, str(failed)))
            continue
        speedup = current.median_us / timing.median_us if timing.median_us > 0 else 0.0
        spread = combined_spread(timing, current)
        keep = significant_win(speedup, spread) and speedup >= min_gain
        trials.append(Trial(winner, timing, speedup, spread, keep))
        if keep:
            kept.append(winner)
            current = timing
    return Selection(tuple(kept), baseline, current, tuple(trials))
