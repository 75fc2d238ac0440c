"""A mismatch's evidence for the repair prompt: the worst elements with eager's and the
candidate's values, where the faults lie, error norms and NaN/inf counts."""

from __future__ import annotations

import json

import pytest
import torch

from kforge.core.candidate import EvalStatus
from kforge.core.outcome import Element, Mismatch, NonFinite
from kforge.core.schema import encode
from kforge.eval.verify.compare import Meta
from kforge.eval.verify.observe import Observed, Verdict, compare_observed


def observed(t: torch.Tensor) -> Observed:
    return Observed(t, [t], [Meta.of(t)], [None])


def mismatch(out: torch.Tensor, ref: torch.Tensor) -> Mismatch:
    with pytest.raises(Verdict) as caught:
        compare_observed(observed(out), observed(ref), "random seed 2, run 1")
    assert caught.value.status is EvalStatus.MISMATCH
    details = caught.value.evidence.mismatch
    json.dumps(encode(details, defaults=False))  # stored with the outcome
    return details


def test_a_wrong_tail_is_shown_with_its_worst_elements_and_span():
    ref = torch.randn(8, 130, generator=torch.Generator().manual_seed(0))
    out = ref.clone()
    out[:, 128:] = 0.0  # the last two columns never written
    details = mismatch(out, ref)
    assert details.where == "random seed 2, run 1" and details.result == 0
    assert details.shape == (8, 130) and details.dtype == "float32"
    assert details.fault_span == ((0, 7), (128, 129))
    worst = details.worst
    assert len(worst) == 8 and all(w.index[1] >= 128 and w.candidate == 0.0 for w in worst)
    top = worst[0]
    assert abs(top.eager) == pytest.approx(ref[:, 128:].abs().max().item())
    assert details.max_abs == pytest.approx(abs(ref[:, 128:]).max().item())


def test_misplaced_nan_is_counted_and_located():
    ref = torch.ones(4, 4)
    out = ref.clone()
    out[2, 3] = float("nan")
    details = mismatch(out, ref)
    assert details.nonfinite == {"nan": NonFinite(eager=0, candidate=1)}
    assert details.worst == (Element((2, 3), eager=1.0, candidate="nan"),)
    assert details.fault_span == ((2, 2), (3, 3))


def test_integers_list_the_unequal_elements():
    ref = torch.arange(10)
    out = ref.clone()
    out[7] = -1
    details = mismatch(out, ref)
    assert details.worst == (Element((7,), eager=7.0, candidate=-1.0),)
    assert details.faults == 1


def both(a: torch.Tensor, b: torch.Tensor) -> Observed:
    return Observed((a, b), [a, b], [Meta.of(a), Meta.of(b)], [None, None])


def test_a_forgiven_result_does_not_stop_the_next_one_from_being_compared():
    ref = torch.randn(64, generator=torch.Generator().manual_seed(1))
    asked = []

    def forgive(i: int) -> str | None:
        asked.append(i)
        return None if i == 0 else "against float64 it is less accurate than eager"

    with pytest.raises(Verdict) as caught:
        compare_observed(both(ref + 1.0, ref - 1.0), both(ref, ref), "seed 1", forgive=forgive)
    assert asked == [0, 1]
    assert caught.value.evidence.mismatch.result == 1
    assert caught.value.summary.endswith("; against float64 it is less accurate than eager")
    assert compare_observed(both(ref + 1.0, ref), both(ref, ref), "seed 1",
                            forgive=lambda i: None)
