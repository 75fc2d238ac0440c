"""The facts an evaluation keeps about one candidate, as typed records.

``kforge.core.candidate.EvalOutcome`` holds one of each where it was measured: the work and floors
of one call (``Work``), the compile (``CompileFacts``), the host cost of a call (``HostCost``),
the confirmation (``Confirmation``, with compute-sanitizer's ``SanitizerReport``), a range card's
figures (``RangeFigures``), a failure's evidence (``FailureEvidence``), the correctness checks
(``Correctness``), the hardware counters (``CounterFigures``) and where it ran (``Placement``).
Writers set fields; ``kforge.core.report`` turns them into text. They are stored through the
codec (``kforge.core.schema``): written without the fields at their default, read back leniently
(``Origin.facts``: a damaged value is dropped and noted, never an exception).
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Work:
    """What one call moves and computes, and its physical floors (device time, microseconds):
    ``floor_us`` its bytes at the copy bandwidth, ``hard_floor_us`` the bound no honest kernel
    beats. ``checked_timed_calls``: timed calls whose results were verified; ``timing_notes``:
    what the timing loop noted (holds that timed out, unheld rounds)."""

    read_bytes: int = 0
    write_bytes: int = 0
    floor_us: float | None = None
    hard_floor_us: float | None = None
    flops: int | None = None
    tflops: float | None = None
    launches: int | None = None
    checked_timed_calls: int | None = None
    timing_notes: tuple[str, ...] = ()

    @property
    def moved(self) -> int:
        return self.read_bytes + self.write_bytes


@dataclass(frozen=True)
class CompileFacts:
    """NVRTC's compile: its time, whether the cache had it, registers per thread per kernel, and
    whether ptxas spilled registers to local memory (None: not reported)."""

    seconds: float = 0.0
    cached: bool = False
    registers: dict[str, int] = field(default_factory=dict)
    spills: bool | None = None


@dataclass(frozen=True)
class HostCost:
    """Host time to issue one call of the patched op (microseconds): through the candidate's
    launch path, and through eager's own dispatch."""

    host_us: float
    eager_host_us: float

    @property
    def extra_us(self) -> float:
        """What the launch path costs the host beyond eager's call."""
        return self.host_us - self.eager_host_us


@dataclass(frozen=True)
class SanitizerReport:
    """``ok`` when no tool reported anything about the candidate's kernels; ``tool`` and
    ``message`` name the first report (or why the sanitizer could not run: ``ran`` False).
    ``tool_seconds``: each tool's wall time (a tool ended by another's report is left out);
    ``cached``: the verdict was found in the cache."""

    ok: bool
    tool: str = ""
    message: str = ""
    ran: bool = True
    seconds: float = 0.0
    tool_seconds: dict[str, float] = field(default_factory=dict)
    cached: bool = False


@dataclass(frozen=True)
class Confirmation:
    """A would-be best's confirmation. ``held``: why its first speedup was too large to believe
    before a re-timing (``kforge.core.candidate.held_reason``). A confirmation run's outcome is
    ``confirmed``, with the ``first_speedup`` it re-timed and the ``sanitizer``'s verdict;
    ``waited_s`` and ``ran_s`` its wait and run, ``at`` when it ended; ``error`` why an
    evaluator could not confirm it."""

    held: str = ""
    confirmed: bool = False
    first_speedup: float | None = None
    sanitizer: SanitizerReport | None = None
    waited_s: float | None = None
    ran_s: float | None = None
    at: float | None = None
    error: str = ""


@dataclass(frozen=True)
class RangePoint:
    """One point of a range card's verification: its symbols' values and figures there."""

    point: dict[str, int]
    speedup: float | None = None
    median_us: float | None = None
    eager_us: float | None = None


@dataclass(frozen=True)
class RangeFigures:
    """A range card's evaluation: each point's figures where it passed everywhere
    (``points``), else the point it failed at (``failed_at``) among those it was to visit."""

    points: tuple[RangePoint, ...] = ()
    failed_at: dict[str, int] | None = None
    visited: tuple[dict[str, int], ...] = ()


