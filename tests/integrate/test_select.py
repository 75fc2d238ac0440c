"""Measured selection of winners (``kforge.integrate.winners.select``) against fake whole-model
timings: each winner adds a fixed gain or loss to the forward, and every measurement is off by at
most half its reported p10..p90 band."""

from __future__ import annotations

import math
import random

from hypothesis import given, settings
from hypothesis import strategies as st

from kforge.core.candidate import Timing
from kforge.integrate.winners import TrialFailed, select

BASE_US = 1000.0


def timing(median: float, spread: float) -> Timing:
    return Timing(median_us=median, p10_us=median * (1 - spread / 2),
                  p90_us=median * (1 + spread / 2), reps=20)


class FakeModel:
    """Forward time ``BASE_US - sum(gains)``, each measurement off by a random relative error of
    at most ``noise / 2``, reported with a p10..p90 band of ``noise``."""

    def __init__(self, gains: dict[str, float], noise: float, seed: int) -> None:
        self.gains, self.noise = gains, noise
        self.random = random.Random(seed)
        self.measured: list[frozenset[str]] = []

    def true_us(self, subset: frozenset[str]) -> float:
        # summed exactly: a set's iteration order must not decide a tie (a winner of gain 0
        # measured faster by a rounding)
        return BASE_US - math.fsum(self.gains[w] for w in subset)

    def __call__(self, subset: frozenset[str]) -> Timing:
        self.measured.append(subset)
        error = self.random.uniform(-self.noise / 2, self.noise / 2)
        return timing(self.true_us(subset) * (1 + error), self.noise)


gains_strategy = st.dictionaries(st.sampled_from("abcdefgh"),
                                 st.floats(-80.0, 80.0, allow_nan=False), max_size=8)


@settings(max_examples=200, deadline=None)
@given(gains=gains_strategy, noise=st.floats(0.0, 0.2), seed=st.integers(0, 2**16))
def test_a_harmful_winner_is_never_kept_and_the_result_is_never_slower(gains, noise, seed):
    model = FakeModel(gains, noise, seed)
    selection = select(list(gains), model)
    assert not [w for w in selection.kept if gains[w] <= 0]
    assert selection.final.median_us <= selection.baseline.median_us
    assert selection.speedup >= 1.0
    assert len(model.measured) == len(gains) + 1 and model.measured[0] == frozenset()
    assert [t.winner for t in selection.trials] == list(gains)
    assert set(selection.kept) | {t.winner for t in selection.dropped} == set(gains)


@settings(max_examples=200, deadline=None)
@given(gains=st.dictionaries(st.sampled_from("abcdefgh"),
                             st.integers(-80, 80).map(float), max_size=8),
       seed=st.integers(0, 2**16))
def test_without_noise_exactly_the_helpful_winners_are_kept(gains, seed):
    selection = select(list(gains), FakeModel(gains, 0.0, seed))
    assert set(selection.kept) == {w for w, g in gains.items() if g > 0}


@settings(max_examples=100, deadline=None)
@given(gains=gains_strategy, noise=st.floats(0.0, 0.5), seed=st.integers(0, 2**16),
       order_seed=st.integers(0, 2**16))
def test_any_measurement_the_kept_set_is_faster_by_it_in_any_order(gains, noise, seed,
                                                                   order_seed):
    winners = list(gains)
    random.Random(order_seed).shuffle(winners)
    selection = select(winners, FakeModel(gains, noise, seed))
    kept_medians = [t.timing.median_us for t in selection.trials if t.kept]
    assert kept_medians == sorted(kept_medians, reverse=True)
    assert all(m < selection.baseline.median_us for m in kept_medians)


def test_a_gain_inside_the_noise_is_dropped_and_says_why():
    noisy = FakeModel({"small": 5.0, "big": 200.0, "bad": -50.0}, 0.04, 0)
    selection = select(["small", "big", "bad"], noisy)
    assert selection.kept == ("big",)
    small, big, bad = selection.trials
    assert "inside the timing noise" in small.reason
    assert big.reason.startswith("the model is 1.") and "faster with it" in big.reason
    assert bad.reason.startswith("the model is slower with it")


def test_no_winners_measures_the_model_once():
    model = FakeModel({}, 0.01, 0)
    selection = select([], model)
    assert selection.kept == () and selection.speedup == 1.0 and model.measured == [frozenset()]


def test_a_winner_the_model_cannot_run_with_is_left_out_with_the_reason():
    model = FakeModel({"a": 100.0, "b": 50.0, "c": 80.0}, noise=0.01, seed=1)

    def measure(subset: frozenset[str]) -> Timing:
        if "b" in subset:
            raise TrialFailed("the forward cannot be captured as a CUDA graph")
        return model(subset)

    selection = select(["a", "b", "c"], measure)
    assert selection.kept == ("a", "c")
    failed = next(t for t in selection.trials if t.winner == "b")
    assert not failed.kept and failed.timing is None
    assert failed.reason == ("the model cannot run with it: the forward cannot be captured as "
                             "a CUDA graph")
