"""What a prompt says about measured results, as text for a kernel engineer.

- Repair evidence for a failed kernel: the source lines the compiler log points at, the worst
  mismatching elements (index, eager's value, the candidate's) with error norms per input set,
  NaN and inf counts, where the faults lie, a sanitizer's report, a refused plan's full message,
  a crashed worker's last output.
- Profiler feedback for a working kernel: registers and spills per kernel with the occupancy they
  allow, and hardware counters per launch (time, DRAM traffic and bandwidth, achieved occupancy),
  or why there are none.
- Eager PyTorch's own kernels for the op, with their times.

Pure text building from stored outcomes (``EvalOutcome.extra``) and the card's baseline.
"""

from __future__ import annotations

import math
import re

from kforge.core.candidate import Baseline, EvalOutcome, EvalStatus
from kforge.core.gpu import GpuInfo
from kforge.propose.llm.text import head_and_tail, one_line

WORST_SHOWN = 8  # mismatching elements listed
SOURCE_LINES_SHOWN = 12  # source lines quoted for a compiler log
EAGER_KERNELS_SHOWN = 8
CRASH_OUTPUT_CHARS = 1500
SUMMARY_FULL_CHARS = 2000
# A compiler log's pointer into the candidate's source: "candidate.cu(12): error: ..."
_SOURCE_LINE = re.compile(r"candidate\.cu\((\d+)\)")
# Registers are allocated per warp in units of this many.
REGISTER_UNIT = 256


def repair_evidence(outcome: EvalOutcome, source: str, shown_chars: int) -> list[str]:
    """The lines a repair needs beyond the compiler log: what exactly went wrong.
    ``shown_chars``: how much of the outcome's summary the result line showed."""
    lines = []
    sanitizer = outcome.extra.get("sanitizer") or {}
    if not sanitizer.get("ok", True):  # its message is the summary: shown whole here
        lines.append(f"compute-sanitizer ({sanitizer.get('tool', '?')}) report: "
                     f"{one_line(str(sanitizer.get('message', '')), SUMMARY_FULL_CHARS)}")
    elif len(summary := outcome.summary.strip()) > shown_chars:
        lines.append(f"full message: {one_line(summary, SUMMARY_FULL_CHARS)}")
    if outcome.status is EvalStatus.COMPILE_ERROR:
        lines += source_lines(outcome.compile_log, source)
    if mismatch := outcome.extra.get("mismatch"):
        lines += mismatch_lines(mismatch, outcome.extra.get("sets_passed") or [])
    if outcome.status is EvalStatus.CRASH and (stderr := outcome.extra.get("stderr")):
        lines.append("the worker's last output:\n```text\n"
                     f"{head_and_tail(str(stderr), CRASH_OUTPUT_CHARS)}\n```")
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


def mismatch_lines(mismatch: dict, sets_passed: list[dict]) -> list[str]:
    """A mismatch's evidence (``kforge.eval.verify.observe.mismatch_details``) as text."""
    shape = mismatch.get("shape")
    what = f"result {mismatch.get('result', '?')}"
    if shape is not None:
        what += f" ({mismatch.get('dtype', '?')} {shape})"
    lines = [f"mismatch evidence, {mismatch.get('where', '?')}, {what}:"]
    norms = []
    if mismatch.get("faults"):
        norms.append(f"{mismatch['faults']} elements at fault")
    if "max_abs" in mismatch:
        norms.append(f"max abs error {_number(mismatch['max_abs'])}, relative error norm "
                     f"{_number(mismatch['rel_norm'])}")
    if norms:
        lines.append("- " + "; ".join(norms))
    if span := mismatch.get("fault_span"):
        lines.append("- faults lie within indices "
                     + " x ".join(f"{lo}..{hi}" if lo != hi else f"{lo}" for lo, hi in span)
                     + (f" of shape {shape}" if shape is not None else ""))
    if nonfinite := mismatch.get("nonfinite"):
        lines.append("- NaN/inf counts (eager vs candidate): " + ", ".join(
            f"{name} {c.get('eager', 0)} vs {c.get('candidate', 0)}"
            for name, c in nonfinite.items()))
    if worst := mismatch.get("worst"):
        lines.append("- worst elements (index: eager -> candidate): " + "; ".join(
            f"{w['index']}: {_number(w['eager'])} -> {_number(w['candidate'])}"
            for w in worst[:WORST_SHOWN]))
    for entry in sets_passed:
        lines.append(f"- passed before it: {entry.get('inputs', '?')} (max abs error "
                     f"{_number(entry.get('max_abs', 0.0))}, relative error norm "
                     f"{_number(entry.get('rel_norm', 0.0))})")
    return ["\n".join(lines)]


