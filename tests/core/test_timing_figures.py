"""The timing figures a candidate's outcome and a card's baseline carry: device time is the
distribution, host and wall time sit beside it, and a baseline that disagrees with the profile
gives no speedup."""

from __future__ import annotations

from kforge.core.candidate import Baseline, EvalOutcome, EvalStatus, Timing, profile_disagreement


def test_rows_stored_before_host_and_wall_times_still_load():
    old = {"median_us": 10.0, "p10_us": 9.0, "p90_us": 11.0, "reps": 50}
    outcome = EvalOutcome.from_dict({"status": "ok", "timing": old, "eager": old})
    assert outcome.timing == Timing(10.0, 9.0, 11.0, 50)
    assert outcome.timing.device_us == 10.0 and outcome.timing.host_us is None
    base = Baseline.from_dict({"eager": old})
    assert base.profile_us is None and base.profile_check == "" and base.trusted


def test_every_figure_survives_a_round_trip():
    timing = Timing(10.0, 9.0, 11.0, 50, host_us=30.0, wall_us=31.0)
    outcome = EvalOutcome(EvalStatus.OK, timing=timing, eager=timing)
    assert EvalOutcome.from_dict(outcome.to_dict()).timing == timing
    base = Baseline(eager=timing, profile_us=10.5, profile_check="",
                    eager_kernels=[{"name": "a", "us": 4.0, "calls": 1.0},
                                   {"name": "b", "us": 5.0, "calls": 2.0}])
    assert Baseline.from_dict(base.to_dict()) == base
    assert base.kernels_us == 9.0 and base.launches == 3.0


def test_a_baseline_far_from_the_profile_gives_no_speedup_and_says_why():
    assert profile_disagreement(24.0, 24.6) == ""
    assert profile_disagreement(30.0, None) == ""
    reason = profile_disagreement(254.9, 24.6)
    assert "10.36x" in reason and "24.6 us" in reason
    # Like with like: kernels against the profile, device time against kernels plus launch gaps
    # (the RMSNorm chain on an H200: 52.1 us of device time over 37.5 us in 8 kernels).
    assert profile_disagreement(52.1, 37.0, kernels_us=37.5, launches=8) == ""
    other = profile_disagreement(52.1, 24.6, kernels_us=37.5, launches=8)
    assert "kernels take 37.5 us per call here, 1.52x the profile's 24.6 us" in other
    host = profile_disagreement(254.9, 24.6, kernels_us=24.0, launches=7)
    assert "the window holds host time" in host and "7 launch gaps" in host
    eager = Timing(254.9, 250.0, 260.0, 100)
    base = Baseline(eager=eager, profile_us=24.6, profile_check=reason)
    assert not base.trusted and base.speedup(6.3) is None
    assert Baseline(eager=eager, profile_us=250.0).speedup(25.49) == 10.0


def test_a_speedup_above_ten_is_held_until_a_confirmation_run_retimes_it():
    from kforge.core.candidate import held_reason
    from kforge.core.outcome import Confirmation

    assert held_reason(9.9) == "" and held_reason(None) == ""
    reason = held_reason(36.74)
    assert "36.7x" in reason and "fresh worker" in reason
    first = EvalOutcome(EvalStatus.OK, speedup=36.74, confirmation=Confirmation(held=reason))
    assert first.held
    confirmed = EvalOutcome(EvalStatus.OK, speedup=35.0,
                            confirmation=Confirmation(held=reason, confirmed=True))
    assert not confirmed.held and not EvalOutcome(EvalStatus.OK, speedup=3.0).held
