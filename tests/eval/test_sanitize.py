"""The sanitizer: its reports, the tools a kernel needs, how often it calls the candidate, its
verdict cache."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kforge.core.candidate import Candidate
from kforge.eval.process.sanitize import (
    EXTRA_CALLS,
    MAX_CALLS,
    MIN_CALLS,
    TOOLS,
    SanitizerReport,
    VerdictCache,
    calls_to_check,
    kernel_filter,
    needed_tools,
    reports,
    tool_command,
    verdict_key,
)

MEMCHECK = """\
========= COMPUTE-SANITIZER
========= Invalid __global__ read of size 4 bytes
=========     at relu_f32+0x90
=========     by thread (255,0,0) in block (3,0,0)
=========     Address 0x7f0000001000 is out of bounds
=========
========= Invalid __global__ write of size 4 bytes
=========     at void at::native::vectorized_elementwise_kernel<4>(int)+0x1c0
=========
========= ERROR SUMMARY: 2 errors
"""

RACECHECK = """\
========= COMPUTE-SANITIZER
========= Error: Race reported between Write access at softmax_f32+0x2a0
=========     and Read access at softmax_f32+0x310 [1024 hazards]
=========
========= RACECHECK SUMMARY: 1 hazard displayed (1 error, 0 warnings)
"""


def test_every_report_counts_whichever_function_of_the_module_it_names():
    """Only the candidate's launches are checked (``--kernel-name``), so a fault in a device
    function it calls, or in a kernel of its module by any name, is the candidate's."""
    found = reports(MEMCHECK)
    assert len(found) == 2 and "Invalid __global__ read" in found[0]
    assert reports(DEVICE_FUNCTION) == ["Invalid __global__ read of size 4 bytes at "
                                        "late_read(const float *, long long)+0x70"]


DEVICE_FUNCTION = """\
========= COMPUTE-SANITIZER
========= Invalid __global__ read of size 4 bytes
=========     at late_read(const float *, long long)+0x70
=========     by thread (3,0,0) in block (2,0,0)
=========     Device Frame: relu_late+0x40
=========
========= ERROR SUMMARY: 1 error
"""


def test_a_race_is_reported():
    found = reports(RACECHECK)
    assert len(found) == 1 and "Race reported" in found[0]


def test_a_clean_run_reports_nothing():
    assert reports("========= COMPUTE-SANITIZER\n========= ERROR SUMMARY: 0 errors\n") == []


def test_the_childs_exit_and_the_sanitizers_own_notes_are_not_reports_about_a_kernel():
    out = ("========= Error: process didn't terminate successfully\n"
           "========= Target application returned an error\n"
           "========= Warning: something about the device's mode\n")
    assert reports(out) == []
    older = "========= Invalid __global__ write of size 4\n=========     at 0x00000090 in k\n"
    assert len(reports(older)) == 1


def test_each_tool_checks_exactly_the_plans_kernels_by_their_symbols(tmp_path):
    command = tool_command("cs", "memcheck", ["softmax_f32", "stats", "softmax_f32"],
                           tmp_path / "job.json")
    assert command[1:9] == ["--tool", "memcheck", "--padding", "65536", "--kernel-name",
                            "kne=softmax_f32", "--kernel-name", "kne=stats"]
    command = tool_command("cs", "racecheck", ["_Z7softmaxPKfPfi"], tmp_path / "job.json")
    assert "kne=_Z7softmaxPKfPfi" in command and "--padding" not in command


def test_initcheck_watches_every_kernel_so_inputs_pytorch_wrote_count_as_written(tmp_path):
    command = tool_command("cs", "initcheck", ["softmax_f32"], tmp_path / "job.json")
    assert "--kernel-name" not in command and command[1:3] == ["--tool", "initcheck"]


def test_the_sanitizer_takes_the_kernel_filter():
    """Where compute-sanitizer is installed (no GPU needed to parse its options)."""
    import subprocess

    from kforge.eval.process.sanitize import find_sanitizer

    binary = find_sanitizer()
    if binary is None:
        pytest.skip("compute-sanitizer is not installed here")
    done = subprocess.run([binary, *kernel_filter(["a_kernel", "_Z1kPf"]), "--tool", "memcheck",
                           "true"], capture_output=True, text=True, timeout=60)
    assert "ill-formed" not in done.stdout + done.stderr


