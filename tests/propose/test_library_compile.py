"""Every kernel family compiles with NVRTC (to cubin, no GPU needed) for the H100/H200 and GB10
architectures, in every dtype, with every kernel its launch plan names compiled, registers
reported and nothing spilled at default points.

The quick tests compile each family's first variant; the sweep over every variant, both
architectures and sampled points is marked slow (about half a minute on two cores)."""

from __future__ import annotations

import random
from concurrent.futures import ThreadPoolExecutor

import pytest

from kforge.core.candidate import Candidate
from kforge.core.gpu import GpuInfo
from kforge.core.launch_plan import parse_plan
from kforge.propose.library.examples import DTYPES, example_cards
from kforge.propose.library.proposer import Plan, build_candidate, make_plan
from kforge.runtime.nvrtc import Compiler, CompileResult

pytest.importorskip("cuda.core", reason="NVRTC through cuda.core is not installed")

GPU = GpuInfo(name="H200", arch="sm_90", sm_count=132)
# One card per family and per distinct kernel template.
REPRESENTATIVE = ("softmax", "softmax_long", "softmax_half_to_float", "layer_norm", "rms_norm",
                  "group_norm", "group_norm_split", "add_bias", "gelu_tanh", "mean_rows",
                  "mean_channels_last", "adaptive_avg_pool_window", "max_pool", "embedding",
                  "conv1d_depthwise")


@pytest.fixture(scope="module")
def compiler() -> Compiler:
    return Compiler()


def compile_all(compiler: Compiler, jobs: list[tuple[str, Candidate, str]]
                ) -> list[tuple[str, Candidate, CompileResult]]:
    """Compile (label, candidate, arch) jobs, two at a time (NVRTC runs outside the GIL)."""
    compiler.compile(jobs[0][1].source, jobs[0][2])  # loads cuda.core once before threads race to it
    with ThreadPoolExecutor(2) as pool:
        results = pool.map(lambda job: compiler.compile(job[1].source, job[2]), jobs)
        return [(label, candidate, result) for (label, candidate, _), result in zip(jobs, results)]


def assert_clean(label: str, candidate: Candidate, result: CompileResult,
                 spills_allowed: bool = False) -> None:
    assert result.ok, f"{label}:\n{result.log[:3000]}"
    names = set(parse_plan(candidate.plan).kernel_names())
    assert names and names <= set(result.resources), f"{label}: no register report for {names}"
    assert all(r.registers > 0 for r in result.resources.values())
    if not spills_allowed:
        assert not result.spills, f"{label} spills:\n{result.log}"


def plans(dtype: str) -> list[tuple[str, Plan]]:
    cards = example_cards(dtype)
    return [(name, make_plan(cards[name], GPU)) for name in REPRESENTATIVE]


def first_variant_jobs(dtypes: tuple[str, ...], arch: str) -> list[tuple[str, Candidate, str]]:
    jobs = []
    for dtype in dtypes:
        for name, plan in plans(dtype):
            variant = plan.available[0]
            card = example_cards(dtype)[name]
            candidate = build_candidate(plan, variant, variant.space.default, GPU, card, "")
            jobs.append((f"{dtype}/{name}/{variant.approach}/{arch}", candidate, arch))
    return jobs


def test_each_family_compiles_in_every_dtype_without_spills(compiler):
    for label, candidate, result in compile_all(compiler, first_variant_jobs(DTYPES, "sm_90")):
        assert_clean(label, candidate, result)


def test_each_family_compiles_for_gb10(compiler):
    for label, candidate, result in compile_all(compiler, first_variant_jobs(("bfloat16",), "sm_121")):
        assert_clean(label, candidate, result)


@pytest.mark.slow
@pytest.mark.parametrize("arch", ["sm_90", "sm_121"])
def test_every_variant_compiles_at_its_default_point_without_spills(compiler, arch):
    jobs = []
    for dtype in DTYPES:
        for name, plan in plans(dtype):
            card = example_cards(dtype)[name]
            for variant in plan.available:
                candidate = build_candidate(plan, variant, variant.space.default, GPU, card, "")
                jobs.append((f"{dtype}/{name}/{variant.approach}", candidate, arch))
    for label, candidate, result in compile_all(compiler, jobs):
        assert_clean(label, candidate, result)


@pytest.mark.slow
def test_safe_and_sampled_points_compile(compiler):
    rng = random.Random(0)
    jobs = []
    for dtype in DTYPES:
        for name, plan in plans(dtype):
            card = example_cards(dtype)[name]
            reference = plan.reference
            jobs.append((f"{dtype}/{name}/{reference.approach}/safe",
                         build_candidate(plan, reference, reference.space.safe, GPU, card, ""),
                         "sm_90"))
            variant = rng.choice(plan.available)
            point = rng.choice(variant.space.points())
            jobs.append((f"{dtype}/{name}/{variant.approach}/{point}",
                         build_candidate(plan, variant, point, GPU, card, ""), "sm_90"))
    for label, candidate, result in compile_all(compiler, jobs):
        assert_clean(label, candidate, result, spills_allowed=True)


def test_a_broken_source_reports_its_error(compiler):
    plan = make_plan(example_cards("float32")["softmax"], GPU)
    variant = plan.available[0]
    source = build_candidate(plan, variant, variant.space.default, GPU,
                             example_cards("float32")["softmax"], "").source
    result = compiler.compile(source.replace("kf::row_allreduce", "kf::row_allreduse", 1), "sm_90")
    assert not result.ok and "row_allreduse" in result.log
