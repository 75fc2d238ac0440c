"""NVRTC compiles on a CPU-only machine: every test candidate compiles, errors come back with
their log, the cache is keyed by source, architecture and options."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from kforge.core.candidate import Candidate
from kforge.runtime.cubin_elf import cubin_kernels
from kforge.runtime.gpuinfo import arch_name
from kforge.runtime.kernel_loader import NvrtcLoader
from kforge.runtime.nvrtc import Compiler, kernel_resources, parse_ptxas_report
from tests.eval import candidates as C

ALL = ([(name, build) for name, build in C.REFERENCE.items()]
       + [("softmax_smem", C.softmax_shared_memory)]
       + [(name, build) for name, _card, build, _status in C.CHEATS]
       + [("skip_when_timed", lambda: C.cheat_skip_when_timed(7))]
       + [(kind, lambda kind=kind: C.crasher(kind)) for kind in C.CRASHERS])


@pytest.fixture(scope="module")
def compiler() -> Compiler:
    return Compiler()


@pytest.mark.parametrize("name, build", ALL, ids=[n for n, _ in ALL])
def test_every_test_candidate_compiles_for_hopper(compiler, name, build):
    result = compiler.compile(build().source, "sm_90")
    assert result.ok, result.log
    assert result.resources, "ptxas reported no kernels"
    # The cubin names the same kernels, with the same registers, as ptxas' report.
    report = parse_ptxas_report(result.log)
    assert {k: v.registers for k, v in cubin_kernels(result.cubin).items()} == \
        {k: v.registers for k, v in report.items()}


def test_a_compile_whose_log_is_empty_still_lists_its_kernels(compiler):
    """A repeated compile in one process may come back without ptxas' report (seen on an H200
    with cuda.core 1.2.0): the kernels and their registers come from the cubin."""
    result = compiler.compile(C.softmax().source, "sm_90")
    resources = kernel_resources("", result.cubin)
    assert set(resources) == {"softmax_f32", "softmax_bf16", "softmax_f16"}
    assert resources["softmax_f32"].registers == result.resources["softmax_f32"].registers > 0
    assert result.spills is False  # ptxas said so
    assert replace(result, log="", resources=resources).spills is None  # nobody said


def test_a_device_function_is_not_a_kernel(compiler):
    source = C.softmax().source + (
        '__device__ __noinline__ float twice(float x) { return 2.f * x; }\n'
        'extern "C" __global__ void doubled(float* x) { x[threadIdx.x] = twice(x[threadIdx.x]); }\n')
    names = set(cubin_kernels(compiler.compile(source, "sm_90").cubin))
    assert names == {"softmax_f32", "softmax_bf16", "softmax_f16", "doubled"}


@pytest.mark.parametrize("data", [b"", b"\x7fELF", b"\x7fELF\x02" + bytes(200), b"not a cubin" * 20])
def test_bytes_that_are_no_cubin_have_no_kernels(data):
    assert cubin_kernels(data) == {}


def test_blackwell_consumer_architecture_compiles_too(compiler):
    result = compiler.compile(C.softmax().source, arch_name(12, 1))
    assert result.ok, result.log
    assert {"softmax_f32", "softmax_bf16", "softmax_f16"} <= set(result.resources)


def test_compile_errors_keep_the_log(compiler):
    result = compiler.compile('extern "C" __global__ void k(float* x) { x[0] = nope; }', "sm_90")
    assert not result.ok
    assert "nope" in result.log and "candidate.cu" in result.log


def test_cache_is_keyed_by_source_arch_and_options(tmp_path):
    compiler = Compiler(tmp_path)
    source = C.relu().source
    first = compiler.compile(source, "sm_90")
    assert not first.cached
    assert compiler.compile(source, "sm_90").cached
    assert not compiler.compile(source, "sm_89").cached
    assert not compiler.compile(source, "sm_90", ["--use_fast_math"]).cached
    on_disk = Compiler(tmp_path).compile(source, "sm_90")
    assert on_disk.cached and on_disk.cubin == first.cubin
    assert first.resources["relu_f32"].registers > 0


def test_a_cache_entry_appears_whole_cubin_first_then_its_log(tmp_path, monkeypatch):
    """Another process may read the cache while this one writes it: nothing is written under a
    name a reader looks for, and the log, which marks an entry complete, comes last."""
    written, renamed = [], []
    real_write, real_replace = Path.write_bytes, Path.replace
    monkeypatch.setattr(Path, "write_bytes",
                        lambda self, data: (written.append(self.name), real_write(self, data))[1])
    monkeypatch.setattr(Path, "replace",
                        lambda self, target: (renamed.append(Path(target).suffix),
                                              real_replace(self, target))[1])
    monkeypatch.setattr(Path, "write_text", lambda *a, **k: pytest.fail("written in place"))
    result = Compiler(tmp_path).compile(C.relu().source, "sm_90")
    assert written and all(name.endswith(".tmp") for name in written)
    assert renamed == [".cubin", ".log"]
    on_disk = Compiler(tmp_path).compile(C.relu().source, "sm_90")
    assert on_disk.cached and on_disk.resources == result.resources


def test_loader_refuses_options_outside_the_allow_list():
    loader = NvrtcLoader(0, "sm_90", Compiler())
    bad = Candidate(C.relu().source, plan=C.relu().plan,
                    meta={"nvrtc_options": ["--include-path=/etc"]})
    result = loader.compile(bad)
    assert not result.ok and "not allowed" in result.log
    good = Candidate(C.relu().source, plan=C.relu().plan,
                     meta={"nvrtc_options": ["-maxrregcount=32"]})
    assert loader.compile(good).ok