def test_options_the_sanitizer_refuses_are_no_verdict_on_the_kernel():
    from kforge.eval.process.sanitize import _verdict

    verdict = _verdict("memcheck", 1, "Filter ill-formed: invalid filter key \"regex:k\"")
    assert verdict is not None and not verdict.ok and not verdict.ran
    assert "refused its options" in verdict.message


def test_a_kernels_own_words_cannot_excuse_it_from_the_sanitizer():
    from kforge.eval.process.sanitize import _verdict

    printed = "tool not supported on this device\n========= Error: process didn't terminate successfully"
    verdict = _verdict("memcheck", 1, printed)  # the child failed; its kernel printed the words
    assert verdict is not None and not verdict.ok
    own = _verdict("memcheck", 1, "========= Error: Device not supported")
    assert own is not None and own.ok and not own.ran


FAKE_SANITIZER = """#!/bin/sh
# a stand-in for compute-sanitizer: its second argument is the tool
case $2 in
  synccheck) echo "========= Error: process didn't terminate successfully"; exit 1 ;;
  memcheck) sleep {memcheck_s}; echo "========= Invalid __global__ read of size 16 bytes";
            echo "=========     at relu_vec4+0x70"; exit 86 ;;
  *) sleep {other_s}; exit 0 ;;
esac
"""


def run_fake_tools(tmp_path, memcheck_s: float, other_s: float, tools: tuple[str, ...]):
    import threading
    import time

    from kforge.eval.process.sanitize import _run_tools

    binary = tmp_path / "compute-sanitizer"
    binary.write_text(FAKE_SANITIZER.format(memcheck_s=memcheck_s, other_s=other_s))
    binary.chmod(0o755)
    job = tmp_path / "job.json"
    job.write_text("{}")
    started = time.perf_counter()
    report = _run_tools(str(binary), tools, ["relu_vec4"], job, tmp_path, 60.0, started,
                        threading.Event())
    return report, time.perf_counter() - started


def test_the_tools_run_at_once_and_the_first_report_ends_the_others(tmp_path):
    report, wall = run_fake_tools(tmp_path, 0.3, 20.0, ("memcheck", "racecheck", "initcheck"))
    assert not report.ok and report.tool == "memcheck"
    assert "Invalid __global__ read" in report.message
    assert wall < 10 and set(report.tool_seconds) == {"memcheck"}  # the others were ended


def test_a_run_that_failed_without_a_report_waits_for_the_tool_that_names_the_fault(tmp_path):
    report, _ = run_fake_tools(tmp_path, 0.5, 0.1, ("memcheck", "synccheck"))
    assert report.tool == "memcheck" and "Invalid __global__ read" in report.message
    report, _ = run_fake_tools(tmp_path, 0.5, 0.1, ("synccheck", "initcheck"))
    assert not report.ok and report.tool == "synccheck" and "run failed" in report.message


def test_calls_cover_the_timed_calls_and_vary():
    import random

    counts = {calls_to_check(20, random.Random(seed)) for seed in range(40)}
    assert min(counts) >= 20 and max(counts) < 20 + EXTRA_CALLS and len(counts) > 1
    assert min(calls_to_check(None, random.Random(s)) for s in range(5)) >= MIN_CALLS
    assert max(calls_to_check(10**6, random.Random(s)) for s in range(5)) < MAX_CALLS + EXTRA_CALLS


PLAIN = r'''extern "C" __global__ void k(float* x) { x[threadIdx.x] += 1.f; }'''
STAGED = r'''extern "C" __global__ void k(float* x) { __shared__ float s[64];
    s[threadIdx.x] = x[threadIdx.x]; __syncthreads(); x[threadIdx.x] = s[63 - threadIdx.x]; }'''
SHUFFLED = r'''extern "C" __global__ void k(float* x) { float v = x[threadIdx.x];
    v += __shfl_xor_sync(0xffffffffu, v, 1); x[threadIdx.x] = v; }'''
HIDDEN = r'''extern "C" __global__ void k(float* x) { asm volatile("bar" ".sync 0;");
    x[threadIdx.x] += 1.f; }'''


def plan(shared_mem: int = 0) -> dict:
    from tests.eval.candidates import unary_plan

    made = unary_plan("k")
    if shared_mem:
        made["launches"][0]["shared_mem"] = shared_mem
    return made


