"""Run a candidate under NVIDIA's compute-sanitizer before it may win: memcheck, racecheck,
synccheck and initcheck, each in a process of its own, on one input set.

A race, an out-of-bounds or misaligned access, a barrier misuse or a read of uninitialized memory
can leave the result right on the inputs tried; the sanitizer sees it whatever the values. Any
report about one of the candidate's own kernels rejects it with the tool's own message. The child
process (``python -m kforge.eval.sanitize JOB``) compiles the candidate, resolves its launch plan
and calls it twice through the same runner the evaluator uses.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch

from kforge.core.argspec import storage_span
from kforge.core.candidate import Candidate
from kforge.core.opcard import OpCard
from kforge.eval.inputs import Buffer, InputFactory, InputSet, build_set
from kforge.runtime.plan import Allocation, PlanRunner
from kforge.runtime.regions import register_cards

TOOLS = ("memcheck", "racecheck", "synccheck", "initcheck")
# The exit code the sanitizer returns when it found something.
FOUND = 86
# Bytes of padding memcheck puts after every allocation.
PADDING = 65536
_KERNEL = re.compile(r"\bat (?:0x[0-9a-f]+ in )?([A-Za-z_]\w*)\+0x")
# The first line of each report block.
_REPORT_START = (r"^=+\s+(?:Invalid|Uninitialized|Race|Barrier|Error|Warning|Program hit|"
                 r"Misaligned|Out of bounds)\b")


@dataclass(frozen=True)
class SanitizerReport:
    """``ok`` when no tool reported anything about the candidate's kernels; ``tool`` and
    ``message`` name the first report (or why the sanitizer could not run: ``ran`` False)."""

    ok: bool
    tool: str = ""
    message: str = ""
    ran: bool = True
    seconds: float = 0.0


def find_sanitizer() -> str | None:
    """compute-sanitizer on PATH, in $CUDA_HOME/bin, or from the ``nvidia-cuda-sanitizer-api``
    wheel (``nvidia/cu13/bin``)."""
    found = shutil.which("compute-sanitizer")
    if found:
        return found
    for home in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if home and os.access(Path(home) / "bin" / "compute-sanitizer", os.X_OK):
            return str(Path(home) / "bin" / "compute-sanitizer")
    try:
        import nvidia  # the namespace the CUDA wheels install into (nvidia/cu13/bin/...)
    except ImportError:
        return None
    for root in getattr(nvidia, "__path__", []):
        for path in sorted(Path(root).glob("*/bin/compute-sanitizer")):
            if path.is_file():
                if not os.access(path, os.X_OK):  # a wheel unpacked without its mode bits
                    path.chmod(path.stat().st_mode | 0o755)
                return str(path)
    return None


def kernel_reports(output: str, kernels: set[str]) -> list[str]:
    """The sanitizer's error blocks that concern ``kernels``: each block's first line. A block
    that names none of them (PyTorch's own kernels, a runtime memcpy) is not the candidate's."""
    found = []
    for block in re.split(f"(?m)(?={_REPORT_START})", output):
        if not re.match(_REPORT_START, block):
            continue
        named = {m.group(1) for m in _KERNEL.finditer(block)}
        if named & kernels:
            found.append(" ".join(block.split("\n", 2)[:2]).replace("=", "").strip())
    return found


def sanitize_candidate(card: OpCard, candidate: Candidate, *, samples_dir: Path | None = None,
                       device: int = 0, tools: tuple[str, ...] = TOOLS,
                       timeout_s: float = 300.0) -> SanitizerReport:
    """Run each tool on the candidate in a process of its own; the first report rejects it."""
    import time

    from kforge.core.launch_plan import parse_plan

    started = time.perf_counter()
    binary = find_sanitizer()
    if binary is None:
        return SanitizerReport(True, ran=False, message="compute-sanitizer not found: install "
                               "the CUDA toolkit or pip install nvidia-cuda-sanitizer-api")
    kernels = set(parse_plan(candidate.plan).kernel_names()) if candidate.plan else set()
    with tempfile.TemporaryDirectory(prefix="kforge-sanitize-") as folder:
        job = Path(folder) / "job.json"
        job.write_text(json.dumps({"card": card.to_dict(), "candidate": candidate.to_dict(),
                                   "samples_dir": str(samples_dir) if samples_dir else None,
                                   "device": device}))
        for tool in tools:
            # Host API errors are the CUDA runtime's own probing, not the candidate's.
            # Padding after every allocation puts an access past a tensor's end outside any
            # allocation, where memcheck sees it.
            padding = ["--padding", str(PADDING)] if tool == "memcheck" else []
            command = [binary, "--tool", tool, *padding, "--error-exitcode", str(FOUND),
                       "--report-api-errors", "no", "--print-limit", "20", sys.executable, "-m",
                       "kforge.eval.sanitize", str(job)]
            try:
                # Without PyTorch's caching allocator every tensor is an allocation of its own,
                # so an access past its end is outside any allocation, where memcheck sees it.
                done = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s,
                                      env={**os.environ, "PYTHONUNBUFFERED": "1",
                                           "PYTORCH_NO_CUDA_MEMORY_CACHING": "1"})
            except subprocess.TimeoutExpired:
                return SanitizerReport(False, tool, f"{tool} did not finish in {timeout_s:.0f} s "
                                       "(a hang under the sanitizer)",
                                       seconds=time.perf_counter() - started)
            output = done.stdout + done.stderr
            if done.returncode not in (0, FOUND):
                if "Device not supported" in output or "not supported" in output.lower():
                    return SanitizerReport(True, tool, _last_lines(output), ran=False,
                                           seconds=time.perf_counter() - started)
                return SanitizerReport(False, tool, f"{tool}: the candidate's run failed: "
                                       f"{_last_lines(output)}",
                                       seconds=time.perf_counter() - started)
            if reports := kernel_reports(output, kernels):
                return SanitizerReport(False, tool, f"compute-sanitizer {tool}: {reports[0]}"
                                       + (f" (+{len(reports) - 1} more)" if len(reports) > 1
                                          else ""), seconds=time.perf_counter() - started)
    return SanitizerReport(True, ",".join(tools), seconds=time.perf_counter() - started)


def _last_lines(text: str, n: int = 6) -> str:
    return " | ".join(ln.strip("= ").strip() for ln in text.strip().splitlines()[-n:])


# PyTorch rounds every allocation up to this many bytes, without its cache too.
ALLOCATION_GRAIN = 512


def at_the_end(like: torch.Tensor, values: torch.Tensor | None = None) -> torch.Tensor:
    """A tensor with ``like``'s shape, strides and dtype whose last element ends its allocation,
    so the first byte past it is padding; ``values`` copied in."""
    item = like.element_size()
    span = storage_span(like.shape, like.stride())
    total = -(-max(span * item, 1) // ALLOCATION_GRAIN) * ALLOCATION_GRAIN
    raw = torch.empty(total // item, dtype=like.dtype, device=like.device)
    tensor = raw.as_strided(like.shape, like.stride(), total // item - span)
    if values is not None and span:
        tensor.copy_(values)
    return tensor


def exact(inputs: InputSet) -> InputSet:
    """The same arguments, each ending where its allocation ends (no canaries around it)."""
    buffers = []
    for buf in inputs.buffers:
        view = at_the_end(buf.view, buf.view)
        base = view.as_strided((view.untyped_storage().nbytes() // view.element_size(),), (1,), 0)
        buffers.append(Buffer(buf.geometry, base, view))
    return build_set(inputs.label, inputs.args_spec, inputs.kwargs_spec, buffers,
                     inputs.device)


class TailRunner(PlanRunner):
    """The plan's runner with every new output ending where its allocation ends."""

    def allocate(self, empty=torch.empty_strided) -> Allocation:
        memory = super().allocate(empty)
        memory.outputs = [None if t is None else at_the_end(t) for t in memory.outputs]
        return memory


def run_job(path: Path) -> None:
    """The child: compile, resolve the plan, call the candidate twice on one input set, every
    tensor (inputs and outputs) ending where its allocation ends."""
    from kforge.eval.local import device_context
    from kforge.eval.pipeline import CandidateCalls, plan_runner

    job = json.loads(path.read_text())
    card, candidate = OpCard.from_dict(job["card"]), Candidate.from_dict(job["candidate"])
    register_cards([card])
    ctx = device_context(int(job["device"]))
    compiled = ctx.loader.compile(candidate)
    if not compiled.ok:
        raise SystemExit(f"does not compile: {compiled.log[:500]}")
    samples = Path(job["samples_dir"]) if job["samples_dir"] else None
    with ctx.runtime.scope():
        backend = ctx.loader.load(compiled)
        plan = plan_runner(card, candidate, backend, compiled, ctx.runtime.device).plan
        calls = CandidateCalls(TailRunner(plan, card.op, backend, ctx.runtime.device),
                               ctx.runtime, fenced=False)
        inputs = exact(InputFactory(card, ctx.runtime.device, samples, 1).sets((1,))[0])
        for _ in range(2):
            calls.call(inputs)
        ctx.runtime.sync()


if __name__ == "__main__":
    run_job(Path(sys.argv[1]))
