"""Range entries in the guard, on the CPU with stand-in kernels: a range kernel runs at every point
of its range, its plan resolved per point, and every call outside the range, of another layout,
or at a point its plan does not cover runs eager PyTorch."""

from __future__ import annotations

import pytest
import torch

from kforge.core.argspec import encode_call
from kforge.core.laws import RangeError, Ranges, Symbol
from kforge.core.opcard import OpCard
from kforge.core.ranges import fit_laws, range_card
from kforge.runtime.guard import Patch, _native_variants
from kforge.runtime.table import Entry, KernelTable, RangeRunner
from tests.integrate.standins import PyKernels
from tests.integrate.test_runtime import MARK, SOFTMAX, is_marked, mark, marking_plan

CPU = torch.device("cpu")


def scores(length: int) -> torch.Tensor:
    """Attention scores of one decode step: ``[1, 4, 1, length]``."""
    return torch.randn(1, 4, 1, length)


def softmax_spec(length: int) -> tuple[list, dict]:
    return encode_call(torch.ops.aten._softmax.default, (scores(length), -1, False), {})


def softmax_range(lo: int = 1, hi: int = 64, at: int = 16) -> OpCard:
    laws = fit_laws([(n, *softmax_spec(n)) for n in (at, 3, 40)])
    return range_card(OpCard(SOFTMAX, *softmax_spec(at)),
                      Ranges((Symbol("L", lo, hi, at),), laws))


def range_entry(card: OpCard, plan: dict | None = None,
                kernels: PyKernels | None = None) -> tuple[Entry, PyKernels]:
    kernels = kernels or PyKernels(mark=mark)
    runner = RangeRunner(plan or marking_plan(SOFTMAX), card.op, card.args, card.kwargs,
                         card.ranges, kernels, CPU)
    return Entry(card.op, card.args, card.kwargs, runner, CPU, label="softmax L",
                 key=card.key, ranges=card.ranges), kernels


def test_a_range_kernel_runs_at_every_point_of_its_range_and_nowhere_else():
    entry, kernels = range_entry(softmax_range(1, 64, 16))
    outside = {"past the end": scores(65), "other layout": scores(16)[..., ::2],
               "other dtype": scores(8).double()}
    expected = {what: torch.softmax(x, -1) for what, x in outside.items()}
    with torch.no_grad(), Patch(KernelTable([entry])) as patch:
        for length in (1, 2, 16, 33, 64):
            assert is_marked(torch.softmax(scores(length), -1)), length
        for what, x in outside.items():
            assert torch.equal(torch.softmax(x, -1), expected[what]), what
    report = patch.report()
    assert report.kernels[0].hits == 5 and report.misses == {SOFTMAX: 3}
    # the plan was resolved for each point: each launch's numel follows the call
    assert [int(launch.params[2]) for launch in kernels.launches] == [4, 8, 64, 132, 256]


def test_exact_entries_are_looked_up_first_and_the_op_stays_on_the_python_guard():
    card = softmax_range()
    entry, _ = range_entry(card)
    x = scores(16)
    exact_kernels = PyKernels(mark=lambda out, *rest: out.fill_(MARK + 1))
    from tests.integrate.test_runtime import plan_entry

    exact = plan_entry(SOFTMAX, *softmax_spec(16), marking_plan(SOFTMAX), exact_kernels)
    table = KernelTable([entry, exact])
    assert _native_variants(list(table.ops().values())) is None
    with torch.no_grad(), Patch(table):
        assert bool((torch.softmax(x, -1) == MARK + 1).all())
        assert is_marked(torch.softmax(scores(17), -1))


def test_a_point_the_plan_does_not_cover_falls_back_without_turning_the_kernel_off():
    plan = {**marking_plan(SOFTMAX), "requires": ["self.shape[3] % 2 == 0"]}
    entry, _ = range_entry(softmax_range(), plan)
    odd = scores(7)
    expected = torch.softmax(odd, -1)
    with torch.no_grad(), Patch(KernelTable([entry])) as patch:
        assert torch.equal(torch.softmax(odd, -1), expected)
        assert is_marked(torch.softmax(scores(8), -1))
    (count,) = patch.report().kernels
    assert (count.hits, count.fallbacks, count.disabled) == (1, 1, "")


def test_a_range_runner_called_directly_finds_its_point():
    entry, _ = range_entry(softmax_range())
    out = entry.runner((scores(9), -1, False), {})
    assert is_marked(out) and out.shape == (1, 4, 1, 9)
    with pytest.raises(RangeError, match="outside"):
        entry.runner((scores(99), -1, False), {})
