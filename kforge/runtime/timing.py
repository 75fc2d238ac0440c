"""The timing protocol shared by candidates, eager and torch.compile: three figures per subject.

- **device time** (``Timing.median_us``/``device_us`` and its p10/p90): GPU time of one call with no
  host gaps. Each call is timed alone after an L2 flush, between two events on the evaluation
  stream, with the stream *held* (``Runtime.hold``) while the host queues a batch of rounds and
  released once they are all queued, so a window never waits for the host to issue its call.
  Where the hold times out (a call that synchronizes, a full launch queue) the batch is dropped
  and retried with half as many rounds; past one round the remaining rounds are timed without a
  hold, and the run says so in its notes.
- **host time** (``host_us``): CPU time to issue one call, the median over the timed calls (taken
  while the stream is held, so it never includes waiting for the GPU).
- **wall time** (``wall_us``): ``plan.wall_calls`` calls issued back to back with one sync at the
  end, total / N: what an eager user gets, about max(host, device).

Subjects are interleaved call by call (the order flips every round) so clock and thermal drift
cancel between them. The number of timed rounds follows the call time of the *pacing* subjects
only (eager, torch.compile: never a candidate, so slow warm-ups cannot steer it) and is drawn at
random within a quarter below that, before any timed call. A subject may prepare each call (new
input values, fresh outputs) and look at its result afterwards, both outside the timed window;
``after`` may only queue GPU work (copies), since the stream is held while it runs. The results
of a round stay alive until the next round ends, so no call finds another's output in a recycled
buffer. The wall-time calls follow one ``prepare(WALL_ROUND)``: a subject whose call needs state
made afresh each time (a launch plan's zeroed scratch) makes it inside ``run``. An error raised
inside the loop carries the stage it surfaced in (``timing_stage``): a kernel fault shows at the
next wait for the GPU, so the stage says which calls were in flight.

Whole forwards of a model (``time_forward_runs``: eager, CUDA graph replays, torch.compile's
modes, with and without kforge) are timed on the caller's stream, where the model runs, with
no L2 flush (a forward's own traffic is what it meets in use): device time between two events
with the GPU held busy by a spin of twice the slowest enqueue seen so far while the host
enqueues the forward, and host-inclusive time with the GPU idle before the call. Subjects are
interleaved forward by forward, the order flipping each rep, like the calls above.
"""

from __future__ import annotations

import contextlib
import functools
import math
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from kforge.core.candidate import Timing
from kforge.core.settings import TimingPlan  # the plan is a setting: [eval] warmup, ...
from kforge.runtime.device import Runtime

# The round of the wall-time calls: below every plan's warm-up, so never a checked round.
WALL_ROUND = -1
# The note an error raised inside the timing loop carries, ahead of the stage's description.
STAGE_NOTE = "kforge timing stage: "
# The hold gives up after this many times the host's expected time to queue its batch...
HOLD_MARGIN = 8.0
# ...within these bounds (seconds): long enough for a slow host, short enough that a call that
# synchronizes costs little before the loop gives up holding.
HOLD_TIMEOUT_S = (0.02, 2.0)


def summarize(samples_us: list[float], host_us: list[float] | None = None,
              wall_us: float | None = None) -> Timing:
    """Median and p10/p90 of per-call device times, with the median host time and the wall
    time per call where given."""
    if not samples_us:
        raise ValueError("no timing samples")
    p10, p50, p90 = np.percentile(np.asarray(samples_us, dtype=float), [10, 50, 90])
    host = float(np.median(host_us)) if host_us else None
    return Timing(median_us=float(p50), p10_us=float(p10), p90_us=float(p90),
                  reps=len(samples_us), host_us=host, wall_us=wall_us)


def reps_for(round_s: float, plan: TimingPlan) -> int:
    """Rounds that fit the budget, within the plan's bounds."""
    if round_s <= 0:
        return plan.max_reps
    return int(min(plan.max_reps, max(plan.min_reps, plan.budget_s / round_s)))