@dataclass(frozen=True)
class Precision:
    """The candidate's error against a higher-precision reference, next to eager's."""

    candidate_error: float
    eager_error: float
    bound: float


@dataclass(frozen=True)
class SetCheck:
    """One input set checked: the largest errors over its results (a text for NaN or inf),
    whether two runs agreed bit for bit, the bytes its storages start past an aligned address,
    the precision rule's figures and whether the address check ran on it."""

    inputs: str
    max_abs: float | str = 0.0
    rel_norm: float | str = 0.0
    deterministic: bool | None = None
    placement: int | None = None
    precision: Precision | None = None
    address_check: bool = False


@dataclass(frozen=True)
class Tolerance:
    """The tolerances one result dtype was judged with."""

    rtol: float
    atol: float
    norm: float


@dataclass(frozen=True)
class Correctness:
    """The checks a passing candidate went through: the input sets, the stress sets, the set
    checked after timing, the tolerances per dtype, and stress kinds dropped (and why)."""

    sets: tuple[SetCheck, ...] = ()
    stress: tuple[SetCheck, ...] = ()
    after_timing: SetCheck | None = None
    tolerances: dict[str, Tolerance] = field(default_factory=dict)
    stress_dropped: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Element:
    """One element at fault: its index, eager's value and the candidate's."""

    index: tuple[int, ...]
    eager: float | str
    candidate: float | str


@dataclass(frozen=True)
class NonFinite:
    """How many elements of one kind (NaN, +inf, -inf) each side holds."""

    eager: int = 0
    candidate: int = 0


@dataclass(frozen=True)
class Mismatch:
    """A failed value comparison: which check and result, the result's dtype and shape, how
    many elements are at fault, the error norms, the span of indices the faults cover per
    dimension, NaN and inf counts, and the worst elements."""

    where: str = "?"
    result: int | None = None
    shape: tuple[int, ...] | None = None
    dtype: str = "?"
    faults: int = 0
    max_abs: float | str | None = None
    rel_norm: float | str | None = None
    fault_span: tuple[tuple[int, int], ...] = ()
    nonfinite: dict[str, NonFinite] = field(default_factory=dict)
    worst: tuple[Element, ...] = ()


@dataclass(frozen=True)
class Comparison:
    """A value comparison's report (``kforge.eval.verify.compare.ValueReport``)."""

    ok: bool
    reason: str = ""
    max_abs: float | str = 0.0
    rel_norm: float | str = 0.0
    bad: int = 0
    numel: int = 0


@dataclass(frozen=True)
class FailureEvidence:
    """What a failure left for a repair: a mismatch's evidence and the sets that passed before
    it, the comparison's report, a crashed worker's last output, the evaluator's traceback."""

    mismatch: Mismatch | None = None
    sets_passed: tuple[SetCheck, ...] = ()
    report: Comparison | None = None
    stderr: str = ""
    traceback: str = ""


@dataclass(frozen=True)
class LaunchCounters:
    """One launch's hardware counters (those this GPU has), and its DRAM bandwidth."""

    kernel: str
    duration_ns: float | None = None
    dram_read_bytes: float | None = None
    dram_write_bytes: float | None = None
    dram_peak_pct: float | None = None
    occupancy_pct: float | None = None
    sm_peak_pct: float | None = None
    l2_hit_pct: float | None = None
    dram_gbs: float | None = None


@dataclass(frozen=True)
class CounterFigures:
    """The hardware counters of one call's launches in order, or ``note``: why there are none."""

    tool: str = "hardware counters"
    note: str = ""
    passes: int = 0
    kernels: tuple[LaunchCounters, ...] = ()


@dataclass(frozen=True)
class Placement:
    """Where and when an evaluation ran: the device in its worker, the host and GPU index of a
    cluster's worker; the worker's process, when it took the request (epoch seconds), how long
    of it went to waiting for the GPU's lock (others' timed sections, or its own timed section
    waiting for others' work) and the seconds of each of its steps (checks, stress, timing...)."""

    device: str = ""
    node: str = ""
    node_gpu: int | None = None
    worker: int | None = None
    started_at: float | None = None
    gpu_wait_s: float | None = None
    steps_s: dict[str, float] = field(default_factory=dict)
