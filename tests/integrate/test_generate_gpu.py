"""Range kernels and the generation benchmark on a real GPU: a shape-generic CUDA kernel passes
over its range and serves every point of it through the guard, one sized for the profiled point is
rejected; a static-cache generate of Gemma 4 (2 layers) runs in every mode with its tokens
compared with eager's."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from kforge.core.candidate import Candidate, EvalStatus
from kforge.core.laws import Law, Ranges, Symbol
from kforge.core.ranges import range_card
from kforge.eval.process.local import device_context, evaluate_local
from kforge.runtime.cubin import KernelModule
from kforge.runtime.guard import Patch
from kforge.runtime.table import Entry, KernelTable, RangeRunner
from tests.eval import candidates as C

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

AT = 2048


def rows_card(dtype: str = "bfloat16"):
    """``relu`` of an ``[L, 256]`` tensor for L in 1..8192."""
    ranges = Ranges((Symbol("L", 1, 8192, AT),), (Law(("args", 0, "shape", 0), "L", 1, 0),))
    return range_card(C.relu_card([AT, 256], dtype), ranges)


def test_a_generic_cuda_kernel_passes_over_its_range_and_a_sized_one_does_not():
    card = rows_card()
    outcome = evaluate_local(card, C.relu("bfloat16"))
    assert outcome.status is EvalStatus.OK, outcome.summary
    assert len(outcome.ranges.points) == 6 and "over L=1..8192" in outcome.summary
    plan = C.unary_plan(C.kernel_name("relu", "bfloat16"), "bfloat16")
    plan["let"] = {"n": str(AT * 256)}
    sized = evaluate_local(card, Candidate(C.ELEMENTWISE_SOURCE, plan=plan))
    assert sized.status is not EvalStatus.OK and sized.summary.startswith("at L=")


def test_a_range_kernel_serves_every_length_through_the_guard():
    card = rows_card()
    candidate = C.relu("bfloat16")
    ctx = device_context(0)
    compiled = ctx.loader.compile(candidate)
    assert compiled.ok, compiled.log
    device = torch.device("cuda", 0)
    runner = RangeRunner(candidate.plan, card.op, card.args, card.kwargs, card.ranges,
                         KernelModule(compiled.cubin, device), device)
    table = KernelTable([Entry(card.op, card.args, card.kwargs, runner, device, label="relu L",
                               ranges=card.ranges)])
    lengths = [1, 7, 2048, 2049, 8192]
    inputs = [torch.randn(n, 256, device=device, dtype=torch.bfloat16) for n in lengths]
    with torch.no_grad(), Patch(table) as patch:
        outputs = [torch.relu(x) for x in inputs]
        beyond = torch.relu(torch.randn(8193, 256, device=device, dtype=torch.bfloat16))
    for x, y in zip(inputs, outputs):
        torch.testing.assert_close(y, torch.relu(x), rtol=0, atol=0)
    assert beyond.shape == (8193, 256)
    report = patch.report()
    assert report.kernels[0].hits == len(lengths) and report.misses == {card.op: 1}


@pytest.mark.skipif(importlib.util.find_spec("transformers") is None,
                    reason="transformers is not installed")
def test_a_static_cache_generation_runs_in_every_mode():
    from kforge.capture import ModelOptions, load_model
    from kforge.integrate.generate import STATIC, parse_modes, run_generation

    loaded = load_model("gemma4", ModelOptions(mode="prefill", seq_len=64, layers=2,
                                               device="cuda"))
    result = run_generation(loaded.model, loaded.kwargs["input_ids"], 16,
                            modes=parse_modes("all", kforge=False), reps=2)
    print(result.table())
    assert result.cache == STATIC
    for run in result.runs:
        assert run.error == "" and run.tokens is not None and run.tokens_per_s() > 0, run.mode
