"""The sanitizer's reports are read per kernel: only the candidate's own kernels count."""

from __future__ import annotations

from kforge.eval.sanitize import kernel_reports

MEMCHECK = """\
========= COMPUTE-SANITIZER
========= Invalid __global__ read of size 4 bytes
=========     at relu_f32+0x90
=========     by thread (255,0,0) in block (3,0,0)
=========     Address 0x7f0000001000 is out of bounds
=========
========= Invalid __global__ write of size 4 bytes
=========     at void at::native::vectorized_elementwise_kernel<4>(int)+0x1c0
=========
========= ERROR SUMMARY: 2 errors
"""

RACECHECK = """\
========= COMPUTE-SANITIZER
========= Error: Race reported between Write access at softmax_f32+0x2a0
=========     and Read access at softmax_f32+0x310 [1024 hazards]
=========
========= RACECHECK SUMMARY: 1 hazard displayed (1 error, 0 warnings)
"""


def test_reports_about_the_candidates_kernels_count_and_others_do_not():
    found = kernel_reports(MEMCHECK, {"relu_f32"})
    assert len(found) == 1 and "Invalid __global__ read" in found[0]
    assert kernel_reports(MEMCHECK, {"other"}) == []


def test_a_race_in_a_candidate_kernel_is_reported():
    found = kernel_reports(RACECHECK, {"softmax_f32"})
    assert len(found) == 1 and "Race reported" in found[0]


def test_a_clean_run_reports_nothing():
    assert kernel_reports("========= COMPUTE-SANITIZER\n========= ERROR SUMMARY: 0 errors\n",
                          {"relu_f32"}) == []


INITCHECK_MEMCPY = """\
========= COMPUTE-SANITIZER
========= Uninitialized access to 0x7f8a93809a00 on access by cudaMemcpy source
=========     Saved host backtrace up to driver entry point at error
=========         Host Frame: [0x1234] in libcuda.so.1
=========
========= ERROR SUMMARY: 1 error
"""


def test_a_report_that_names_no_candidate_kernel_is_not_the_candidates():
    assert kernel_reports(INITCHECK_MEMCPY, {"relu_f32", "relu_f32_scalar"}) == []


def test_a_tensor_placed_at_the_end_of_its_allocation_keeps_layout_and_values():
    import torch

    from kforge.eval.sanitize import ALLOCATION_GRAIN, at_the_end

    like = torch.randn(7, 5).t()  # strides (1, 5)
    placed = at_the_end(like, like)
    assert placed.shape == like.shape and placed.stride() == like.stride()
    assert torch.equal(placed, like)
    storage = placed.untyped_storage().nbytes()
    assert storage % ALLOCATION_GRAIN == 0
    span = 1 + 4 * 1 + 6 * 5  # shape (5, 7), strides (1, 5)
    assert (placed.storage_offset() + span) * placed.element_size() == storage
