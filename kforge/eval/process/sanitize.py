"""Run a candidate under NVIDIA's compute-sanitizer before it may win, and cache the verdict.

A race, an out-of-bounds or misaligned access, a barrier misuse or a read of uninitialized memory
can leave the result right on the inputs tried; the sanitizer sees it whatever the values. The tools
a kernel needs run at once, each in a process of its own, and the first report ends the others:
memcheck and initcheck always, racecheck where a kernel uses shared memory, synccheck where it has
barriers or warp-synchronous instructions (read from the cubin, with the source and the plan as a
second opinion). The child (``kforge.eval.process.sanitize_child``) launches nothing but the
candidate's kernels, straight through the driver, so every report is the candidate's, whichever
function of its module it names; memcheck, racecheck and synccheck are also told the candidate's
kernels by name (``--kernel-name``). The child needs neither torch nor kforge's evaluator: this
process resolves the launch plan for the card's variant, makes one input set (the evaluator's first:
a captured sample, else seed 1) on the CPU and writes it as bytes, and maps every kernel parameter
to a buffer or a typed scalar (``job_for``), so a tool's run costs the kernel's calls and a driver
context, not a torch start. The child calls the candidate as many times as it is timed for (a count
it cannot know in advance).

Verdicts are kept in ``<cache>/sanitizer/`` by (cubin, launch plan, op variant, sanitizer
version, checking policy): the same kernel found again costs nothing.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import random
import re
import shutil
import subprocess
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch

from kforge.core.argspec import storage_span
from kforge.core.candidate import Candidate
from kforge.core.child import child_env, python_command
from kforge.core.launch_plan import PlanError, parse_plan
from kforge.core.opcard import DTYPE_BYTES, OpCard
from kforge.core.outcome import SanitizerReport
from kforge.errors import KforgeError
from kforge.eval.process.sanitize_child import ChildLaunch, Job, Memory, Param
from kforge.eval.verify.inputs import InputFactory
from kforge.runtime.cubin_elf import cubin_kernels
from kforge.runtime.plan import NULL, Allocation, PlanRunner, resolve_for

TOOLS = ("memcheck", "racecheck", "synccheck", "initcheck")
# The exit code the sanitizer returns when it found something.
FOUND = 86
# Bytes of padding memcheck puts after every allocation.
PADDING = 65536
# The first line of each report block.
_REPORT_START = (r"^=+\s+(?:Invalid|Uninitialized|Race|Barrier|Error|Warning|Program hit|"
                 r"Misaligned|Out of bounds)\b")
# Calls under the sanitizer: as many as the candidate is timed for, at most MAX_CALLS, plus a
# random few, so no kernel can count on how many there are. Each instrumented call of a large
# region kernel takes 0.1-1 s: 256 of them kept every confirmation of a Llama-sized search
# running past the search's end on an H200.
MIN_CALLS, MAX_CALLS, EXTRA_CALLS = 8, 24, 8
# A tool's verdict when the child failed without a report (a fault another tool may name).
RUN_FAILED = "the candidate's run failed"
# Bump when what a verdict covers changes: cached verdicts of another policy are not reused.
POLICY = 4
# Source text that means a kernel may synchronize or share memory in ways the cubin's figures
# could miss (inline PTX above all): the tools that check those run.
_SYNC_TEXT = re.compile(r"__syncthreads|__syncwarp|bar\.|barrier|\.sync\(|grid_group|\basm\b")
_SHARED_TEXT = re.compile(r"__shared__|\basm\b")
# A block about a kernel names a device location: ``at NAME+0x..`` or ``at 0x.. in NAME``.
_DEVICE_FRAME = re.compile(r"\+0x[0-9a-f]+|\bat 0x[0-9a-f]+ in \S")
# What a sanitizer says when it does not take the options it was given.
_REFUSED = re.compile(r"ill-formed|[Uu]nrecognized option|[Uu]nknown option|invalid filter")
# Blocks that are about the run, not about a kernel: the child's exit (its own log says why), a
# runtime copy's source (the evaluator's own copies).
_ABOUT_THE_RUN = re.compile(r"process didn't terminate|Program hit|not supported|"
                            r"Target application|on access by cu")


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


@functools.cache
def sanitizer_version(binary: str) -> str:
    """The sanitizer's version line (part of a cached verdict's key)."""
    try:
        done = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    lines = [ln.strip() for ln in done.stdout.splitlines() if "version" in ln.lower()]
    return (lines or [done.stdout.strip()[-80:]])[-1]


def reports(output: str) -> list[str]:
    """The first line of each error block about a kernel (one naming a device location) in a
    tool's output: each one is the candidate's, whichever function of its module it names (see
    the module's note on initcheck)."""
    found = []
    for block in re.split(f"(?m)(?={_REPORT_START})", output):
        if (re.match(_REPORT_START, block) and _DEVICE_FRAME.search(block)
                and not _ABOUT_THE_RUN.search(block.split("\n")[0])):
            found.append(" ".join(" ".join(block.split("\n", 2)[:2]).replace("=", "").split()))
    return found


def needed_tools(candidate: Candidate, cubin: bytes | None) -> tuple[str, ...]:
    """The tools ``candidate`` needs: memcheck and initcheck always; racecheck where a kernel
    of its plan uses shared memory (static in the cubin, dynamic in the plan) and synccheck
    where one has barriers or warp-synchronous instructions. Without a readable cubin, or where
    the source says so (inline PTX included), the tools the source may need run too."""
    plan = parse_plan(candidate.plan)
    names = set(plan.kernel_names())
    kernels = {n: k for n, k in cubin_kernels(cubin or b"").items() if n in names}
    known = bool(kernels) and set(kernels) == names
    shared = (not known or any(k.shared_bytes for k in kernels.values())
              or any(launch.shared_mem.canonical != "0" for launch in plan.launches)
              or bool(_SHARED_TEXT.search(candidate.source)))
    syncs = (not known or any(k.barriers or k.warp_syncs for k in kernels.values())
             or bool(_SYNC_TEXT.search(candidate.source)))
    return tuple(t for t in TOOLS if t in ("memcheck", "initcheck")
                 or (t == "racecheck" and shared) or (t == "synccheck" and syncs))


def calls_to_check(timed_calls: int | None, rng: random.Random | None = None) -> int:
    """How many times the child calls the candidate: as many as it was timed for (bounded),
    and a random few more."""
    rng = rng or random.Random()
    base = min(max(timed_calls or MIN_CALLS, MIN_CALLS), MAX_CALLS)
    return base + rng.randrange(EXTRA_CALLS)


def kernel_filter(names: list[str]) -> list[str]:
    """The options that select exactly the launches of ``names``' kernels: one
    ``--kernel-name kne=NAME`` each (the sanitizer matches a kernel's full symbol, mangled or
    not, and the options add up)."""
    return [arg for name in sorted(set(names)) for arg in ("--kernel-name", f"kne={name}")]


def verdict_key(card: OpCard, candidate: Candidate, cubin: bytes | None, version: str) -> str:
    """What a verdict depends on: the code (the cubin where there is one, else the source and
    its options), the launch plan, the op variant, the sanitizer and the checking policy."""
    code = (hashlib.sha256(cubin).hexdigest() if cubin
            else hashlib.sha256((candidate.source + json.dumps(
                candidate.meta.get("nvrtc_options") or [])).encode()).hexdigest())
    text = json.dumps([code, candidate.plan, card.key, version, POLICY], sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:32]


class VerdictCache:
    """Verdicts by key, one small JSON file each (``<cache>/sanitizer/<key>.json``)."""

    def __init__(self, folder: Path | None = None) -> None:
        if folder is None:
            from kforge.runtime.cache import cache_dir

            folder = cache_dir() / "sanitizer"
        self.folder = folder

    def get(self, key: str) -> SanitizerReport | None:
        try:
            data = json.loads((self.folder / f"{key}.json").read_text())
            return SanitizerReport(**{**data, "cached": True})
        except (OSError, ValueError, TypeError):
            return None

    def put(self, key: str, report: SanitizerReport) -> None:
        """Keep a verdict the tools reached: a pass, or a tool's report; not a run that checked
        nothing or one cut short by the time limit."""
        if not report.ran or not (report.ok or report.tool in report.tool_seconds):
            return
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            tmp = self.folder / f"{key}.{os.getpid()}.tmp"
            tmp.write_text(json.dumps({**asdict(report), "cached": False}))
            tmp.replace(self.folder / f"{key}.json")
        except OSError:
            pass  # a cache that cannot be written costs time, never a verdict


def tool_command(binary: str, tool: str, kernels: list[str], job: Path) -> list[str]:
    """One tool's command line. Host API errors are the CUDA runtime's own probing, not the
    candidate's; padding after every allocation puts an access past a tensor's end outside any
    allocation, where memcheck sees it. initcheck watches every kernel: what it knows to be
    written is what instrumented kernels wrote, so behind a filter the inputs PyTorch's own
    kernels filled read as uninitialized, and each such report's host backtrace kept an honest
    kernel's check running for minutes on an H100."""
    padding = ["--padding", str(PADDING)] if tool == "memcheck" else []
    only = kernel_filter(kernels) if tool != "initcheck" else []
    return [binary, "--tool", tool, *padding, *only,
            "--error-exitcode", str(FOUND),
            "--report-api-errors", "no", "--print-limit", "20",
            *python_command("kforge.eval.process.sanitize_child", str(job))]


def sanitize_candidate(card: OpCard, candidate: Candidate, *, samples_dir: Path | None = None,
                       device: int = 0, tools: tuple[str, ...] | None = None,
                       cubin: bytes | None = None, timed_calls: int | None = None,
                       cache: VerdictCache | None = None, stop: threading.Event | None = None,
                       timeout_s: float = 300.0) -> SanitizerReport:
    """Run the tools ``candidate`` needs (``tools``: these instead) at once, each in a process
    of its own; the first report rejects it and stops the others. ``cubin``: the compiled
    candidate, which chooses the tools and keys the cache (compiled here where not given);
    ``timed_calls``: how many calls its
    timing made; ``cache``: where verdicts are looked up and kept (None: not cached); ``stop``:
    set by another thread to end the run (its verdict is then none: ``ran`` False)."""
    started = time.perf_counter()
    binary = find_sanitizer()
    if binary is None:
        return SanitizerReport(True, ran=False, message="compute-sanitizer not found: install "
                               "the CUDA toolkit or pip install nvidia-cuda-sanitizer-api")
    cubin = cubin or compiled_here(candidate, device)
    if cubin is None:
        return SanitizerReport(True, ran=False, message="no cubin to check: NVRTC did not "
                               "compile the candidate here")
    key = verdict_key(card, candidate, cubin, sanitizer_version(binary))
    if cache is not None and tools is None and (hit := cache.get(key)) is not None:
        return hit
    chosen = tools or needed_tools(candidate, cubin)
    kernels = list(parse_plan(candidate.plan).kernel_names()) if candidate.plan else []
    with tempfile.TemporaryDirectory(prefix="kforge-sanitize-") as folder:
        try:
            job = write_job(job_for(card, candidate, cubin, Path(folder), samples_dir=samples_dir,
                                    device=device, calls=calls_to_check(timed_calls)),
                            Path(folder))
        except (KforgeError, PlanError, ValueError) as exc:
            return SanitizerReport(True, ran=False, message=f"the sanitizer's run could not be "
                                   f"prepared: {exc}", seconds=_since(started))
        report = _run_tools(binary, chosen, kernels, job, Path(folder), timeout_s, started,
                            stop or threading.Event())
    if cache is not None and tools is None:
        cache.put(key, report)
    return report


def compiled_here(candidate: Candidate, device: int) -> bytes | None:
    """The candidate's cubin for GPU ``device``, compiled here (the compile cache's, as a rule);
    None where NVRTC or the GPU cannot be reached or the source does not compile."""
    try:
        from kforge.runtime.cubin import device_arch
        from kforge.runtime.kernel_loader import NvrtcLoader

        compiled = NvrtcLoader(device, device_arch(device)).compile(candidate)
    except Exception:  # noqa: BLE001 - no NVRTC or no GPU here: nothing to check
        return None
    return compiled.cubin if compiled.ok else None


def _run_tools(binary: str, tools: tuple[str, ...], kernels: list[str], job: Path, folder: Path,
               timeout_s: float, started: float, stop: threading.Event) -> SanitizerReport:
    env = child_env()
    running: dict[str, tuple[subprocess.Popen, Path, float]] = {}
    seconds: dict[str, float] = {}
    # A kernel that faults ends the child under every tool; the tool that checks for the fault
    # says what it was, so a failed run without a report waits for the other tools' verdicts.
    failed: SanitizerReport | None = None
    try:
        for tool in tools:
            log = folder / f"{tool}.log"
            with open(log, "w") as out:
                running[tool] = (subprocess.Popen(tool_command(binary, tool, kernels, job),
                                                  stdout=out, stderr=subprocess.STDOUT, env=env),
                                 log, time.perf_counter())
        while running:
            if stop.is_set():
                return SanitizerReport(True, ran=False, message="stopped before a verdict",
                                       seconds=_since(started), tool_seconds=seconds)
            if time.perf_counter() - started > timeout_s:
                tool = next(iter(running))
                return SanitizerReport(False, tool, f"{tool} did not finish in {timeout_s:.0f} s "
                                       "(a hang under the sanitizer)", seconds=_since(started),
                                       tool_seconds=seconds)
            for tool, (process, log, began) in list(running.items()):
                code = process.poll()
                if code is None:
                    continue
                del running[tool]
                seconds[tool] = time.perf_counter() - began
                verdict = _verdict(tool, code, log.read_text(errors="replace"))
                if verdict is not None and RUN_FAILED in verdict.message:
                    failed = failed or verdict
                elif verdict is not None:
                    return replace(verdict, seconds=_since(started), tool_seconds=dict(seconds))
            stop.wait(0.05)
    finally:
        for process, _, _ in running.values():
            process.kill()
            process.wait()
    if failed is not None:
        return replace(failed, seconds=_since(started), tool_seconds=dict(seconds))
    return SanitizerReport(True, ",".join(tools), seconds=_since(started), tool_seconds=seconds)


def _verdict(tool: str, code: int, output: str) -> SanitizerReport | None:
    """One finished tool's verdict, or None when it found nothing."""
    if found := reports(output):
        return SanitizerReport(False, tool, f"compute-sanitizer {tool}: {found[0]}"
                               + (f" (+{len(found) - 1} more)" if len(found) > 1 else ""))
    if code == 0:
        return None
    # Only the sanitizer's own lines count: a kernel's printf lands in the same output.
    own = "\n".join(line for line in output.splitlines() if line.startswith("========="))
    if "not supported" in own.lower():
        return SanitizerReport(True, tool, _last_lines(output), ran=False)
    if _REFUSED.search(output):  # this sanitizer's options differ: nothing was checked
        return SanitizerReport(False, tool, f"compute-sanitizer refused its options: "
                               f"{_last_lines(output, 2)}", ran=False)
    if code == FOUND:
        return SanitizerReport(False, tool, f"compute-sanitizer {tool}: {_last_lines(output)}")
    return SanitizerReport(False, tool, f"{tool}: {RUN_FAILED}: {_last_lines(output)}")


def _since(started: float) -> float:
    return time.perf_counter() - started


def _last_lines(text: str, n: int = 6) -> str:
    return " | ".join(ln.strip("= ").strip() for ln in text.strip().splitlines()[-n:])


# ----- the child's job -----

# Element types of the numpy scalars the launch path packs, as the child names them.
_SCALARS = {"int32": "i32", "uint32": "u32", "int64": "i64", "uint64": "u64",
            "float32": "f32", "float64": "f64", "bool": "bool"}


@dataclass(frozen=True)
class _Slot:
    """A per-call buffer the launch path is given in place of an output or scratch tensor."""

    index: int


class _Recorder:
    """A launch backend that records each launch's parameters instead of running it."""

    def __init__(self) -> None:
        self.params: list[list] = []

    def launch(self, name: str, grid: tuple, block: tuple, shared_mem: int, params: list) -> None:
        self.params.append(list(params))

    def has_kernel(self, name: str) -> bool:
        return True

    def param_widths(self, name: str) -> list[int] | None:
        return None


def job_for(card: OpCard, candidate: Candidate, cubin: bytes, folder: Path, *,
            samples_dir: Path | None = None, device: int = 0, calls: int = MIN_CALLS,
            phases: bool = False) -> Job:
    """The child's job for ``candidate`` on ``card``: its plan resolved for the card's variant,
    one input set (a captured sample, else seed 1: the evaluator's first) made on the CPU and
    written to ``folder`` as bytes, and each launch's parameters mapped to buffers and scalars
    by kforge's own launch path, run against a recorder. Raises PlanError or KforgeError where
    the plan does not resolve or a parameter names no buffer."""
    plan = resolve_for(candidate.plan, card.op, card.args, card.kwargs)
    inputs = InputFactory(card, torch.device("cpu"), samples_dir, 1).sets((1,))[0]
    blob = bytearray()
    memories, starts = [], {}
    for i, buf in enumerate(inputs.buffers):
        view = buf.view
        span = storage_span(view.shape, view.stride())
        values = view.as_strided((span,), (1,), view.storage_offset()).contiguous()
        raw = values.view(torch.uint8).numpy().tobytes() if span else b""
        memories.append(Memory(len(raw), "data", (len(blob), len(raw))))
        blob += raw
        starts.setdefault(view.data_ptr(), i)
    per_call = [Memory(storage_span(o.shape, o.stride) * DTYPE_BYTES.get(o.dtype, 4))
                for o in plan.outputs if o.kind == "new"]
    per_call += [Memory(max(s.nbytes, 1), "zero" if s.zero else "poison") for s in plan.scratch]
    first = len(memories)
    slots, new = [], 0
    for o in plan.outputs:
        slots.append(_Slot(first + new) if o.kind == "new" else None)
        new += o.kind == "new"
    scratch = [_Slot(first + new + j) for j in range(len(plan.scratch))]
    recorder = _Recorder()
    PlanRunner(plan, card.op, recorder, torch.device("cpu")).launch(
        inputs.args, inputs.kwargs, Allocation(slots, scratch))

    def param(value: object) -> Param:
        if isinstance(value, _Slot):
            return Param("memory", value.index)
        if isinstance(value, torch.Tensor):
            if value.data_ptr() not in starts:
                raise KforgeError("a launch parameter is a tensor that is no argument's own")
            return Param("memory", starts[value.data_ptr()])
        if value is NULL:
            return Param("u64", 0, 0)
        kind = _SCALARS.get(str(getattr(value, "dtype", "")))
        if kind is None:
            raise KforgeError(f"a launch parameter of type {type(value).__name__}")
        return Param(kind, 0, value.item())  # type: ignore[attr-defined]

    launches = tuple(
        ChildLaunch(launch.kernel, _three(launch.grid), _three(launch.block), launch.shared_mem,
               tuple(param(v) for v in recorded), launch.align, launch.unaligned_kernel)
        for launch, recorded in zip(plan.launches, recorder.params))
    (folder / "inputs.bin").write_bytes(bytes(blob))
    (folder / "candidate.cubin").write_bytes(cubin)
    return Job(device, str(folder / "candidate.cubin"), str(folder / "inputs.bin"),
               tuple(memories), tuple(per_call), launches, calls, phases, {"op": card.op})


def _three(dims: tuple[int, ...]) -> tuple[int, int, int]:
    x, y, z = (*dims, 1, 1)[:3]
    return x, y, z


def write_job(job: Job, folder: Path) -> Path:
    path = folder / "job.json"
    path.write_text(json.dumps(job.to_dict()))
    return path
