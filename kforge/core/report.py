"""An evaluation outcome as report sections (a title and its lines): the one wording of its facts
that ``kforge show --node`` prints, the TUI's node view shows and the LLM prompt picks from.

The sections, in order, each present only where its facts are:

- ``timing``: the timings, speedup, hold, bandwidth, floor, host cost, confirmation and wall time;
- ``evidence``: for a working kernel its registers, spills and hardware counters; for a failed one
  what exactly went wrong (the source lines a compiler log points at, the worst mismatching
  elements with error norms per input set, NaN and inf counts, where the faults lie, a
  sanitizer's report, a refused plan's full message, a crashed worker's last output);
- ``compiler log``, ``correctness`` (the checks, as JSON);
- ``more figures``: every other fact the outcome holds, by name;
- ``dropped from the stored row``: what reading a damaged stored outcome left out.

A new fact is a field of its record in ``kforge.core.outcome``: it shows under ``more figures``
by itself, or as a line here.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass

from kforge.core.candidate import FACTS, EvalOutcome, EvalStatus, Timing
from kforge.core.fmt import fmt_speedup, fmt_us
from kforge.core.gpu import NO_GPU, GpuInfo
from kforge.core.inert import capped
from kforge.core.outcome import CounterFigures, Mismatch, SetCheck
from kforge.core.schema import encode
from kforge.core.text import head_and_tail, one_line

TIMING, EVIDENCE, COMPILER_LOG, CORRECTNESS, MORE, DROPPED = (
    "timing", "evidence", "compiler log", "correctness", "more figures",
    "dropped from the stored row")
WORST_SHOWN = 8  # mismatching elements listed
SOURCE_LINES_SHOWN = 12  # source lines quoted for a compiler log
CRASH_OUTPUT_CHARS = 1500
SUMMARY_FULL_CHARS = 2000
FIGURE_CHARS = 2000  # a figure's value under "more figures"
# A compiler log's pointer into the candidate's source: "candidate.cu(12): error: ..."
_SOURCE_LINE = re.compile(r"candidate\.cu\((\d+)\)")
# Registers are allocated per warp in units of this many.
REGISTER_UNIT = 256
# Facts the sections above tell in words, by record and field (None: the whole record).
TOLD: frozenset[tuple[str, str | None]] = frozenset({
    ("host", None), ("counters", None), ("correctness", None),
    ("compile", "registers"), ("compile", "spills"),
    ("confirmation", "held"), ("confirmation", "confirmed"),
    ("confirmation", "first_speedup"), ("confirmation", "sanitizer"),
    ("failure", "mismatch"), ("failure", "sets_passed"), ("failure", "stderr")})


@dataclass(frozen=True)
class Section:
    """One part of a report: its title and its lines (a line may hold a block of text)."""

    title: str
    lines: tuple[str, ...]


def no_outcome(in_flight: bool) -> str:
    """What stands for the outcome of a node not evaluated."""
    return ("in flight: waiting for the proposer or the evaluator" if in_flight
            else "no evaluation recorded")


def outcome_sections(outcome: EvalOutcome, *, gpu: GpuInfo = NO_GPU, source: str = "",
                     summary_shown: int = SUMMARY_FULL_CHARS,
                     used: bool | None = None) -> list[Section]:
    """The report on ``outcome``: its sections that have something to say. ``gpu`` gives the
    occupancy registers allow, ``source`` the lines a compiler log points at;
    ``summary_shown``: how much of the summary the reader was shown already; ``used``: whether
    a confirmed kernel is the one its card uses (None: not said)."""
    evidence = (profile_lines(outcome, gpu) if outcome.ok
                else repair_evidence(outcome, source, summary_shown))
    sections = [Section(TIMING, tuple(timing_lines(outcome, used))),
                Section(EVIDENCE, tuple(evidence))]
    if outcome.compile_log.strip():
        sections.append(Section(COMPILER_LOG, (outcome.compile_log.rstrip(),)))
    table = (encode(outcome.correctness, defaults=False) if outcome.correctness is not None
             else {})
    if table:
        sections.append(Section(CORRECTNESS, (json.dumps(table, indent=2, sort_keys=True,
                                                          default=str),)))
    sections += [Section(MORE, tuple(more_figures(outcome))),
                 Section(DROPPED, outcome.notes)]
    return [s for s in sections if s.lines]


def section(sections: list[Section], title: str) -> tuple[str, ...]:
    """The lines of the section titled ``title``; none where it is absent."""
    return next((s.lines for s in sections if s.title == title), ())


def timing_line(name: str, t: Timing | None) -> str:
    """Every figure of a timing, each named: device time (its spread), host and wall time."""
    if t is None:
        return f"{name:<9} -"
    text = (f"{name:<9} device median {fmt_us(t.device_us)}, p10 {fmt_us(t.p10_us)}, "
            f"p90 {fmt_us(t.p90_us)} ({t.reps} reps)")
    if t.host_us is not None:
        text += f"; host {fmt_us(t.host_us)}"
    if t.wall_us is not None:
        text += f"; wall {fmt_us(t.wall_us)}"
    return text


def timing_lines(outcome: EvalOutcome, used: bool | None = None) -> list[str]:
    """The timings and the figures drawn from them."""
    lines = [timing_line("time", outcome.timing), timing_line("eager", outcome.eager),
             f"speedup   {fmt_speedup(outcome.speedup)} (eager's device time over the kernel's)"]
    confirmation = outcome.confirmation
    if confirmation is not None and confirmation.held:
        lines.append(f"held      {confirmation.held}"
                     + ("; re-timed so: this is the confirmation run's figure"
                        if confirmation.confirmed else ""))
    if outcome.bandwidth_gbs is not None:
        lines.append(f"bandwidth {outcome.bandwidth_gbs:.0f} GB/s")
    if outcome.floor_fraction is not None:
        lines.append(f"floor     runs at {outcome.floor_fraction:.0%} of the physical "
                     f"floor's speed")
    if (host := outcome.host) is not None:
        lines.append(f"patched   host time to issue one call of the patched op: "
                     f"{fmt_us(host.host_us)} through the launch path, "
                     f"{fmt_us(host.eager_host_us)} through eager's dispatch")
    if confirmation is not None and confirmation.confirmed:
        sanitizer = confirmation.sanitizer
        checked = ("" if sanitizer is None
                   else "; compute-sanitizer clean" if sanitizer.ok and sanitizer.ran
                   else f"; {one_line(sanitizer.message, SUMMARY_FULL_CHARS)}"
                   if sanitizer.message else "")
        lines.append(f"confirmed on new inputs in a fresh worker (first timed at "
                     f"{fmt_speedup(confirmation.first_speedup)}){checked}"
                     + ("; not used: it no longer beats every baseline beyond the timing noise"
                        if used is False else ""))
    lines.append(f"evaluated in {outcome.wall_s:.2f} s")
    return lines


def more_figures(outcome: EvalOutcome) -> list[str]:
    """Every fact the other sections do not tell, as ``record.field: value``."""
    lines = []
    for name in FACTS:
        record = getattr(outcome, name)
        if record is None or (name, None) in TOLD:
            continue
        lines += [f"  {name}.{key}: {capped(json.dumps(value, default=str), FIGURE_CHARS)}"
                  for key, value in encode(record, defaults=False).items()
                  if (name, key) not in TOLD]
    return sorted(lines)


# ----- evidence -----


def repair_evidence(outcome: EvalOutcome, source: str, shown_chars: int) -> list[str]:
    """The lines a repair needs beyond the compiler log: what exactly went wrong.
    ``shown_chars``: how much of the outcome's summary the result line showed."""
    lines = []
    confirmation, failure = outcome.confirmation, outcome.failure
    sanitizer = confirmation.sanitizer if confirmation is not None else None
    if sanitizer is not None and not sanitizer.ok:  # its message is the summary: shown whole
        lines.append(f"compute-sanitizer ({sanitizer.tool or '?'}) report: "
                     f"{one_line(sanitizer.message, SUMMARY_FULL_CHARS)}")
    elif len(summary := outcome.summary.strip()) > shown_chars:
        lines.append(f"full message: {one_line(summary, SUMMARY_FULL_CHARS)}")
    if outcome.status is EvalStatus.COMPILE_ERROR:
        lines += source_lines(outcome.compile_log, source)
    if failure is not None and failure.mismatch is not None:
        lines += mismatch_lines(failure.mismatch, failure.sets_passed)
    if outcome.status is EvalStatus.CRASH and failure is not None and failure.stderr:
        lines.append("the worker's last output:\n```text\n"
                     f"{head_and_tail(failure.stderr, CRASH_OUTPUT_CHARS)}\n```")
    return lines


