"""Which library an op's eager time goes to, and which ops are views or copies."""

from __future__ import annotations

import pytest
import torch

from kforge.capture.classify import is_view_or_copy, kernel_library, op_library
from kforge.core.opcard import NATIVE, VIEW_OR_COPY

aten = torch.ops.aten


@pytest.mark.parametrize(("op", "kernel", "library"), [
    ("aten.mm.default", "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64", "cublas"),
    ("aten.addmm.default", "nvjet_tst_128x256_64x4_2x1_v_bz_coopA_TNT", "cublas"),
    ("aten.bmm.default", "cutlass_80_wmma_tensorop_bf16_s161616gemm_bf16_16x16_128x2_tn", "cublas"),
    ("aten.mm.default", "void gemv2T_kernel_val<int, int, float, float, float, 128, 16>", "cublas"),
    ("aten._grouped_mm.default", "void cutlass::device_kernel<enable_3x_kernel_for_sm9x>",
     "cutlass"),
    ("aten.convolution.default", "sm90_xmma_fprop_implicit_gemm_f16f16_f16f32_f32_nhwckrsc",
     "cudnn"),
    ("aten.convolution.default", "sm80_xmma_gemm_f16f16_f16f32_f32_nn_n_tilesize64x64x64",
     "cudnn"),
    ("aten.convolution.default", "void cudnn::ops::nchwToNhwcKernel<__half, __half, float>",
     "cudnn"),
    ("aten._scaled_dot_product_flash_attention.default",
     "void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128>>", "flash"),
    ("aten._scaled_dot_product_efficient_attention.default",
     "fmha_cutlassF_bf16_aligned_64x64_rf_sm80(PyTorchMemEffAttention::AttentionKernel)", "flash"),
    ("aten._softmax.default", "void at::native::(anonymous namespace)::cunn_SoftMaxForward<8>",
     NATIVE),
    ("aten.add.Tensor", "void at::native::vectorized_elementwise_kernel<4, CUDAFunctor_add>",
     NATIVE),
    ("aten.native_group_norm.default", "void at::native::RowwiseMomentsCUDAKernel<float>", NATIVE),
])
def test_kernel_library(op, kernel, library):
    assert kernel_library(op, kernel) == library


def test_card_library_is_where_most_kernel_time_went():
    kernels = {"sm90_xmma_gemm_bf16bf16_cublas": 90.0, "vectorized_elementwise_kernel": 10.0}
    assert op_library("aten.addmm.default", False, kernels) == "cublas"
    assert op_library("aten.addmm.default", False, {}) == NATIVE
    assert op_library("aten.view.default", True, kernels) == VIEW_OR_COPY


@pytest.mark.parametrize("func", [
    aten.view.default, aten.t.default, aten.transpose.int, aten.permute.default,
    aten.expand.default, aten.slice.Tensor, aten.select.int, aten.unsqueeze.default,
    aten._unsafe_view.default, aten.detach.default, aten.alias.default, aten.as_strided.default,
    aten.split.Tensor, aten.copy_.default, aten._to_copy.default, aten.clone.default,
    aten.empty.memory_format, aten.view_copy.default,
])
def test_views_copies_and_metadata_ops_are_not_targets(func):
    assert is_view_or_copy(str(func), func.is_view, torch.Tag.view_copy in func.tags)


def test_ops_returning_no_tensor_are_not_targets():
    assert is_view_or_copy("aten._fused_sdp_choice.default", False, returns_tensor=False)


@pytest.mark.parametrize("func", [
    aten.add.Tensor, aten.add_.Tensor, aten._softmax.default, aten.mm.default,
    aten.native_layer_norm.default, aten.index_copy.default, aten.masked_fill.Scalar,
])
def test_compute_ops_are_targets(func):
    assert not is_view_or_copy(str(func), func.is_view, torch.Tag.view_copy in func.tags)
