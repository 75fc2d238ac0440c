"""Sample files: CPU tensors with the model's layout, within per-card and per-session byte caps."""

from __future__ import annotations

import torch

from kforge.capture.samples import (
    SampleBudget,
    cpu_copy_keeping_layout,
    save_sample,
    spread,
    storage_bytes_needed,
)


def test_copy_keeps_shape_strides_offset_and_values():
    base = torch.arange(40.0).reshape(4, 10)
    view = base[1:, 3:7].t()
    copy = cpu_copy_keeping_layout(view)
    assert copy.shape == view.shape and copy.stride() == view.stride()
    assert copy.storage_offset() == view.storage_offset() == 13
    assert torch.equal(copy, view)
    base.zero_()  # the copy does not share memory with the model's tensor
    assert copy.sum() > 0


def test_bytes_needed_cover_offset_and_span_only():
    base = torch.zeros(100, dtype=torch.float16)
    assert storage_bytes_needed(base[10:20]) == 20 * 2
    assert storage_bytes_needed(base[:0]) == 0
    assert storage_bytes_needed(torch.zeros(3, 4).t()) == 12 * 4


def test_file_holds_args_kwargs_and_leaves_big_tensors_as_specs(tmp_path):
    budget = SampleBudget(card_bytes=1000, session_bytes=10_000)
    small, big = torch.randn(4, 4), torch.randn(1000)
    path = tmp_path / "card" / "0.pt"
    save_sample(path, "card", (small, [small, 2], torch.bfloat16),
                {"weight": big, "memory_format": torch.channels_last}, budget)
    saved = torch.load(path, weights_only=True)
    assert torch.equal(saved["args"][0], small) and torch.equal(saved["args"][1][0], small)
    assert saved["args"][1][1] == 2 and saved["args"][2] is torch.bfloat16
    assert saved["kwargs"]["weight"] == {"t": "tensor", "shape": [1000], "stride": [1],
                                         "dtype": "float32", "offset": 0}
    assert saved["kwargs"]["memory_format"] == {"t": "memory_format", "v": "channels_last"}
    assert budget.tensors_left_out == 1 and budget.used == 2 * 64


def test_budget_caps_per_card_and_per_session():
    budget = SampleBudget(card_bytes=100, session_bytes=150)
    assert budget.take("a", 60) and not budget.take("a", 60)  # card a is full
    assert budget.take("b", 80) is True
    assert not budget.take("c", 20)  # the session is full (60 + 80 + 20 > 150)
    assert budget.used == 140 and budget.tensors_left_out == 2


def test_spread_picks_evenly_with_first_and_last():
    assert spread(10, 3) == {0, 5, 9}
    assert spread(2, 5) == {0, 1}
    assert spread(7, 1) == {0}
    assert spread(5, 0) == set()
