"""The library's kernels keep the alignment contract of the evaluator's placements, read from the
PTX NVRTC makes of them (no GPU needed).

The evaluator puts every storage a candidate sees at byte shifts past 512-byte boundaries
(``kforge.eval.verify.placement``): shifts that keep 16 bytes of alignment for a plan without an
``align`` fallback, and shifts down to the element size for a plan that has one. So:

- a launch with ``align`` runs its kernel only where every pointer is a multiple of ``align``:
  that kernel's widest global access (a vector load or store, a ``cp.async``) is at most
  ``align`` bytes;
- its ``unaligned_kernel`` (the scalar twin) and every launch without ``align`` in a plan that
  has a fallback see pointers aligned to their element size only: they make no vector access of
  global memory at all;
- no launch accesses more than 16 bytes at once.

The quick test checks the benchmark's cards (``bench/bench_library.py``) at each variant's
default and safe points; the slow one every example card in every dtype, and the tiny models'
fusion regions, at sampled points too.
"""

from __future__ import annotations

import random
import re
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch

from kforge.core.candidate import Candidate
from kforge.core.launch_plan import ResolvedPlan
from kforge.core.opcard import OpCard
from kforge.eval.verify.placement import (
    ALIGNED_SHIFTS,
    BOUNDARY,
    FALLBACK_SHIFTS,
    SCRATCH_GRAIN,
    fitted,
    placed,
    shifts_for,
)
from kforge.propose.library.cards import Declined
from kforge.propose.library.examples import DTYPES, example_cards
from kforge.propose.library.proposer import build_candidate, make_plan
from kforge.runtime.nvrtc import PRELUDE, cuda_include_dirs
from kforge.runtime.plan import resolve_for

from .test_library_coverage import H200

nvrtc = pytest.importorskip("cuda.bindings.nvrtc", reason="NVRTC bindings are not installed")

ROOT = Path(__file__).resolve().parents[2]
ENTRY = re.compile(r"\.entry\s+(\w+)\s*\(")
VECTOR = re.compile(r"\b(?:ld|st)\.global[.\w]*?\.v(2|4|8)\.[bufs](8|16|32|64)\b")
CP_ASYNC = re.compile(r"cp\.async\.c[ag]\.shared\.global(?:\.\w+)*\s*\[[^\]]*\],\s*\[[^\]]*\],\s*(\d+)")


def ptx(candidate: Candidate) -> str:
    """The candidate's PTX for sm_90 (NVRTC without a driver: ``cuda.core`` asks the driver
    which PTX it can load)."""
    arch = b"-arch=compute_90"
    options = [f"-I{d}".encode() for d in cuda_include_dirs()] + [b"-std=c++17"]
    for option in candidate.meta.get("nvrtc_options") or []:
        if option == "--arch-specific":
            arch = b"-arch=compute_90a"
        else:
            options.append(option.encode())
    err, program = nvrtc.nvrtcCreateProgram((PRELUDE + candidate.source).encode(), b"candidate.cu",
                                            0, [], [])
    assert err == nvrtc.nvrtcResult.NVRTC_SUCCESS
    try:
        (err,) = nvrtc.nvrtcCompileProgram(program, len(options) + 1, [arch, *options])
        if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
            _, size = nvrtc.nvrtcGetProgramLogSize(program)
            log = b" " * size
            nvrtc.nvrtcGetProgramLog(program, log)
            raise AssertionError(log.decode(errors="replace")[:3000])
        _, size = nvrtc.nvrtcGetPTXSize(program)
        text = b" " * size
        nvrtc.nvrtcGetPTX(program, text)
        return text.decode(errors="replace")
    finally:
        nvrtc.nvrtcDestroyProgram(program)


