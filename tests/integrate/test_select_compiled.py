"""Measured selection for compiled models, on the CPU: only kernels that beat their op as
Inductor compiles it are tried, each in the compiled model, and one that slows the compiled model
is left to Inductor with the reason."""

from __future__ import annotations

import dataclasses
import time
from collections import Counter

import torch

from kforge.integrate.decide import by_compiled_saving, choose_compiled
from kforge.integrate.patching import SessionPatch
from kforge.integrate.plan import SessionPlan
from kforge.integrate.winners import Decision
from kforge.runtime.table import Entry, KernelTable
from kforge.store.records import Session
from tests.integrate.helpers import WINNING_OPS, profile_toy
from tests.integrate.standins import Counting


class Slow(Counting):
    """A stand-in kernel that takes 5 ms a call: any model it runs in gets slower."""

    def __call__(self, args: tuple, kwargs: dict):
        time.sleep(0.005)
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
    plan = SessionPlan(session, [Decision(softmax, True, "faster", speedup=2.0),
                                 Decision(norm, True, "faster", speedup=1.4),
                                 Decision(gelu, True, "faster", speedup=1.25)])
    patch = SessionPatch(plan, table, [])

    order = by_compiled_saving(patch)
    # softmax saves 3 us a call over Inductor's code (5 us against 8), gelu 2 us (8 against eager's
    # 10: no compiled baseline), layer norm nothing (7.1 us against 5)
    assert [e.key for e in order] == [softmax.key, gelu.key]
    with torch.no_grad():
        kept, selection = choose_compiled(loaded, patch, reps=3, warmup=1)
    assert len(selection.trials) == 2 and not kept.entries
    assert all("slower" in t.reason for t in selection.trials)
    assert norm.op not in calls  # never tried
    torch._dynamo.reset()
