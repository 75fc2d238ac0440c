"""Regions of a small transformer-style block on the CPU: the norm, the gated activation and the
attention softmax chains are found, and each region's operator computes what the model did."""

from __future__ import annotations

import torch

from kforge.capture.recorder import ModuleTracker
from kforge.capture.regions import TraceRecorder, region_cards
from kforge.runtime.regions import register


class RMSNorm(torch.nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6)
        return self.weight * h.to(x.dtype)


class Block(torch.nn.Module):
    def __init__(self, width: int = 32) -> None:
        super().__init__()
        self.norm = RMSNorm(width)
        self.gate = torch.nn.Linear(width, 64, bias=False)
        self.up = torch.nn.Linear(width, 64, bias=False)
        self.down = torch.nn.Linear(64, width, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.norm(x)
        h = self.down(torch.nn.functional.silu(self.gate(h)) * self.up(h))
        scores = torch.softmax((x @ x.transpose(-1, -2)) * 0.125, dim=-1)
        return h + scores @ x


def trace_of(model: torch.nn.Module, x: torch.Tensor):
    tracker = ModuleTracker(model)
    recorder = TraceRecorder(tracker)
    with torch.no_grad(), tracker, recorder:
        model(x)
    return recorder.trace


def test_norm_gate_and_softmax_chains_become_region_cards_that_compute_as_eager():
    torch.manual_seed(0)
    model = Block().to(torch.bfloat16)
    x = torch.randn(2, 8, 32, dtype=torch.bfloat16)
    plan = region_cards(trace_of(model, x), [], total_us=1.0)
    by_ops = {tuple(op.split(".")[1] for op in
                    (n["op"] for n in c.region["nodes"])): c for c in plan.cards}
    norm = next(c for ops, c in by_ops.items() if "rsqrt" in ops)
    gate = next(c for ops, c in by_ops.items() if "silu" in ops)
    assert next(ops for ops in by_ops if "_softmax" in ops)
    assert plan.modules[norm.key] == ["norm"] and norm.calls == 1
    with torch.no_grad():
        expected_norm = model.norm(x)
        gate_in, up_in = model.gate(expected_norm), model.up(expected_norm)
        norm_op = register(norm.region)
        inputs = [x, model.norm.weight.detach()]
        if norm.args[0]["shape"] != list(x.shape):
            inputs.reverse()
        assert torch.equal(norm_op(*inputs), expected_norm)
        gate_op = register(gate.region)
        assert torch.equal(gate_op(gate_in, up_in), torch.nn.functional.silu(gate_in) * up_in)


def test_a_model_without_chains_has_no_region_cards():
    model = torch.nn.Linear(8, 8)
    assert region_cards(trace_of(model, torch.randn(2, 8)), [], 1.0).cards == []


def test_a_region_compiles_as_its_chain_and_matches_its_operator():
    from kforge.runtime.regions import region_function

    model = Block()
    x = torch.randn(2, 8, 32)
    plan = region_cards(trace_of(model, x), [], total_us=1.0)
    card = next(c for c in plan.cards if any("silu" in n["op"] for n in c.region["nodes"]))
    a, b = torch.randn(2, 8, 64), torch.randn(2, 8, 64)
    compiled = torch.compile(region_function(card.region), dynamic=False)
    torch.testing.assert_close(compiled(a, b), register(card.region)(a, b))


def test_a_region_that_is_a_whole_module_forward_says_how_to_call_it():
    model = Block()
    x = torch.randn(2, 8, 32)
    tracker = ModuleTracker(model)
    recorder = TraceRecorder(tracker)
    with torch.no_grad(), tracker, recorder:
        model(x)
    plan = region_cards(recorder.trace, [], 1.0, recorder.forwards)
    norm = next(c for c in plan.cards if any("rsqrt" in n["op"] for n in c.region["nodes"]))
    gate = next(c for c in plan.cards if any("silu" in n["op"] for n in c.region["nodes"]))
    assert norm.region["forward"]["paths"] == ["norm"]
    assert sorted(map(tuple, norm.region["forward"]["inputs"])) == [("arg", 0), ("param", "weight")]
    assert "forward" not in gate.region  # part of the block's forward, not a module of its own


class GatedMLP(torch.nn.Module):
    """A Llama-style MLP: the activation is a child module of its own (``act_fn``)."""

    def __init__(self, width: int = 32) -> None:
        super().__init__()
        self.gate = torch.nn.Linear(width, 64, bias=False)
        self.up = torch.nn.Linear(width, 64, bias=False)
        self.down = torch.nn.Linear(64, width, bias=False)
        self.act_fn = torch.nn.SiLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(self.act_fn(self.gate(x)) * self.up(x))


def test_an_activation_module_joins_the_chain_around_it():
    model, x = GatedMLP(), torch.randn(2, 8, 32)
    plan = region_cards(trace_of(model, x), [], total_us=1.0)
    (gate,) = plan.cards
    assert [n["op"] for n in gate.region["nodes"]] == ["aten.silu.default", "aten.mul.Tensor"]
    assert plan.modules[gate.key] == [""]  # the MLP's own call, around act_fn
    assert "forward" not in gate.region  # not the whole forward of any one module
    with torch.no_grad():
        h = model.gate(x), model.up(x)
        assert torch.equal(register(gate.region)(*h), torch.nn.functional.silu(h[0]) * h[1])


class Residual(torch.nn.Module):
    """A decoder layer's second half: the residual add feeds a norm module, and is needed again
    after it."""

    def __init__(self, width: int = 32) -> None:
        super().__init__()
        self.norm = RMSNorm(width)
        self.mlp = GatedMLP(width)

    def forward(self, x: torch.Tensor, attn: torch.Tensor) -> torch.Tensor:
        h = x + attn
        return h + self.mlp(self.norm(h))


def test_a_norm_module_fed_by_its_parents_residual_add_stays_a_region_of_its_own():
    model = Residual()
    x, attn = torch.randn(2, 8, 32), torch.randn(2, 8, 32)
    tracker = ModuleTracker(model)
    recorder = TraceRecorder(tracker)
    with torch.no_grad(), tracker, recorder:
        model(x, attn)
    plan = region_cards(recorder.trace, [], 1.0, recorder.forwards)
    norm = next(c for c in plan.cards if "rsqrt" in c.short_op or "pow" in c.short_op)
    assert norm.region["nodes"][0]["op"] == "aten.pow.Tensor_Scalar"  # the add stays outside
    assert norm.region["forward"]["paths"] == ["norm"]
    assert any(c.short_op == "region(silu,mul)" for c in plan.cards)
