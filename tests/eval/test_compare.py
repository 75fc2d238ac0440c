"""Comparison with eager: tolerances, NaN/Inf positions, error norms, layouts."""

from __future__ import annotations

import math

import pytest
import torch

from kforge.eval.verify.compare import (
    Meta,
    compare_structure,
    compare_values,
    layout_problem,
    tolerance_for,
)


def test_close_float32_values_pass_and_report_their_error():
    ref = torch.randn(1000, generator=torch.Generator().manual_seed(0))
    report = compare_values(ref * (1 + 1e-6), ref)
    assert report.ok
    assert 0 < report.rel_norm < 1e-5
    assert report.max_abs > 0


def test_float32_error_above_tolerance_fails_with_position():
    ref = torch.ones(4, 5)
    out = ref.clone()
    out[2, 3] = 1.01
    report = compare_values(out, ref)
    assert not report.ok
    assert report.bad == 1
    assert "[2, 3]" in report.reason


def test_all_zeros_fail_a_small_valued_bf16_softmax_that_atol_alone_would_pass():
    scores = torch.randn(8, 4096, generator=torch.Generator().manual_seed(0)) * 0.5
    ref = torch.softmax(scores, -1).to(torch.bfloat16)
    zeros = torch.zeros_like(ref)
    assert torch.allclose(zeros.float(), ref.float(), atol=1e-2, rtol=1e-2)  # the naive check passes
    report = compare_values(zeros, ref)
    assert not report.ok


def test_partial_output_fails_even_when_each_wrong_element_is_small():
    ref = torch.softmax(torch.randn(64, 1024, generator=torch.Generator().manual_seed(1)), -1)
    ref = ref.to(torch.float16)
    out = ref.clone()
    out[1:] = 0
    assert not compare_values(out, ref).ok


def test_lower_precision_arithmetic_fails_the_error_norm():
    x = torch.randn(256, 256, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    ref = (x @ x).float()
    low = (x.float().to(torch.bfloat16) @ x.float().to(torch.bfloat16)).float()
    report = compare_values(low, ref)
    assert not report.ok


def test_nan_is_no_wildcard_in_either_direction():
    ref = torch.tensor([1.0, float("nan"), 3.0])
    assert not compare_values(torch.tensor([float("nan")] * 3), ref).ok
    assert not compare_values(torch.tensor([1.0, 2.0, 3.0]), ref).ok
    assert compare_values(torch.tensor([1.0, float("nan"), 3.0]), ref).ok


def test_infinities_must_match_with_sign():
    ref = torch.tensor([float("-inf"), 0.5, float("inf")])
    assert compare_values(ref.clone(), ref).ok
    flipped = torch.tensor([float("inf"), 0.5, float("inf")])
    report = compare_values(flipped, ref)
    assert not report.ok and "inf" in report.reason


def test_integers_and_booleans_must_be_equal():
    ref = torch.arange(10)
    out = ref.clone()
    out[7] = 0
    report = compare_values(out, ref)
    assert not report.ok and report.bad == 1 and "[7]" in report.reason
    assert compare_values(torch.tensor([True, False]), torch.tensor([True, False])).ok


def test_all_zero_reference_uses_an_absolute_bound():
    ref = torch.zeros(10)
    assert compare_values(torch.full((10,), 1e-6), ref).ok
    assert not compare_values(torch.full((10,), 1e-2), ref).ok


def test_tolerances_follow_the_dtype():
    assert tolerance_for(torch.float32).rtol == pytest.approx(1e-4)
    assert tolerance_for(torch.bfloat16).rtol == pytest.approx(1e-2)
    assert tolerance_for(torch.float16).rtol == pytest.approx(1e-2)
    assert tolerance_for(torch.int64) is None
    assert tolerance_for(torch.float8_e4m3fn) is not None


def test_layout_must_match_except_strides_of_unit_dims():
    ref = Meta.of(torch.empty(4, 8))
    assert layout_problem(Meta.of(torch.empty(4, 8)), ref) is None
    assert "strides" in layout_problem(Meta.of(torch.empty(8, 4).t()), ref)
    assert "shape" in layout_problem(Meta.of(torch.empty(4, 9)), ref)
    assert "dtype" in layout_problem(Meta.of(torch.empty(4, 8, dtype=torch.float16)), ref)
    unit = Meta.of(torch.empty(4, 1))
    assert layout_problem(Meta.of(torch.empty(4, 1).as_strided((4, 1), (1, 7))), unit) is None


def test_structure_must_match_eager():
    t = torch.empty(1)
    assert compare_structure((t, t), (t, t)) is None
    assert "tuple of 1" in compare_structure((t,), (t, t))
    assert "eager returns a tensor" in compare_structure([t], t)
    assert compare_structure(3, 3) is None
    assert compare_structure(math.nan, math.nan) is None
    assert "is 4" in compare_structure(4, 3)


def test_exact_comparison_tells_negative_zero_from_zero_and_ignores_nan_payloads():
    ref = torch.tensor([-0.0, 1.5, float("nan")])
    assert compare_values(ref.clone(), ref, exact=True).ok
    assert compare_values(torch.tensor([0.0, 1.5, float("nan")]), ref).ok  # values agree
    report = compare_values(torch.tensor([0.0, 1.5, float("nan")]), ref, exact=True)
    assert not report.ok and not report.forgivable and "other sign" in report.reason
    payload = torch.tensor([-0.0, 1.5, 0.0]).view(torch.int32)
    payload[2] = 0x7FC00001
    assert compare_values(payload.view(torch.float32), ref, exact=True).ok


def test_nan_out_of_place_is_never_forgivable():
    report = compare_values(torch.tensor([0.0, 1.0]), torch.tensor([float("nan"), 1.0]))
    assert not report.ok and not report.forgivable
