"""A mode for which no kforge kernel was chosen: it is the mode alone, timed once, and its
``+ kforge`` row says so; torch.compile's own modes are always timed."""

from __future__ import annotations

import torch

from kforge.integrate.decide import hand_back
from kforge.integrate.measure import parse_modes, run_modes
from kforge.runtime.guard import Patch
from kforge.runtime.table import KernelTable
from tests.integrate.helpers import cpu_model


def test_modes_with_no_kernel_chosen_take_their_own_figures_and_say_so():
    loaded = cpu_model()
    calls = []
    loaded.model.register_forward_pre_hook(lambda *_: calls.append(1))
    torch._dynamo.reset()
    with torch._inductor.config.patch(fx_graph_cache=False):
        result = run_modes(loaded, parse_modes("eager,compile", aa=True),
                           patched=Patch(KernelTable()), compiled={"default": KernelTable()},
                           projected=1.0, reps=2, warmup=1)
    torch._dynamo.reset()
    rows = {s.mode: s for s in result.subjects}
    assert set(rows) == {"eager", "eager+kforge", "compile", "compile+aa", "compile+kforge"}
    # torch.compile alone is timed even though kforge chose nothing for it
    assert rows["compile"].timing is not None and rows["compile"].setup_s is not None
    assert rows["compile+aa"].timing is not None
    # the +kforge rows are their modes alone: the same figures, not a second timing
    assert rows["eager+kforge"].timing is rows["eager"].timing
    assert rows["eager+kforge"].kernels == "no kernels (eager's own)"
    assert rows["compile+kforge"].timing is rows["compile"].timing
    assert rows["compile+kforge"].kernels == "no kernels (Inductor's own)"
    assert result.gain("eager") is None and result.gain("compile") is None
    hand_back(result)
    assert rows["compile+kforge"].tried is None  # nothing of kforge's was timed
    assert result.notes[-1] == ("compile + kforge: no kforge kernel is in the compiled model: "
                                "Inductor's own result is handed back")