def drawn_reps(round_s: float, plan: TimingPlan, chance: random.Random) -> int:
    """``reps_for`` less a random part of up to a quarter (never under the plan's minimum), so a
    subject that knows the call time still cannot tell which timed call is the last."""
    most = reps_for(round_s, plan)
    least = max(plan.min_reps, math.floor(0.75 * most))
    return chance.randint(min(least, most), most)


@dataclass(frozen=True)
class Subject:
    """One timed subject. ``run(r)`` is the timed call of round ``r``; ``prepare(r)`` runs
    before it and ``after(r, result)`` after it, both outside the timed window (before the L2
    flush and after the stop event); ``after`` only queues GPU work. ``paces``: whether this
    subject's call time sets the number of timed rounds (never for a candidate)."""

    run: Callable[[int], Any]
    prepare: Callable[[int], None] | None = None
    after: Callable[[int, Any], None] | None = None
    paces: bool = True


@dataclass
class TimedRun:
    timings: dict[str, Timing]
    last: dict[str, tuple[int, Any]]  # per subject: the round and result of its last call
    notes: list[str] = field(default_factory=list)  # holds that timed out, unheld rounds


class _Loop:
    def __init__(self, subjects: dict[str, Subject], runtime: Runtime, plan: TimingPlan) -> None:
        self.named = subjects
        self.names = list(subjects)
        self.runtime = runtime
        self.plan = plan
        self.samples: dict[str, list[float]] = {name: [] for name in self.names}
        self.host: dict[str, list[float]] = {name: [] for name in self.names}
        self.stage = "start"  # what the loop is doing, for the note on an error

    def call(self, name: str, r: int, timed: bool, pending: list | None = None) -> Any:
        subject = self.named[name]
        if subject.prepare is not None:
            subject.prepare(r)
        self.runtime.flush()
        token = self.runtime.start() if timed else None
        issued = time.perf_counter()
        result = subject.run(r)
        host_s = time.perf_counter() - issued
        if timed:
            assert pending is not None
            pending.append((name, self.runtime.stop(token), host_s))
        if subject.after is not None:
            subject.after(r, result)
        return result

    def warmup(self) -> tuple[float, float]:
        """The warm-up rounds (which also fill the caching allocator, so no timed call waits on
        ``cudaMalloc``): the pacing subjects' time per round, and the host's time to queue one
        round of every subject."""
        paced = [n for n in self.names if self.named[n].paces] or self.names
        spent = {name: 0.0 for name in self.names}
        queued = 0.0
        for r in range(self.plan.warmup):
            for name in self.names:
                self.stage = f"warm-up round {r}, {name}"
                self.runtime.sync()
                start = time.perf_counter()
                self.call(name, r, timed=False)
                queued += time.perf_counter() - start
                self.runtime.sync()
                spent[name] += time.perf_counter() - start
        self.runtime.sync()
        rounds = max(self.plan.warmup, 1)
        # An unpaced subject (a candidate) is counted as costing what the pacing ones cost.
        per_subject = sum(spent[n] for n in paced) / len(paced) / rounds
        return per_subject * len(self.names), queued / rounds

    def batch(self, rounds: list[int], held: bool, queue_s: float) -> tuple[bool, dict]:
        """Time ``rounds`` (held, or not); False where the hold gave up before its release."""
        pending: list[tuple[str, Any, float]] = []
        last: dict[str, tuple[int, Any]] = {}
        self.stage = (f"timed rounds {rounds[0]}..{rounds[-1]}" if rounds else "timed rounds") + (
            " behind a hold" if held else "")
        if held:
            low, high = HOLD_TIMEOUT_S
            self.runtime.hold(min(high, max(low, HOLD_MARGIN * queue_s * len(rounds))))
        try:
            for r in rounds:
                current = {}  # this round's results stay alive until the next round has run
                for name in self.names if r % 2 == 0 else reversed(self.names):
                    current[name] = (r, self.call(name, r, timed=True, pending=pending))
                last = current
        except BaseException:
            if held:  # a call that failed leaves no stream held behind it
                self.runtime.release()
            raise
        clean = self.runtime.release() if held else True
        self.runtime.sync()
        if clean:
            for name, token, host_s in pending:
                self.samples[name].append(self.runtime.elapsed_us(token))
                self.host[name].append(host_s * 1e6)
        return clean, last

    def wall(self, name: str) -> float:
        """Time per call of ``plan.wall_calls`` calls issued back to back, one sync."""
        subject = self.named[name]
        calls = max(1, self.plan.wall_calls)
        self.stage = f"{calls} wall-time calls of {name} back to back"
        if subject.prepare is not None:
            subject.prepare(WALL_ROUND)
        self.runtime.sync()
        start = time.perf_counter()
        result = None
        for _ in range(calls):
            result = subject.run(WALL_ROUND)
        self.runtime.sync()
        spent = time.perf_counter() - start
        if subject.after is not None:
            subject.after(WALL_ROUND, result)
        return spent / calls * 1e6