@pytest.fixture(scope="module")
def compiler():
    from kforge.runtime.nvrtc import Compiler

    try:
        return Compiler()
    except Exception as exc:  # noqa: BLE001
        pytest.skip(f"no NVRTC: {exc}")


@pytest.mark.parametrize("source, shared_mem, tools", [
    (PLAIN, 0, ("memcheck", "initcheck")),
    (PLAIN, 256, ("memcheck", "racecheck", "initcheck")),  # dynamic shared memory in the plan
    (STAGED, 0, TOOLS),
    (SHUFFLED, 0, ("memcheck", "synccheck", "initcheck")),
    (HIDDEN, 0, TOOLS),  # inline PTX: whatever it hides, every tool runs
], ids=["plain", "dynamic-shared", "shared-and-barrier", "warp-sync", "inline-ptx"])
def test_the_tools_follow_what_the_kernel_does(compiler, source, shared_mem, tools):
    compiled = compiler.compile(source, "sm_90")
    assert compiled.ok, compiled.log
    assert needed_tools(Candidate(source, plan=plan(shared_mem)), compiled.cubin) == tools


def test_without_a_cubin_every_tool_runs():
    assert needed_tools(Candidate(PLAIN, plan=plan()), None) == TOOLS


def test_a_verdict_is_cached_by_code_plan_variant_and_version(tmp_path):
    from kforge.core.opcard import OpCard

    card = OpCard(op="aten.relu.default", args=[{"t": "tensor", "shape": [64], "stride": [1],
                                                 "dtype": "float32", "offset": 0}],
                  calls=1, total_us=1.0, share=1.0)
    other = OpCard(op="aten.relu.default", args=[{"t": "tensor", "shape": [65], "stride": [1],
                                                  "dtype": "float32", "offset": 0}],
                   calls=1, total_us=1.0, share=1.0)
    candidate = Candidate(PLAIN, plan=plan())
    key = verdict_key(card, candidate, b"cubin", "2026.4")
    assert key == verdict_key(card, candidate, b"cubin", "2026.4")
    assert len({key, verdict_key(other, candidate, b"cubin", "2026.4"),
                verdict_key(card, candidate, b"other cubin", "2026.4"),
                verdict_key(card, candidate, b"cubin", "2026.5"),
                verdict_key(card, Candidate(PLAIN, plan=plan(128)), b"cubin", "2026.4")}) == 5
    cache = VerdictCache(tmp_path)
    assert cache.get(key) is None
    cache.put(key, SanitizerReport(False, "racecheck", "race", tool_seconds={"racecheck": 1.5}))
    hit = cache.get(key)
    assert hit is not None and hit.cached and not hit.ok and hit.message == "race"
    cache.put("other", SanitizerReport(True, ran=False, message="not found"))
    assert cache.get("other") is None  # a run that checked nothing is not remembered
    cache.put("hung", SanitizerReport(False, "racecheck", "did not finish in 300 s",
                                      tool_seconds={"memcheck": 3.0}))
    assert cache.get("hung") is None  # nor one cut short


INITCHECK_MEMCPY = """\
========= COMPUTE-SANITIZER
========= Uninitialized access to 0x7f8a93809a00 on access by cudaMemcpy source
=========     Saved host backtrace up to driver entry point at error
=========         Host Frame: [0x1234] in libcuda.so.1
=========
========= ERROR SUMMARY: 1 error
"""


def test_a_runtime_copy_reading_uninitialized_memory_is_not_the_candidates():
    assert reports(INITCHECK_MEMCPY) == []


