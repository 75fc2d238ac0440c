"""NVRTC compiles on a CPU-only machine: every test candidate compiles, errors come back with
their log, the cache is keyed by source, architecture and options."""

from __future__ import annotations

import pytest

from kforge.core.candidate import Candidate
from kforge.eval.gpuinfo import arch_name
from kforge.eval.kernel_loader import NvrtcLoader
from kforge.runtime.nvrtc import Compiler
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


def test_loader_refuses_options_outside_the_allow_list():
    loader = NvrtcLoader(0, "sm_90", Compiler())
    bad = Candidate(C.relu().source, plan=C.relu().plan,
                    meta={"nvrtc_options": ["--include-path=/etc"]})
    result = loader.compile(bad)
    assert not result.ok and "not allowed" in result.log
    good = Candidate(C.relu().source, plan=C.relu().plan,
                     meta={"nvrtc_options": ["-maxrregcount=32"]})
    assert loader.compile(good).ok