def time_interleaved(subjects: dict[str, Subject | Callable[[int], Any]], runtime: Runtime,
                     plan: TimingPlan = TimingPlan(),
                     chance: random.Random | None = None) -> TimedRun:
    """Time each subject interleaved with the others, round by round: device, host and wall
    time per call (module docstring)."""
    named = {name: s if isinstance(s, Subject) else Subject(s) for name, s in subjects.items()}
    chance = chance or random.Random(random.SystemRandom().getrandbits(64))
    loop = _Loop(named, runtime, plan)
    try:
        with runtime.exclusive():  # no other process's work on the GPU while it is timed
            return _time(loop, plan, chance)
    except Exception as exc:
        exc.add_note(STAGE_NOTE + loop.stage)
        raise


def timing_stage(exc: BaseException) -> str:
    """The stage of the timing loop ``exc`` surfaced in, or "timing" where it carries none."""
    notes = [n for n in getattr(exc, "__notes__", ()) if n.startswith(STAGE_NOTE)]
    return notes[-1].removeprefix(STAGE_NOTE) if notes else "timing"


def _time(loop: _Loop, plan: TimingPlan, chance: random.Random) -> TimedRun:
    round_s, queue_s = loop.warmup()
    reps = drawn_reps(round_s, plan, chance)
    todo = list(range(plan.warmup, plan.warmup + reps))  # decided before any timed call
    notes: list[str] = []
    size = plan.hold_rounds
    held = size > 0
    last: dict[str, tuple[int, Any]] = {}
    while todo:
        batch = todo[:size] if held else todo
        clean, got = loop.batch(batch, held, queue_s)
        last = got or last
        if clean:
            todo = todo[len(batch):]
            continue
        notes.append(f"the hold timed out with {len(batch)} rounds queued")
        size //= 2
        if size == 0:
            held = False
            notes.append("the remaining rounds were timed without a hold: their windows may "
                         "hold host time")
    if any(not values for values in loop.samples.values()):
        raise RuntimeError("no timing samples: " + "; ".join(notes))
    walls = {name: loop.wall(name) for name in loop.names} if plan.wall_calls > 0 else {}
    timings = {name: summarize(loop.samples[name], loop.host[name], walls.get(name))
               for name in loop.names}
    return TimedRun(timings, last, notes)



# ----- whole forwards -----


@dataclass
class ForwardRun:
    """One way of running a whole forward, for ``time_forward_runs``."""

    name: str
    step: Callable[[], Any]  # one timed forward
    scope: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext
    prepare: bool = True  # restore per-step state before each forward (not for graph replays)
    keep: Any = None  # what a captured graph reads and writes, kept alive while it replays