def source_lines(log: str, source: str) -> list[str]:
    """The source lines a compiler log points at, numbered as the log numbers them."""
    numbers = list(dict.fromkeys(int(m.group(1)) for m in _SOURCE_LINE.finditer(log)))
    text = source.splitlines()
    quoted = [f"{n:5d} | {text[n - 1]}" for n in numbers[:SOURCE_LINES_SHOWN]
              if 0 < n <= len(text)]
    if not quoted:
        return []
    return ["the source lines the log points at:\n```text\n" + "\n".join(quoted) + "\n```"]


def mismatch_lines(mismatch: Mismatch, sets_passed: tuple[SetCheck, ...]) -> list[str]:
    """A mismatch's evidence as text."""
    shape = list(mismatch.shape) if mismatch.shape is not None else None
    what = f"result {mismatch.result if mismatch.result is not None else '?'}"
    if shape is not None:
        what += f" ({mismatch.dtype} {shape})"
    lines = [f"mismatch evidence, {mismatch.where}, {what}:"]
    norms = []
    if mismatch.faults:
        norms.append(f"{mismatch.faults} elements at fault")
    if mismatch.max_abs is not None:
        norms.append(f"max abs error {_number(mismatch.max_abs)}, relative error norm "
                     f"{_number(mismatch.rel_norm)}")
    if norms:
        lines.append("- " + "; ".join(norms))
    if span := mismatch.fault_span:
        lines.append("- faults lie within indices "
                     + " x ".join(f"{lo}..{hi}" if lo != hi else f"{lo}" for lo, hi in span)
                     + (f" of shape {shape}" if shape is not None else ""))
    if nonfinite := mismatch.nonfinite:
        lines.append("- NaN/inf counts (eager vs candidate): " + ", ".join(
            f"{name} {c.eager} vs {c.candidate}" for name, c in nonfinite.items()))
    if worst := mismatch.worst:
        lines.append("- worst elements (index: eager -> candidate): " + "; ".join(
            f"{list(w.index)}: {_number(w.eager)} -> {_number(w.candidate)}"
            for w in worst[:WORST_SHOWN]))
    for entry in sets_passed:
        lines.append(f"- passed before it: {entry.inputs} (max abs error "
                     f"{_number(entry.max_abs)}, relative error norm "
                     f"{_number(entry.rel_norm)})")
    return ["\n".join(lines)]


