"""Decide where an op's eager time goes: a vendor library, a native PyTorch kernel, or no real work.

Pure functions over op names and CUDA kernel names, so the rules are easy to test and to extend.
"""

from __future__ import annotations

from collections.abc import Mapping

from kforge.core.opcard import NATIVE, VIEW_OR_COPY
from kforge.core.region import REGION_VIEW_OPS, may_join

# Ops that only copy data or allocate/alter metadata; pure views are found from the schema instead
# (an op whose first result aliases an input without writing it).
COPY_OR_METADATA_OPS = frozenset({
    "copy_", "_to_copy", "clone", "_copy_from", "_copy_from_and_resize", "lift_fresh",
    "lift_fresh_copy", "_local_scalar_dense", "empty", "empty_strided", "empty_like", "new_empty",
    "new_empty_strided", "resize_", "set_", "_reshape_alias", "_unsafe_view", "detach_",
})
# Matrix-multiply ops whose gemm kernels come from cuBLAS/cuBLASLt (even those named cutlass_*).
BLAS_OPS = frozenset({
    "mm", "addmm", "bmm", "baddbmm", "addbmm", "mv", "addmv", "dot", "vdot", "matmul", "linear",
    "_scaled_mm", "_int_mm", "_addmm_activation",
})
CONV_OPS = frozenset({
    "convolution", "_convolution", "cudnn_convolution", "cudnn_convolution_transpose",
    "cudnn_convolution_relu", "cudnn_convolution_add_relu", "conv2d", "conv1d", "conv3d",
})
_CUDNN_MARKS = ("cudnn", "implicit_gemm", "implicit_precomp", "fprop", "winograd", "convolve")
_FLASH_MARKS = ("flash", "fmha")
_GEMM_MARKS = ("gemm", "gemv", "nvjet", "xmma", "cublas", "cutlass", "tensorop", "s16816", "s1688")


def base_name(op: str) -> str:
    """``aten._softmax.default`` -> ``_softmax``."""
    parts = op.split(".")
    return parts[1] if len(parts) >= 2 and parts[0] == "aten" else parts[0]


def is_view_or_copy(op: str, aliases_input: bool, is_view_copy_variant: bool = False,
                    returns_tensor: bool = True) -> bool:
    """True for views, aliasing, metadata-only and plain copy ops: listed, never targets.

    ``aliases_input`` is the schema fact (``OpOverload.is_view``); ``is_view_copy_variant`` marks
    the generated ``*_copy`` forms of views (``torch.Tag.view_copy``); an op that returns no tensor
    (``_fused_sdp_choice`` picks a kernel, ``equal`` answers a question) has no output to speed up.
    """
    return (aliases_input or is_view_copy_variant or not returns_tensor
            or base_name(op) in COPY_OR_METADATA_OPS)


def kernel_library(op: str, kernel: str) -> str:
    """The library one CUDA kernel launched by ``op`` belongs to."""
    name = kernel.lower()
    short = base_name(op)
    if any(mark in name for mark in _CUDNN_MARKS):
        return "cudnn"
    if any(mark in name for mark in _FLASH_MARKS):
        return "flash"
    if "nccl" in name:
        return "nccl"
    if any(mark in name for mark in _GEMM_MARKS):
        if short in CONV_OPS:
            return "cudnn"  # cuDNN runs some convolutions (1x1) as plain gemm kernels
        if "cutlass" in name and short not in BLAS_OPS:
            return "cutlass"  # PyTorch's own CUTLASS kernels, e.g. _grouped_mm
        return "cublas"
    return NATIVE


def op_library(op: str, view_or_copy: bool, kernel_us: Mapping[str, float]) -> str:
    """The card's library: where most of its kernel time went (native when no kernel was seen)."""
    if view_or_copy:
        return VIEW_OR_COPY
    by_library: dict[str, float] = {}
    for kernel, us in kernel_us.items():
        library = kernel_library(op, kernel)
        by_library[library] = by_library.get(library, 0.0) + us
    if not by_library:
        return NATIVE
    return max(sorted(by_library), key=lambda lib: by_library[lib])


def is_fusible(op: str, *, pointwise: bool, aliases_input: bool, mutates: bool,
               returns_tensor: bool, reads_tensors: bool) -> bool:
    """Whether a call may join a fusion region: one that ``kforge.core.region.may_join`` lets
    into a region (a functional aten op that reads tensors and returns them: pointwise, one of
    its ``REGION_OPS``, or a view) and runs no vendor library's kernel."""
    short = base_name(op)
    if short in BLAS_OPS or short in CONV_OPS:
        return False
    return may_join(op, pointwise=pointwise, aliases_input=aliases_input, mutates=mutates,
                    returns_tensor=returns_tensor, reads_tensors=reads_tensors)


def is_region_view(op: str, aliases_input: bool) -> bool:
    """A call in a region that only reshapes or aliases: it does not count as work."""
    return aliases_input or base_name(op) in REGION_VIEW_OPS
