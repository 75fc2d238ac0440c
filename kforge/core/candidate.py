"""Candidates (a kernel proposal) and evaluation outcomes: the data that crosses the
proposer -> engine -> evaluator boundary and is stored per search node.

A candidate is CUDA C++ device code compiled with NVRTC plus a launch plan, the host side as data
that kforge interprets; see ``docs/candidate-format.md`` for the contract both sides follow.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from kforge.core import schema
from kforge.core.outcome import (
    CompileFacts,
    Confirmation,
    Correctness,
    CounterFigures,
    FailureEvidence,
    HostCost,
    Placement,
    RangeFigures,
    Work,
)
from kforge.core.schema import Origin, Record


@dataclass(frozen=True)
class Candidate(Record):
    """CUDA source + launch plan for one op card.

    ``plan`` is the host side as data (``docs/launch-plan.md``): outputs, scratch and the ordered
    launches, interpreted by kforge. ``meta`` carries what produced it (``family``, ``approach``,
    ``params`` for the built-in library; ``model`` and ``notes`` for an LLM) so a later refine or
    repair can build on it.
    """

    source: str
    # a table (``docs/launch-plan.md``) as written: the launch-plan reader judges it, naming what
    # is wrong as a LAUNCH_ERROR, so the codec passes any value through
    plan: Any = None
    meta: dict = field(default_factory=dict)

    @property
    def digest(self) -> str:
        host = json.dumps(self.plan, sort_keys=True)
        return hashlib.sha256((self.source + "\0" + host).encode()).hexdigest()[:16]

    @property
    def approach(self) -> str:
        return str(self.meta.get("approach", ""))


class EvalStatus(StrEnum):
    """What happened to a candidate. Only OK counts as a success."""

    OK = "ok"
    COMPILE_ERROR = "compile_error"  # NVRTC rejected the source
    LAUNCH_ERROR = "launch_error"  # the launch plan is malformed or a launch was refused
    CRASH = "crash"  # the worker died (illegal address, trap): the CUDA context is gone
    TIMEOUT = "timeout"  # the kernel hung; the worker was killed
    MISMATCH = "mismatch"  # ran, but the output differs from eager
    CHEAT = "cheat"  # caught doing something other than computing the op
    INFRA = "infra"  # the evaluator itself failed; not the candidate's fault

    @property
    def repairable(self) -> bool:
        """Failures a repair prompt can act on (it gets the compiler or mismatch log)."""
        return self in (EvalStatus.COMPILE_ERROR, EvalStatus.LAUNCH_ERROR, EvalStatus.CRASH,
                        EvalStatus.TIMEOUT, EvalStatus.MISMATCH)


@dataclass(frozen=True)
class Timing(Record):
    """One timed subject, in microseconds. ``median_us``, ``p10_us``, ``p90_us`` and ``reps``
    are the distribution of its DEVICE time per call (GPU time with no host gaps; see
    ``docs/evaluation.md``); ``host_us`` is the CPU time to issue one call and ``wall_us`` the
    time per call of calls issued back to back (max of host and device), where measured. Rows
    stored before those two figures existed load with None; each figure read is a finite
    number."""

    median_us: float
    p10_us: float
    p90_us: float
    reps: int
    host_us: float | None = None
    wall_us: float | None = None

    @property
    def device_us(self) -> float:
        return self.median_us

    @property
    def spread(self) -> float:
        """Relative width of the p10..p90 band around the median."""
        return (self.p90_us - self.p10_us) / self.median_us if self.median_us > 0 else math.inf


# A speedup above this over eager's device time is held: not crowned until re-timed on fresh
# inputs in a fresh worker (the confirmation run; KernelBench flags the same bound).
HELD_SPEEDUP = 10.0


def held_reason(speedup: float | None) -> str:
    """Why an outcome with ``speedup`` is held; "" where it is not."""
    if speedup is None or speedup <= HELD_SPEEDUP:
        return ""
    return (f"{speedup:.1f}x eager's device time is above {HELD_SPEEDUP:.0f}x: held until "
            "re-timed on fresh inputs in a fresh worker")


@dataclass(frozen=True)
class EvalOutcome:
    """The full verdict on one candidate: compile, correctness and timing, with the facts the
    evaluation kept as typed records (``kforge.core.outcome``), each None where not measured.

    ``speedup`` is eager's median device time over the candidate's, measured interleaved in the
    same run. ``confirmation.held`` (``held_reason``) marks a speedup too large to believe before
    it is re-timed in a fresh worker; the confirmation run's outcome is ``confirmation.confirmed``.
    ``restart`` says the evaluation left its process unfit for another (a dead GPU context,
    replaced timers, threads left running): the worker that ran it must be replaced. ``notes``:
    what reading a stored outcome dropped as damaged.
    """

    status: EvalStatus
    summary: str = ""
    compile_log: str = ""
    timing: Timing | None = None
    eager: Timing | None = None
    speedup: float | None = None
    bandwidth_gbs: float | None = None
    floor_fraction: float | None = None
    wall_s: float = 0.0
    restart: bool = False
    work: Work | None = None
    compile: CompileFacts | None = None
    host: HostCost | None = None
    confirmation: Confirmation | None = None
    ranges: RangeFigures | None = None
    failure: FailureEvidence | None = None
    correctness: Correctness | None = None
    counters: CounterFigures | None = None
    placement: Placement | None = None
    notes: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        return self.status is EvalStatus.OK

    @property
    def held(self) -> bool:
        """A speedup above ``HELD_SPEEDUP`` not yet re-timed by a confirmation run."""
        c = self.confirmation
        return c is not None and bool(c.held) and not c.confirmed

    @property
    def confirmed(self) -> bool:
        """The outcome of a confirmation run."""
        return self.confirmation is not None and self.confirmation.confirmed

    def judged_again(self, status: EvalStatus, summary: str) -> EvalOutcome:
        """A later verdict on the same candidate (its confirmation's): ``status`` and
        ``summary``, with this outcome's facts but none of its figures or correctness."""
        return EvalOutcome(status, summary, **{name: getattr(self, name) for name in FACTS
                                               if name != "correctness"})

    def to_dict(self) -> dict:
        """The stored and wire form: status and figures always, each fact where set."""
        kept = schema.encode(self, defaults=False)
        return {"status": self.status.value,
                **{name: kept.get(name, getattr(self, name)) for name in _FIGURES}, **kept}

    @classmethod
    def from_dict(cls, data: dict) -> EvalOutcome:
        """An outcome from its stored or wire form, either this version's or the one before
        (its facts in ``extra`` and ``correctness`` tables). Its status and figures are read
        strictly (a damaged one is a SchemaError); its facts leniently (``Origin.facts``: what
        is damaged is dropped and noted in ``notes``)."""
        origin = Origin.facts()
        tables = _old_tables(data, origin.notes) if "extra" in data else data
        facts = {name: schema.salvage(kind, tables[name], origin, name)
                 for name, kind in FACTS.items() if tables.get(name) is not None}
        kept = data.get("notes")
        notes = [str(n) for n in kept] if isinstance(kept, (list, tuple)) else []
        figures = {key: data[key] for key in ("status", *_FIGURES)
                   if key != "restart" and data.get(key) is not None}
        return schema.read(cls, figures, Origin.record(), what="fields", built={
            **facts, "notes": tuple(notes + origin.notes),
            "restart": bool(data.get("restart") or tables.get("restart"))})


# The fields every stored outcome writes; the others only where set.
_FIGURES = ("summary", "compile_log", "timing", "eager", "speedup", "bandwidth_gbs",
            "floor_fraction", "wall_s", "restart")
# The typed facts of an outcome, by field.
FACTS: dict[str, type] = {"work": Work, "compile": CompileFacts, "host": HostCost,
                           "confirmation": Confirmation, "ranges": RangeFigures,
                           "failure": FailureEvidence, "correctness": Correctness,
                           "counters": CounterFigures, "placement": Placement}
# Where each key of the previous form's ``extra`` went: (fact, its field); a field of None
# takes the whole value as the fact's table, a fact of "restart" the flag.
_OLD_EXTRA: dict[str, tuple[str, str | None]] = {
    **{key: ("work", key) for key in ("read_bytes", "write_bytes", "floor_us", "hard_floor_us",
                                      "flops", "tflops", "launches", "checked_timed_calls",
                                      "timing_notes")},
    "compile_s": ("compile", "seconds"), "compile_cached": ("compile", "cached"),
    "registers": ("compile", "registers"), "spills": ("compile", "spills"),
    "host_us": ("host", "host_us"), "eager_host_us": ("host", "eager_host_us"),
    **{key: ("confirmation", key) for key in ("held", "confirmed", "first_speedup",
                                              "sanitizer")},
    "confirmation_error": ("confirmation", "error"), "confirmation": ("confirmation", None),
    "ranges": ("ranges", "points"), "range_point": ("ranges", "failed_at"),
    "range_points": ("ranges", "visited"),
    **{key: ("failure", key) for key in ("mismatch", "sets_passed", "report", "stderr",
                                         "traceback")},
    "counters": ("counters", None),
    **{key: ("placement", key) for key in ("device", "node", "node_gpu")},
    "restart": ("restart", None),
}


def _old_tables(data: dict, notes: list[str]) -> dict[str, Any]:
    """The previous form's ``extra`` and ``correctness`` as this version's tables; keys it
    does not know are ignored."""
    extra = data.get("extra")
    if not isinstance(extra, dict):
        notes.append(f"extra is {extra!r:.80}, not a table: dropped")
        extra = {}
    tables: dict[str, Any] = {"correctness": data.get("correctness") or None}
    for key, value in extra.items():
        fact, name = _OLD_EXTRA.get(key, (None, None))
        if fact is None:
            continue
        if name is None:
            tables[fact] = ({**tables.get(fact, {}), **value}
                            if isinstance(value, dict) and fact != "restart" else value)
        else:
            table = tables.setdefault(fact, {})
            if isinstance(table, dict):
                table[name] = value
    if isinstance(tables.get("placement", {}).get("device"), int):
        tables["placement"]["device"] = f"cuda:{tables['placement']['device']}"
    return tables


# How far two figures of one baseline may sit apart before it is not trusted.
PROFILE_AGREEMENT = 0.20
# GPU time between two dependent kernels launched back to back on one stream (queued behind the
# timing hold): 1.8 us per kernel for an 8-kernel RMSNorm chain on an H200 (52.1 us of device
# time over 37.5 us of kernel time). Part of eager's device time, never of its kernel time.
LAUNCH_GAP_US = 2.0


def profile_disagreement(device_us: float, profile_us: float | None,
                         kernels_us: float | None = None, launches: float = 0.0) -> str:
    """Why a baseline cannot be trusted beside the model's profile; "" where it can. Like is
    compared with like, each within ``PROFILE_AGREEMENT``:

    - the profile's GPU time per call (the sum of the variant's kernels in the model) against
      eager's own kernel time per call here (``kernels_us``, torch.profiler on the card's inputs):
      the same variant at the same cost;
    - eager's device time against that kernel time plus one ``LAUNCH_GAP_US`` per launch: a
      window that held host time (the old 254.9 us for a 24.6 us RMSNorm region) is far above.

    Without a kernel time here, eager's device time is held against the profile directly."""
    def apart(value: float, reference: float) -> bool:
        return value > 0 and reference > 0 and abs(value / reference - 1.0) > PROFILE_AGREEMENT

    if kernels_us is None:
        if profile_us is not None and apart(device_us, profile_us):
            return (f"eager's device time {device_us:.1f} us is {device_us / profile_us:.2f}x "
                    f"the profile's {profile_us:.1f} us per call (more than "
                    f"{PROFILE_AGREEMENT:.0%} apart): no speedup is computed from this baseline "
                    "until they agree")
        return ""
    if profile_us is not None and apart(kernels_us, profile_us):
        return (f"eager's kernels take {kernels_us:.1f} us per call here, "
                f"{kernels_us / profile_us:.2f}x the profile's {profile_us:.1f} us (more than "
                f"{PROFILE_AGREEMENT:.0%} apart: another variant, or other inputs): no speedup "
                "is computed from this baseline until they agree")
    expected = kernels_us + launches * LAUNCH_GAP_US
    if device_us > (1.0 + PROFILE_AGREEMENT) * expected:
        return (f"eager's device time {device_us:.1f} us is {device_us / expected:.2f}x its "
                f"kernels' {kernels_us:.1f} us plus {launches:g} launch gaps (more than "
                f"{PROFILE_AGREEMENT:.0%} above: the window holds host time): no speedup is "
                "computed from this baseline until they agree")
    return ""


@dataclass(frozen=True)
class Baseline(Record):
    """Eager and torch.compile times for a card, and its physical floor, measured once per card.

    ``profile_us`` is the GPU time per call of the card's variant in the model's own profile;
    ``profile_check`` is empty when the baseline agrees with it (``profile_disagreement``), else
    the reason it does not: such a baseline gives no speedup until it agrees."""

    eager: Timing
    compiled: Timing | None = None
    compile_s: float | None = None
    floor_us: float | None = None
    note: str = ""
    # The CUDA kernels one eager call launches, longest first: {"name", "us" (per call), "calls"}
    eager_kernels: list[dict] = field(default_factory=list)
    profile_us: float | None = None
    profile_check: str = ""

    @property
    def kernels_us(self) -> float | None:
        """Eager's kernel time per call (torch.profiler: the kernels alone), where profiled."""
        return sum(k["us"] for k in self.eager_kernels) if self.eager_kernels else None

    @property
    def launches(self) -> float:
        """Kernels (and copies) one eager call launches, where profiled."""
        return sum(k.get("calls", 1) for k in self.eager_kernels)

    @property
    def trusted(self) -> bool:
        return not self.profile_check

    def speedup(self, device_us: float | None) -> float | None:
        """Eager's device time over ``device_us``; None where this baseline is not trusted."""
        if not self.trusted or not device_us or device_us <= 0:
            return None
        return self.eager.device_us / device_us



@dataclass(frozen=True)
class LlmCall:
    """One request to a language model, as recorded for cost accounting (never holds secrets)."""

    model: str
    input_tokens: int
    output_tokens: int
    usd: float
    seconds: float
    prompt: str = ""
    reply: str = ""
    error: str = ""


@dataclass(frozen=True)
class Proposal:
    """What a proposer returns: zero or more candidates, the calls it made, and why if none."""

    candidates: list[Candidate] = field(default_factory=list)
    calls: list[LlmCall] = field(default_factory=list)
    error: str = ""

    @property
    def usd(self) -> float:
        return sum(c.usd for c in self.calls)


@dataclass(frozen=True)
class Headline:
    """kforge's best whole-model mode against the best mode without kforge, as ``kforge e2e``
    timed them, with the judgement a reader needs:

    - ``gain``: kforge's best mode is faster, beyond the timings' noise;
    - ``loss``: the best mode without kforge is faster, beyond the noise;
    - ``noise``: the two differ by less than their own p90/p10 spread;
    - ``no kernels``: +kforge modes were timed but no kforge kernel ran in any of them.

    ``ratio`` is the best mode without kforge's median over kforge's best mode's (above 1:
    kforge is faster); ``spread`` the wider p90/p10 ratio of the two, where recorded.
    """

    verdict: str
    mode: str | None  # kforge's best mode with kernels that ran (a "+kforge" mode id)
    baseline: str | None  # the best mode without kforge
    ratio: float | None = None
    spread: float | None = None


KFORGE_SUFFIX = "+kforge"  # a mode id with kforge's kernels: "compile+kforge"


@dataclass(frozen=True)
class ModelMeasured:
    """The session's whole model timed (``kforge e2e``), modes named by their ids
    (``kforge.integrate.measure.MODES``): each measured mode's speedup over eager, what kforge's
    kernels gain in each ``+kforge`` mode over the same mode without them, and the speedup the
    op cards projected for the kernels used. Measurements stored before the last three fields
    existed hold none of them: ``times_us`` (each mode's median forward, in microseconds),
    ``kernels`` (how many kforge kernels actually ran in each ``+kforge`` mode) and
    ``spreads`` (each mode's p90/p10 ratio over its timed forwards)."""

    speedups: dict[str, float]
    gains: dict[str, float]
    projected: float
    times_us: dict[str, float] = field(default_factory=dict)
    kernels: dict[str, int] = field(default_factory=dict)
    spreads: dict[str, float] = field(default_factory=dict)

    def ran_kernels(self, mode: str) -> bool | None:
        """Whether kforge kernels ran in a ``+kforge`` mode; None where not recorded."""
        if mode not in self.kernels:
            return None if not self.kernels else False
        return self.kernels[mode] > 0

    def headline(self) -> Headline | None:
        """kforge's best mode (among those where its kernels ran) against the best mode
        without kforge; None where no mode was timed both with and without kforge. Modes are
        compared by their medians (``times_us``, else their speedups over eager)."""
        times = self.times_us or {mode: 1.0 / s for mode, s in self.speedups.items() if s > 0}
        without = {m: t for m, t in times.items() if not m.endswith(KFORGE_SUFFIX)}
        timed = {m: t for m, t in times.items() if m.endswith(KFORGE_SUFFIX)}
        if not without or not timed:
            return None
        baseline = min(without, key=without.__getitem__)
        ran = {m: t for m, t in timed.items() if self.ran_kernels(m) is not False}
        if not ran:
            return Headline("no kernels", None, baseline)
        mode = min(ran, key=ran.__getitem__)
        ratio = without[baseline] / ran[mode]
        spreads = [s for s in (self.spreads.get(mode), self.spreads.get(baseline))
                   if s is not None]
        spread = max(spreads) if spreads else None
        if spread is not None and 1.0 / spread < ratio < spread:
            verdict = "noise"
        else:
            verdict = "gain" if ratio > 1.0 else "loss"
        return Headline(verdict, mode, baseline, ratio, spread)