def profile_lines(outcome: EvalOutcome, gpu: GpuInfo) -> list[str]:
    """A working kernel's registers, spills and hardware counters."""
    lines = []
    registers = outcome.extra.get("registers") or {}
    if registers:
        parts = []
        for kernel, count in registers.items():
            part = f"{kernel} {count} registers/thread"
            if limit := register_occupancy(int(count), gpu):
                part += f" (registers allow at most {limit:.0%} occupancy)"
            parts.append(part)
        spills = {True: "spills registers to local memory", False: "no spills"}.get(
            outcome.extra.get("spills"), "spills not reported")
        lines.append("ptxas: " + ", ".join(parts) + f"; {spills}")
    if counters := outcome.extra.get("counters"):
        lines += counter_lines(counters)
    return lines


def register_occupancy(registers: int, gpu: GpuInfo) -> float | None:
    """The share of an SM's threads that can be resident at ``registers`` per thread."""
    if not registers or not gpu.regs_per_sm or not gpu.max_threads_per_sm:
        return None
    per_warp = math.ceil(registers * 32 / REGISTER_UNIT) * REGISTER_UNIT
    threads = gpu.regs_per_sm // per_warp * 32
    return min(1.0, threads / gpu.max_threads_per_sm)


def counter_lines(counters: dict) -> list[str]:
    """Hardware counters per launch (``kforge.runtime.counters.CounterReport.to_dict``)."""
    tool = counters.get("tool", "hardware counters")
    kernels = counters.get("kernels") or []
    if not kernels:
        return [f"hardware counters ({tool}): {counters.get('note', 'none measured')}"]
    lines = [f"hardware counters ({tool}, one call, cold L2), per launch:"]
    for k in kernels:
        parts = []
        if (ns := k.get("duration_ns")) is not None:
            parts.append(f"{ns / 1e3:.3g} us")
        if "dram_read_bytes" in k or "dram_write_bytes" in k:
            dram = (f"DRAM {_bytes(k.get('dram_read_bytes', 0))} read + "
                    f"{_bytes(k.get('dram_write_bytes', 0))} written")
            if k.get("dram_gbs"):
                dram += f" = {k['dram_gbs']:.0f} GB/s"
            parts.append(dram)
        for key, label in (("dram_peak_pct", "of peak DRAM throughput"),
                           ("occupancy_pct", "achieved occupancy"),
                           ("sm_peak_pct", "of peak SM throughput"),
                           ("l2_hit_pct", "L2 hit rate")):
            if (value := k.get(key)) is not None:
                parts.append(f"{value:.0f}% {label}" if label.startswith("of")
                             else f"{label} {value:.0f}%")
        lines.append(f"- {k.get('kernel', '?')}: " + ", ".join(parts))
    if note := counters.get("note"):
        lines.append(f"({note})")
    return lines


def eager_section(baseline: Baseline | None) -> str | None:
    """Eager PyTorch's kernels for the op, longest first: what the candidate competes with."""
    if baseline is None or not baseline.eager_kernels:
        return None
    kernels = baseline.eager_kernels
    lines = ["# Eager PyTorch's kernels for this call (torch.profiler; the timed eager call "
             f"takes {baseline.eager.median_us:.3g} us)"]
    for k in kernels[:EAGER_KERNELS_SHOWN]:
        launches = k.get("calls", 1)
        times = f" x{launches:g}" if launches != 1 else ""
        lines.append(f"- {one_line(str(k.get('name', '?')), 200)}{times}: "
                     f"{k.get('us', 0.0):.3g} us")
    if len(kernels) > EAGER_KERNELS_SHOWN:
        lines.append(f"- ... {len(kernels) - EAGER_KERNELS_SHOWN} more")
    return "\n".join(lines)


def _bytes(value: float) -> str:
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if value >= size:
            return f"{value / size:.3g} {unit}"
    return f"{value:.0f} B"


def _number(value: object) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)