def test_the_childs_job_maps_every_parameter_to_a_buffer_or_a_typed_scalar(tmp_path):
    """The child needs no torch: the plan is resolved here, the inputs written as bytes, and each
    launch parameter is an input, a per-call buffer or a scalar of the kernel's width."""
    import torch

    from kforge.eval.process.sanitize import job_for, write_job
    from kforge.eval.process.sanitize_child import Job
    from kforge.eval.verify.inputs import InputFactory
    from tests.eval.candidates import reference, relu_card

    card = relu_card([7, 333])
    job = job_for(card, reference(card, "cuda"), b"cubin", tmp_path, calls=11)
    assert Job.from_dict(json.loads(write_job(job, tmp_path).read_text())) == job
    [given], [out] = job.inputs, job.per_call
    assert given.nbytes == 7 * 333 * 4 and given.fill == "data" and out.nbytes == 7 * 333 * 4
    assert out.fill == "poison" and job.calls == 11
    [launch] = job.launches
    assert [(p.kind, p.index) for p in launch.params[:2]] == [("memory", 0), ("memory", 1)]
    assert (launch.params[2].kind, launch.params[2].value) == ("i64", 7 * 333)
    values = torch.frombuffer(bytearray(Path(job.data).read_bytes()), dtype=torch.float32)
    first = InputFactory(card, torch.device("cpu")).sets((1,))[0].buffers[0].view
    assert torch.equal(values.view(7, 333), first)  # the evaluator's first set, as it is
    assert Path(job.cubin).read_bytes() == b"cubin"


def test_a_strided_input_is_written_as_the_span_it_covers(tmp_path):
    from kforge.eval.process.sanitize import job_for
    from tests.eval.candidates import relu_card, tensor, unary_plan

    card = relu_card().with_(args=[tensor([5, 7], stride=[1, 5])])  # a transposed view
    plan = {**unary_plan("relu_f32"), "requires": []}
    job = job_for(card, Candidate("", plan=plan), b"x", tmp_path)
    assert job.inputs[0].nbytes == (1 + 4 * 1 + 6 * 5) * 4
    assert job.per_call[0].nbytes == (1 + 4 * 1 + 6 * 5) * 4  # "like" keeps the strides


def test_zeroed_scratch_is_zeroed_and_the_rest_poisoned(tmp_path):
    from kforge.eval.process.sanitize import job_for
    from tests.eval import candidates as C

    card = C.softmax_card()
    job = job_for(card, C.softmax_ticketed(), b"x", tmp_path)
    assert [(m.nbytes, m.fill) for m in job.per_call] == [(64 * 1000 * 4, "poison"), (4, "zero")]
    [launch] = job.launches
    assert [(p.kind, p.index) for p in launch.params[:3]] == [("memory", 0), ("memory", 1),
                                                               ("memory", 2)]
    assert (launch.params[3].kind, launch.params[3].value) == ("i32", 1000)


def test_the_child_chooses_the_unaligned_twin_by_its_own_addresses():
    from kforge.eval.process.sanitize_child import ChildLaunch, Param, kernel_for

    launch = ChildLaunch("k4", (1, 1, 1), (32, 1, 1), 0, (Param("memory", 0), Param("i64", 0, 3)),
                    align=16, unaligned_kernel="k1")
    assert kernel_for(launch, [4096]) == "k4" and kernel_for(launch, [4100]) == "k1"


@pytest.mark.gpu
def test_an_honest_kernel_gets_the_tools_it_needs_and_its_verdict_is_kept(tmp_path):
    """On a GPU: a plain elementwise kernel runs under memcheck and initcheck only (no shared
    memory, no barriers), passes, and the same kernel again costs a cache lookup."""
    import torch

    from kforge.eval.process.local import device_context
    from kforge.eval.process.sanitize import find_sanitizer, sanitize_candidate
    from tests.eval import candidates as C

    if not torch.cuda.is_available() or find_sanitizer() is None:
        pytest.skip("needs a CUDA GPU and compute-sanitizer")
    card = C.relu_card()
    candidate = C.reference(card, "cuda")
    compiled = device_context(0).loader.compile(candidate)
    cache = VerdictCache(tmp_path)
    report = sanitize_candidate(card, candidate, cubin=compiled.cubin, timed_calls=40,
                                cache=cache)
    assert report.ok, report.message
    assert set(report.tool_seconds) == {"memcheck", "initcheck"} and not report.cached
    again = sanitize_candidate(card, candidate, cubin=compiled.cubin, timed_calls=40,
                               cache=cache)
    assert again.ok and again.cached and again.tool_seconds == report.tool_seconds


@pytest.fixture
def fake_driver(tmp_path):
    """A stand-in libcuda.so.1 (``fake_libcuda.c``, host memory for device memory) that a child
    started with ``LD_LIBRARY_PATH`` at it loads instead of the real one."""
    import shutil
    import subprocess

    if shutil.which("gcc") is None:
        pytest.skip("gcc is not installed here")
    folder = tmp_path / "driver"
    folder.mkdir()
    source = Path(__file__).with_name("fake_libcuda.c")
    subprocess.run(["gcc", "-shared", "-fPIC", "-O1", "-o", str(folder / "libcuda.so.1"),
                    str(source)], check=True, capture_output=True, timeout=120)
    return folder


