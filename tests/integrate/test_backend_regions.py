"""Fusion regions through the compile backend, on the CPU: each chain of a region with a kernel is
found in the compiled graph by Inductor's pattern matcher and runs as one call of that kernel; a
chain of another variant, or a region without a kernel, stays Inductor's; the model computes as
eager does."""

from __future__ import annotations

from collections import Counter

import pytest
import torch

from kforge.integrate.api import backend
from kforge.integrate.backend import KforgeWarning
from kforge.runtime.regions import register
from kforge.runtime.table import Entry, KernelTable
from tests.capture.test_regions import Block
from tests.integrate.standins import Counting
from tests.integrate.test_region_swap import cards_of


@pytest.fixture(autouse=True)
def fresh_dynamo():
    """Each test compiles afresh: kforge's pass runs (no graph from Inductor's cache)."""
    torch._dynamo.reset()
    with torch._inductor.config.patch(fx_graph_cache=False):
        yield
    torch._dynamo.reset()


@pytest.fixture(scope="module")
def block():
    torch.manual_seed(0)
    model, x = Block().eval(), torch.randn(2, 8, 32)
    return model, x, cards_of(model, x)


def stages(cards) -> dict[str, object]:
    """The block's region cards by what they compute."""
    named = {}
    for card in cards:
        ops = [n["op"].split(".")[1] for n in card.region["nodes"]]
        named["norm" if "rsqrt" in ops else "gate" if "silu" in ops else "softmax"] = card
    return named


def table_of(cards, calls: Counter) -> KernelTable:
    for card in cards:
        register(card.region)
    return KernelTable(Entry(op=c.op, args=c.args, kwargs=c.kwargs, device=torch.device("cpu"),
                             runner=Counting(c.op, calls), label=c.short_op, key=c.key)
                       for c in cards)


def test_region_kernels_run_in_the_compiled_model_for_their_variant(block):
    model, x, cards = block
    calls: Counter = Counter()
    chosen = backend(table_of(cards, calls))
    with torch.no_grad():
        expected = model(x)
        compiled = torch.compile(model, backend=chosen)
        got = compiled(x)
    assert torch.allclose(got, expected, rtol=1e-4, atol=1e-5)
    named = stages(cards)
    # the scaled softmax is rewritten by Inductor's own patterns first: it stays Inductor's
    assert calls == {named["norm"].op: 1, named["gate"].op: 1}
    graph = chosen.report
    assert graph.replaced == {named["norm"].short_op: 1, named["gate"].short_op: 1}


def test_a_region_chain_of_another_shape_stays_inductors(block):
    model, x, cards = block
    calls: Counter = Counter()
    chosen = backend(table_of([stages(cards)["norm"]], calls))
    other = torch.randn(3, 8, 32)
    with torch.no_grad():
        got = torch.compile(model, backend=chosen, dynamic=False)(other)
        assert torch.allclose(got, model(other), rtol=1e-4, atol=1e-5)
    assert calls == {}
    assert chosen.report.nodes == 0


class Leaky(torch.nn.Module):
    """The block's RMSNorm, with its normalised input (an intermediate of the chain) also used
    on its own."""

    def __init__(self, block) -> None:
        super().__init__()
        self.norm = block.norm

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rstd = torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)
        return self.norm.weight * (x * rstd) + rstd


def test_a_chain_whose_intermediate_is_used_elsewhere_stays_inductors(block):
    model, x, cards = block
    calls: Counter = Counter()
    chosen = backend(table_of([stages(cards)["norm"]], calls))
    leaky = Leaky(model).eval()
    with torch.no_grad():
        got = torch.compile(leaky, backend=chosen)(x)
        assert torch.allclose(got, leaky(x), rtol=1e-4, atol=1e-5)
    assert calls == {} and chosen.report.nodes == 0


def test_a_region_whose_chain_is_not_in_the_graph_says_so_once(block):
    model, x, cards = block
    calls: Counter = Counter()
    chosen = backend(table_of([stages(cards)["gate"]], calls))
    plain = torch.nn.Linear(32, 32).eval()
    with torch.no_grad(), pytest.warns(KforgeWarning, match="has its op call or region chain"):
        torch.compile(plain, backend=chosen)(x)
    assert calls == {}


def profiled_regions(builder: str, **options):
    """A benchmark model built on the CPU in float32 (``bench/bench_e2e.py:<builder>``), and its
    region cards from a profile, their operators registered."""
    from pathlib import Path

    from bench import bench_e2e
    from kforge.capture import ModelOptions, load_model, profile
    from kforge.runtime.regions import register_cards

    loaded = load_model(f"{bench_e2e.HERE}:{builder}",
                        ModelOptions(device="cpu", batch=1, dtype="float32", **options))
    cards = [c for c in profile(loaded, samples_per_card=0, staging_dir=Path("/nonexistent"),
                                regions=True).cards if c.region is not None]
    register_cards(cards)
    return loaded, cards


def test_a_llama_shaped_model_runs_its_norm_and_gated_regions_compiled():
    """An unseen transformers model (the Llama architecture, 2 layers): its RMSNorm, gated-MLP
    and rotary regions, found by profiling on the CPU, are found again in the compiled graph."""
    pytest.importorskip("transformers")
    from kforge.integrate.regions import ForwardSwap
    from kforge.runtime.guard import Patch

    loaded, cards = profiled_regions("build_llama", seq_len=16, layers=2)
    calls: Counter = Counter()
    chosen = backend(table_of(cards, calls))
    with torch.no_grad():
        expected = loaded.model(*loaded.args, **loaded.kwargs).logits
        got = torch.compile(loaded.model, backend=chosen)(*loaded.args, **loaded.kwargs).logits
    assert torch.allclose(got, expected, rtol=1e-4, atol=1e-4)
    ran = {c.short_op.split("(")[1].split(",")[0] for c in cards if calls[c.op]}
    assert {"pow", "silu"} <= ran  # RMSNorm, silu(gate) * up
    assert sum(chosen.report.replaced.values()) == sum(calls.values())

    # eager: every RMSNorm module (2 per layer and the last) runs the norm region's kernel
    norm = next(c for c in cards if c.short_op.startswith("region(pow"))
    calls.clear()
    with torch.no_grad(), ForwardSwap(loaded.model, [norm]) as swap, Patch(table_of([norm],
                                                                                    calls)):
        got = loaded.model(*loaded.args, **loaded.kwargs).logits
    assert len(swap.placed) == 5 and calls == {norm.op: 5}
    assert torch.allclose(got, expected, rtol=1e-4, atol=1e-4)


def test_a_unet_style_model_runs_its_group_norm_silu_regions_compiled():
    """The UNet-style model of the benchmarks (GroupNorm + SiLU, convolutions, softmax
    attention): every region card's chain runs as its kernel in the compiled model."""
    loaded, cards = profiled_regions("build_unet")
    calls: Counter = Counter()
    chosen = backend(table_of(cards, calls))
    with torch.no_grad():
        expected = loaded.model(*loaded.args)
        got = torch.compile(loaded.model, backend=chosen)(*loaded.args)
    assert torch.allclose(got, expected, rtol=1e-4, atol=1e-4)
    kinds = {c.short_op.split("(")[1].split(",")[0] for c in cards}
    assert kinds == {"native_group_norm", "_unsafe_view"}
    # each GroupNorm + SiLU chain once per call, as profiled; the scaled softmax is rewritten by
    # Inductor's own patterns first and stays Inductor's
    assert calls == {c.op: c.calls for c in cards if "native_group_norm" in c.short_op}
