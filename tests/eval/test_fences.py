"""Fences around a call's outputs and scratch: buffers keep their layout and alignment, and a
write past either end of one is named."""

from __future__ import annotations

import pytest
import torch

from kforge.eval.verify.fences import FENCE_BYTES, FencedAllocation, Fences


@pytest.mark.parametrize("shift", [0, 256, 16, 2])
def test_a_fenced_buffer_has_the_asked_layout_and_placement(shift):
    fences = Fences(shift)
    t = fences.empty((4, 6), (1, 4), dtype=torch.float16, device=torch.device("cpu"))
    assert t.shape == (4, 6) and t.stride() == (1, 4) and t.dtype == torch.float16
    assert t.data_ptr() % 512 == shift
    assert t.storage_offset() * t.element_size() >= FENCE_BYTES
    assert t.untyped_storage().nbytes() - (t.storage_offset() + 24) * 2 >= FENCE_BYTES
    assert fences.broken() == []


def test_scratch_keeps_sixteen_byte_alignment_whatever_the_shift():
    scratch = Fences(4).empty((64,), (1,), dtype=torch.uint8, device=torch.device("cpu"))
    assert scratch.data_ptr() % 512 == 0


def test_writes_past_either_end_are_named_and_writes_inside_are_not():
    fences = Fences()
    cpu = torch.device("cpu")
    out = fences.empty((8,), (1,), dtype=torch.float32, device=cpu)
    scratch = fences.empty((16,), (1,), dtype=torch.uint8, device=cpu)
    memory = FencedAllocation([out], [scratch], fences, ["result 0", "scratch 'partial'"])
    out.fill_(1.0)
    scratch.zero_()
    assert memory.overruns() == []
    out.as_strided((9,), (1,)).fill_(2.0)  # one element past the end
    assert memory.overruns() == ["result 0"]
    scratch.as_strided((1,), (1,), scratch.storage_offset() - 1).fill_(7)  # one byte before
    assert memory.overruns() == ["result 0", "scratch 'partial'"]


def test_an_empty_buffer_is_fenced_too():
    fences = Fences()
    t = fences.empty((0, 3), (3, 1), dtype=torch.float32, device=torch.device("cpu"))
    assert t.numel() == 0 and fences.broken() == []


def test_a_copy_keeps_the_fence_bytes_alone_as_they_were():
    fences = Fences(16)
    out = fences.empty((1000,), (1,), dtype=torch.float32, device=torch.device("cpu"))
    out.as_strided((1001,), (1,)).fill_(2.0)  # one element past the end
    copied = fences.copy()
    assert all(f.raw.numel() == fences.fences[0].raw.numel() - 4000 for f in copied.fences)
    fences.fences[0].raw[:].fill_(0xA5)  # repaired since: the copy still says what it saw
    assert fences.broken() == [] and copied.broken() == [0]