def profile_lines(outcome: EvalOutcome, gpu: GpuInfo) -> list[str]:
    """A working kernel's registers, spills and hardware counters."""
    lines = []
    facts = outcome.compile
    if facts is not None and facts.registers:
        parts = []
        for kernel, count in facts.registers.items():
            part = f"{kernel} {count} registers/thread"
            if limit := register_occupancy(count, gpu):
                part += f" (registers allow at most {limit:.0%} occupancy)"
            parts.append(part)
        spills = {True: "spills registers to local memory", False: "no spills"}.get(
            facts.spills, "spills not reported")  # type: ignore[arg-type]
        lines.append("ptxas: " + ", ".join(parts) + f"; {spills}")
    if outcome.counters is not None:
        lines += counter_lines(outcome.counters)
    return lines


def register_occupancy(registers: int, gpu: GpuInfo) -> float | None:
    """The share of an SM's threads that can be resident at ``registers`` per thread."""
    if not registers or not gpu.regs_per_sm or not gpu.max_threads_per_sm:
        return None
    per_warp = math.ceil(registers * 32 / REGISTER_UNIT) * REGISTER_UNIT
    threads = gpu.regs_per_sm // per_warp * 32
    return min(1.0, threads / gpu.max_threads_per_sm)


def counter_lines(counters: CounterFigures) -> list[str]:
    """Hardware counters per launch."""
    if not counters.kernels:
        return [f"hardware counters ({counters.tool}): {counters.note or 'none measured'}"]
    lines = [f"hardware counters ({counters.tool}, one call, cold L2), per launch:"]
    for k in counters.kernels:
        parts = []
        if k.duration_ns is not None:
            parts.append(f"{k.duration_ns / 1e3:.3g} us")
        if k.dram_read_bytes is not None or k.dram_write_bytes is not None:
            dram = (f"DRAM {_bytes(k.dram_read_bytes or 0)} read + "
                    f"{_bytes(k.dram_write_bytes or 0)} written")
            if k.dram_gbs:
                dram += f" = {k.dram_gbs:.0f} GB/s"
            parts.append(dram)
        for value, label in ((k.dram_peak_pct, "of peak DRAM throughput"),
                             (k.occupancy_pct, "achieved occupancy"),
                             (k.sm_peak_pct, "of peak SM throughput"),
                             (k.l2_hit_pct, "L2 hit rate")):
            if value is not None:
                parts.append(f"{value:.0f}% {label}" if label.startswith("of")
                             else f"{label} {value:.0f}%")
        lines.append(f"- {k.kernel}: " + ", ".join(parts))
    if counters.note:
        lines.append(f"({counters.note})")
    return lines


def _bytes(value: float) -> str:
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if value >= size:
            return f"{value / size:.3g} {unit}"
    return f"{value:.0f} B"


def _number(value: object) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)
