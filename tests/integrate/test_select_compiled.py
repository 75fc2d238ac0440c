"""Measured selection for compiled models, on the CPU: only kernels that beat their op as
Inductor compiles it are tried, each in the compiled model, and one that slows the compiled model
is left to Inductor with the reason."""

from __future__ import annotations

import dataclasses
import time
from collections import Counter

import pytest
import torch

from kforge.core.candidate import Timing
from kforge.integrate import api, decide, measure
from kforge.integrate.backend import KforgeWarning
from kforge.integrate.decide import by_compiled_saving, choose_compiled
from kforge.integrate.patching import SessionPatch
from kforge.integrate.plan import SessionPlan
from kforge.integrate.winners import CardChoice
from kforge.runtime.table import Entry, KernelTable
from kforge.store.records import Session
from tests.integrate.helpers import WINNING_OPS, profile_toy
from tests.integrate.standins import Counting


class Slow(Counting):
    """A stand-in kernel that takes 20 ms a call: any model it runs in gets slower, by more than
    a busy machine's scheduling noise."""

    def __call__(self, args: tuple, kwargs: dict):
        time.sleep(0.02)
        return super().__call__(args, kwargs)


def test_a_kernel_that_slows_the_compiled_model_is_left_to_inductor():
    torch._dynamo.reset()
    loaded, result = profile_toy("cpu")
    cards = {c.op: c for c in result.cards if c.op in WINNING_OPS}
    softmax, norm, gelu = (cards[op] for op in ("aten._softmax.default",
                                                "aten.native_layer_norm.default",
                                                "aten.gelu.default"))
    # the layer norm kernel does not beat Inductor's code for it: never tried in the model
    norm = dataclasses.replace(norm, eager_us=10.0, compiled_us=5.0)
    softmax = dataclasses.replace(softmax, eager_us=10.0, compiled_us=8.0)
    gelu = dataclasses.replace(gelu, eager_us=10.0, compiled_us=None)
    calls: Counter = Counter()
    runners = {softmax.key: Slow(softmax.op, calls), norm.key: Counting(norm.op, calls),
               gelu.key: Slow(gelu.op, calls)}
    table = KernelTable(Entry(c.op, c.args, c.kwargs, runners[c.key], torch.device("cpu"),
                              label=c.short_op, key=c.key) for c in (softmax, norm, gelu))
    session = Session(id=1, model="toy", gpu={}, settings={}, status="done", error="",
                      created_at=0.0, updated_at=0.0)
    plan = SessionPlan(session, [CardChoice(softmax, True, "faster", speedup=2.0),
                                 CardChoice(norm, True, "faster", speedup=1.4),
                                 CardChoice(gelu, True, "faster", speedup=1.25)])
    patch = SessionPatch(plan, table, [])

    order = by_compiled_saving(patch)
    # softmax saves 3 us a call over Inductor's code (5 us against 8), gelu 2 us (8 against eager's
    # 10: no compiled baseline), layer norm nothing (7.1 us against 5)
    assert [e.key for e in order] == [softmax.key, gelu.key]
    with torch.no_grad():
        kept, selection = choose_compiled(loaded, patch, reps=5, warmup=2)
    assert len(selection.trials) == 2 and not kept.entries
    assert all("slower" in t.reason for t in selection.trials), [t.reason for t in
                                                                 selection.trials]
    assert norm.op not in calls  # never tried
    torch._dynamo.reset()


def test_compile_hands_back_torch_compiles_own_model_where_kforges_is_slower(monkeypatch):
    torch._dynamo.reset()
    loaded, result = profile_toy("cpu")
    card = next(c for c in result.cards if c.op == "aten._softmax.default")
    calls: Counter = Counter()
    table = KernelTable([Entry(card.op, card.args, card.kwargs, Counting(card.op, calls),
                               torch.device("cpu"), label=card.short_op, key=card.key)])
    session = Session(id=1, model="toy", gpu={}, settings={}, status="done", error="",
                      created_at=0.0, updated_at=0.0)
    patch = SessionPatch(SessionPlan(session, [CardChoice(card, True, "faster", speedup=2.0)]),
                         table, [])
    monkeypatch.setattr(measure, "cuda_device_of", lambda *a: torch.device("cpu"))
    monkeypatch.setattr(api, "choose_compiled", lambda *a, **k: (table, None))
    monkeypatch.setattr(decide, "time_forwards", lambda loaded, subjects, reps, warmup: {
        "alone": timing(1000.0), "kforge": timing(1100.0)})
    with pytest.warns(KforgeWarning, match="0.909x of torch.compile alone .*Inductor's own "
                                           "result is handed back"):
        compiled = api.compile(loaded.model, patch, example_inputs=loaded.args, reps=2,
                               warmup=1)
    assert not compiled.kforge_verdict.kept and not hasattr(compiled, "kforge_backend")
    assert calls[card.op] > 0  # kforge's version was compiled and run, then left out
    calls.clear()
    with torch.no_grad():
        assert torch.allclose(compiled(*loaded.args), loaded.model(*loaded.args), atol=1e-5)
    assert calls == {}
    torch._dynamo.reset()


def timing(median_us: float) -> Timing:
    return Timing(median_us, 0.99 * median_us, 1.01 * median_us, 20)