def test_the_child_launches_the_candidate_alone_through_the_driver(tmp_path, fake_driver):
    """The torch-free child, run against a stand-in driver: each buffer ends its allocation, the
    inputs are copied in, outputs poisoned afresh for every call, the kernel launched with its
    parameters packed, and nothing else runs."""
    import os
    import subprocess
    import sys

    import torch

    from kforge.core.child import child_env
    from kforge.eval.process.sanitize import job_for, write_job
    from kforge.eval.process.sanitize_child import PHASES
    from kforge.eval.verify.inputs import InputFactory
    from tests.eval.candidates import reference, relu_card

    card = relu_card([7, 333])
    job = write_job(job_for(card, reference(card, "cuda"), b"CUBIN-OF-RELU", tmp_path, calls=3,
                            phases=True), tmp_path)
    log = tmp_path / "driver.log"
    no_torch = tmp_path / "no-torch" / "torch"  # a torch that fails on import
    no_torch.mkdir(parents=True)
    (no_torch / "__init__.py").write_text("raise ImportError('the child imported torch')\n")
    done = subprocess.run(
        [sys.executable, "-P", "-m", "kforge.eval.process.sanitize_child", str(job)],
        env=child_env({**os.environ, "PYTHONPATH": str(no_torch.parent)},
                      LD_LIBRARY_PATH=str(fake_driver), FAKE_CUDA_LOG=str(log),
                      KFORGE_GPU_LOCKS=str(tmp_path / "locks")),
        capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert PHASES in done.stdout
    lines = log.read_text().splitlines()
    nbytes = 7 * 333 * 4
    given = InputFactory(card, torch.device("cpu")).sets((1,))[0].buffers[0].view
    expected = f"relu {7 * 333} sum {float(given.relu().double().sum()):.3f}"
    assert "module CUBIN-OF-RELU" in lines
    assert f"copy {nbytes} end 0" in lines  # the input ends its allocation
    assert lines.count(f"memset 255 {nbytes} end 0") == 3  # a poisoned output for every call
    launches = [ln for ln in lines if ln.startswith("launch ")]
    assert launches == ["launch relu_f32 grid 10 1 1 block 256 1 1 shared 0"] * 3
    assert lines.count(expected) == 3 and lines.count("free") == 3
    assert (tmp_path / "locks" / f"gpu-{'ab' * 16}.lock").exists()  # it took the GPU's lock


def test_the_child_holds_the_gpu_for_its_copies_and_calls_not_for_the_modules_load(
        tmp_path, monkeypatch):
    """The tool instruments the module as it loads (host work, seconds under racecheck): a timed
    section elsewhere waits only for the child's copies and calls."""
    import contextlib

    import kforge.eval.process.sanitize_child as child
    import kforge.runtime.gpulock as gpulock
    from kforge.eval.process.sanitize import job_for, write_job
    from tests.eval.candidates import reference, relu_card

    events: list[str] = []
    holding = [False]

    class Lock:
        def __init__(self, name, sync):
            pass

        @contextlib.contextmanager
        def shared(self):
            holding[0] = True
            try:
                yield
            finally:
                holding[0] = False

    class Recording:
        def __getattr__(self, name):
            def record(*args):
                events.append(f"{name} {'held' if holding[0] else 'free'}")
                if name == "load":
                    return {kernel: None for kernel in args[1]}
                return (0, 0) if name == "allocate" else None
            return record

    monkeypatch.setattr(child, "Driver", Recording)
    monkeypatch.setattr(gpulock, "GpuLock", Lock)
    monkeypatch.setattr(gpulock, "device_uuid", lambda index: "ab" * 16)
    card = relu_card([7, 333])
    job = write_job(job_for(card, reference(card, "cuda"), b"CUBIN", tmp_path, calls=2), tmp_path)
    child.run(child.Job.from_dict(json.loads(job.read_text())), {})
    assert "load free" in events
    assert [e for e in events if e.split()[0] in ("copy_in", "fill", "launch")] and all(
        e.endswith("held") for e in events if e.split()[0] in ("copy_in", "fill", "launch"))