# The spin ahead of a forward: twice the slowest enqueue seen so far, and this much more (us).
HOLD_MARGIN_US = 50.0


def time_forward_runs(subjects: list[ForwardRun], device: torch.device, reps: int, warmup: int,
                      *, restore: Callable[[], Any] = lambda: None, host: bool = True
                      ) -> dict[str, tuple[Timing, Timing | None]]:
    """Per subject, device time per forward and (with ``host``) host-inclusive time (the GPU
    idle before the call), interleaved rep by rep, the order flipped each rep; ``restore`` puts
    per-step state back before each forward of a subject that ``prepare``s (on the CPU: wall
    time)."""
    holds = {s.name: 0.0 for s in subjects}
    stage = "start"  # the forward in flight, for the note on an error
    timed: dict[str, list[Callable[[], float]]] = {s.name: [] for s in subjects}
    inclusive: dict[str, list[Callable[[], float]]] = {s.name: [] for s in subjects}
    try:
        for r in range(warmup):
            for subject in subjects:
                stage = f"warm-up forward {r} of {subject.name}"
                holds[subject.name] = max(holds[subject.name],
                                          _one_forward(subject, device, restore, None)[1])
        for r in range(reps):
            for subject in subjects if r % 2 == 0 else reversed(subjects):
                stage = f"timed forward {r} of {subject.name}"
                # hold twice the slowest enqueue seen so far: the host is never the bottleneck
                read, enqueue_us = _one_forward(subject, device, restore,
                                                2 * holds[subject.name] + HOLD_MARGIN_US)
                holds[subject.name] = max(holds[subject.name], enqueue_us)
                timed[subject.name].append(read)
                if host:
                    stage = f"host-inclusive forward {r} of {subject.name}"
                    inclusive[subject.name].append(
                        _one_forward(subject, device, restore, None)[0])
        stage = "the final wait for the GPU"
        if device.type == "cuda":
            torch.cuda.synchronize(device)
    except Exception as exc:  # a kernel fault shows at a later call: with CUDA_LAUNCH_BLOCKING=1
        exc.add_note(STAGE_NOTE + stage)  # the stage names the forward that faulted
        raise
    return {name: (summarize([read() for read in taken]),
                   summarize([read() for read in inclusive[name]]) if inclusive[name] else None)
            for name, taken in timed.items() if taken}


def _one_forward(subject: ForwardRun, device: torch.device, restore: Callable[[], Any],
                 hold_us: float | None) -> tuple[Callable[[], float], float]:
    """Run one forward of ``subject``: its time in us, read once the device is synchronized
    (between CUDA events on the stream; on the CPU, wall time), and the host time it took to
    enqueue. With ``hold_us`` the GPU spins that long first, so the host enqueues the forward
    ahead of the GPU and the events time device work alone."""
    if subject.prepare:
        restore()
    if device.type != "cuda":
        with subject.scope():
            start = time.perf_counter()
            subject.step()
            seconds = time.perf_counter() - start
        return (lambda: seconds * 1e6), seconds * 1e6
    begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    with subject.scope():
        if hold_us is not None:
            torch.cuda._sleep(int(hold_us * _spin_cycles_per_us(device)))
        started = time.perf_counter()
        begin.record()
        subject.step()
        end.record()
        enqueue_us = (time.perf_counter() - started) * 1e6
    return (lambda: begin.elapsed_time(end) * 1e3), enqueue_us


@functools.cache
def _spin_cycles_per_us(device: torch.device) -> float:
    """How many ``torch.cuda._sleep`` cycles hold ``device`` for a microsecond."""
    probe = 1_000_000
    with torch.cuda.device(device):
        torch.cuda._sleep(probe // 10)  # wake the clocks first
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        begin.record()
        torch.cuda._sleep(probe)
        end.record()
        end.synchronize()
    return probe / (begin.elapsed_time(end) * 1e3)