def widest_accesses(text: str) -> dict[str, int]:
    """Per kernel of a PTX module: the bytes of its widest vector access of global memory or
    asynchronous copy from it (0: none)."""
    starts = [(m.start(), m.group(1)) for m in ENTRY.finditer(text)]
    widest = {}
    for i, (at, name) in enumerate(starts):
        body = text[at:starts[i + 1][0] if i + 1 < len(starts) else len(text)]
        assert ".func" not in body, f"{name} calls a device function: its accesses are not all here"
        vectors = [int(m.group(1)) * int(m.group(2)) // 8 for m in VECTOR.finditer(body)]
        copies = [int(m.group(1)) for m in CP_ASYNC.finditer(body)]
        widest[name] = max(vectors + copies, default=0)
    return widest


def contract_problems(plan: ResolvedPlan, widest: dict[str, int]) -> list[str]:
    """Where the kernels' accesses need more alignment than the evaluator's placements (and
    production's) give the pointers they get."""
    fallback = shifts_for(plan) == FALLBACK_SHIFTS
    problems = []
    for i, launch in enumerate(plan.launches):
        width = widest[launch.kernel]
        if width > 16:
            problems.append(f"launch {i}: {launch.kernel} accesses {width} bytes at once")
        if launch.align and launch.unaligned_kernel:
            if width > launch.align:
                problems.append(f"launch {i}: {launch.kernel} accesses {width} bytes at once "
                                f"where its pointers are aligned to {launch.align}")
            if twin := widest[launch.unaligned_kernel]:
                problems.append(f"launch {i}: the twin {launch.unaligned_kernel}, for misaligned "
                                f"pointers, accesses {twin} bytes at once")
        elif fallback and width:
            problems.append(f"launch {i}: {launch.kernel} accesses {width} bytes at once, with no "
                            "align of its own in a plan whose memory sits at any element offset")
    return problems


def bench_cards() -> list[tuple[str, OpCard]]:
    sys.path.insert(0, str(ROOT / "bench"))
    try:
        from bench_library import model_cards
    finally:
        sys.path.remove(str(ROOT / "bench"))
    return [(f"{model} {card.short_op} {card.signature[:60]}", card) for model, card in model_cards()]


def jobs(cards: list[tuple[str, OpCard]], sampled: int = 0, seed: int = 0
         ) -> list[tuple[str, OpCard, Candidate]]:
    """Every available variant of each card at its default and safe points and ``sampled``
    others."""
    chance = random.Random(seed)
    found = []
    for label, card in cards:
        try:
            plan = make_plan(card, H200)
        except Declined:
            continue
        for variant in plan.available:
            points = [variant.space.default, variant.space.safe]
            every = list(variant.space.points())
            points += chance.sample(every, min(sampled, len(every)))
            keys = set()
            for point in points:
                if (key := tuple(sorted(point.items()))) in keys:
                    continue
                keys.add(key)
                found.append((f"{label} {variant.approach} {point}", card,
                              build_candidate(plan, variant, point, H200, card, "")))
    return found


def check(found: list[tuple[str, OpCard, Candidate]]) -> None:
    ptx(Candidate('extern "C" __global__ void k() {}', plan={}))  # NVRTC loaded before threads
    with ThreadPoolExecutor(2) as pool:
        texts = list(pool.map(lambda job: ptx(job[2]), found))
    problems = []
    for (label, card, candidate), text in zip(found, texts):
        plan = resolve_for(candidate.plan, card.op, card.args, card.kwargs)
        problems += [f"{label}: {p}" for p in contract_problems(plan, widest_accesses(text))]
    assert not problems, "\n".join(problems)


def test_the_benchmarks_kernels_keep_the_alignment_their_placements_give():
    check(jobs(bench_cards()))


@pytest.mark.slow
def test_every_library_kernel_keeps_the_alignment_its_placements_give():
    from .test_region_families import MATCHED, sample

    cards = [(f"{dtype} {name}", card) for dtype in DTYPES
             for name, card in example_cards(dtype).items()]
    cards += [(name, sample(name)[1]) for name in MATCHED]
    check(jobs(cards, sampled=3))


def test_a_paired_matmul_store_is_aligned_for_its_pair_or_done_one_by_one():
    """The matmul epilogue stores two neighbouring outputs as one access: only in the kernel
    whose pointers meet the pair's alignment, never in the twin for misaligned pointers."""
    card = example_cards("float16")["mm"]
    plan = make_plan(card, H200)
    for variant in (plan.variant("mma"), plan.variant("wgmma")):
        candidate = build_candidate(plan, variant, variant.space.default, H200, card, "")
        resolved = resolve_for(candidate.plan, card.op, card.args, card.kwargs)
        widest = widest_accesses(ptx(candidate))
        assert resolved.launches[0].align >= 4 and widest["mm_scalar"] == 0, variant.approach


# ----- the placements themselves -----

ITEMSIZES = {1: torch.uint8, 2: torch.bfloat16, 4: torch.float32, 8: torch.int64,
             16: torch.complex128}


@pytest.mark.parametrize("shifts", [ALIGNED_SHIFTS, FALLBACK_SHIFTS], ids=["aligned", "fallback"])
def test_every_shift_keeps_the_element_size_and_the_aligned_ones_16_bytes(shifts):
    for shift in shifts:
        for item in ITEMSIZES:
            got = fitted(shift, item)
            assert got % item == 0 and 0 <= got < BOUNDARY
            assert shifts is FALLBACK_SHIFTS or got % 16 == 0
        assert fitted(shift, 1, SCRATCH_GRAIN) % SCRATCH_GRAIN == 0


@pytest.mark.parametrize("item", sorted(ITEMSIZES))
def test_a_placed_buffer_holds_its_lead_count_and_trail_at_every_shift(item):
    for shift in sorted(set(ALIGNED_SHIFTS + FALLBACK_SHIFTS)):
        for count in (1, 7, 1000):
            lead = trail = 256 // item
            want = fitted(shift, item)
            raw, start = placed(count, ITEMSIZES[item], torch.device("cpu"), lead, trail, want)
            assert start >= lead and start + count + trail <= raw.numel()
            assert (raw.data_ptr() + start * item) % BOUNDARY == want
