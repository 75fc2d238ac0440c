"""Region winners in eager mode on the CPU: a module whose whole forward is a region runs the
region's operator, which the guard serves for the exact variant; the model computes as before."""

from __future__ import annotations

import torch

from kforge.capture.recorder import ModuleTracker
from kforge.capture.regions import TraceRecorder, region_cards
from kforge.integrate.regions import ForwardSwap
from kforge.runtime.guard import Patch
from kforge.runtime.table import Entry, KernelTable
from tests.capture.test_regions import Block


def cards_of(model: torch.nn.Module, x: torch.Tensor):
    tracker = ModuleTracker(model)
    recorder = TraceRecorder(tracker)
    with torch.no_grad(), tracker, recorder:
        model(x)
    return region_cards(recorder.trace, [], 1.0, recorder.forwards).cards


def test_the_norm_module_runs_the_region_operator_and_the_model_is_unchanged():
    torch.manual_seed(0)
    model, x = Block(), torch.randn(2, 8, 32)
    cards = cards_of(model, x)
    with torch.no_grad():
        expected = model(x)
        with ForwardSwap(model, cards) as swap:
            got = model(x)
            other = model(torch.randn(3, 8, 32))  # another variant: the chain itself runs
    assert list(swap.placed) == ["norm"]
    assert any("not the whole forward" in note for note in swap.notes)
    assert torch.equal(got, expected) and other.shape == (3, 8, 32)
    assert "forward" not in vars(model.norm)  # removed: the class's forward again


def test_a_kernel_for_the_region_serves_the_swapped_module():
    model, x = Block(), torch.randn(2, 8, 32)
    norm = next(c for c in cards_of(model, x) if c.region.get("forward"))
    calls = []

    def kernel(args, kwargs):
        calls.append(1)
        return torch.zeros(2, 8, 32)

    table = KernelTable([Entry(norm.op, norm.args, norm.kwargs, kernel, torch.device("cpu"))])
    with torch.no_grad(), ForwardSwap(model, [norm]), Patch(table):
        assert torch.equal(model.norm(x), torch.zeros(2, 8, 32))
    assert calls == [1]


def test_a_session_patch_bound_to_the_model_swaps_in_its_region_kernels_while_active():
    from kforge.integrate.patching import SessionPatch
    from kforge.integrate.plan import SessionPlan
    from kforge.integrate.winners import CardChoice
    from kforge.runtime.regions import register_cards
    from kforge.store.records import Session

    model, x = Block(), torch.randn(2, 8, 32)
    cards = cards_of(model, x)
    norm = next(c for c in cards if c.region.get("forward"))
    register_cards([norm])
    calls = []

    def kernel(args, kwargs):
        calls.append(1)
        return torch.zeros(2, 8, 32)

    table = KernelTable([Entry(norm.op, norm.args, norm.kwargs, kernel, torch.device("cpu"),
                               key=norm.key)])
    session = Session(id=1, model="block", gpu={}, settings={}, status="done", error="",
                      created_at=0.0, updated_at=0.0)
    plan = SessionPlan(session, [CardChoice(norm, True, "faster")])
    patch = SessionPatch(plan, table, [])
    with torch.no_grad():
        with patch:  # no model: the module's own forward, its ops unpatched
            model.norm(x)
        assert calls == []
        bound = patch.for_model(model)
        with bound:
            assert torch.equal(model.norm(x), torch.zeros(2, 8, 32))
        assert calls == [1]
        assert "forward" not in vars(model.norm)
        with bound.subset([]):  # a trial without the kernel: no swap
            model.norm(x)
    assert calls == [1]
    assert bound.region_cards() == [norm] and bound.subset([]).region_cards() == []
    assert any("run only in a patch that knows the model" in n for n in patch.report().notes)
    assert not any("knows the model" in n for n in bound.report().notes)
