"""Plain torch functions standing in for kernels, called like the aten op they implement:
honest ones in several reduction orders, and ones with a known numerical flaw."""

from __future__ import annotations

import torch


def sequential_sum(x: torch.Tensor) -> torch.Tensor:
    """Row sums accumulated one column at a time (one thread per row)."""
    total = torch.zeros(x.shape[0], 1, dtype=x.dtype)
    for j in range(x.shape[1]):
        total = total + x[:, j:j + 1]
    return total


def strided_tree_sum(x: torch.Tensor, threads: int = 256) -> torch.Tensor:
    """Row sums as a GPU block computes them: strided partial sums, then a tree."""
    padded = torch.nn.functional.pad(x, (0, (-x.shape[1]) % threads))
    partial = padded.reshape(x.shape[0], -1, threads).sum(1)
    while partial.shape[1] > 1:
        partial = partial[:, ::2] + partial[:, 1::2]
    return partial


# ----- aten._softmax.default(x, dim, half_to_float) over the last dim of a 2-D input -----


def softmax_fp32_accumulation(x, dim, half_to_float, total=strided_tree_sum):
    xf = x.float()
    e = torch.exp(xf - xf.amax(-1, keepdim=True))
    return (e / total(e)).to(x.dtype)


def softmax_bf16_operand(x, dim, half_to_float):
    return softmax_fp32_accumulation(x.bfloat16().float(), dim, half_to_float)


def softmax_rounded_intermediates(x, dim, half_to_float):
    e = torch.exp(x - x.amax(-1, keepdim=True))  # every step rounded to x's dtype
    return e / e.sum(-1, keepdim=True)


def softmax_without_max_subtraction(x, dim, half_to_float):
    e = torch.exp(x.float())
    return (e / e.sum(-1, keepdim=True)).to(x.dtype)


# ----- aten.native_layer_norm.default(x, [cols], w, b, eps), output only, 2-D input -----


def layer_norm_two_pass(x, shape, w, b, eps, total=strided_tree_sum):
    xf, inverse_n = x.float(), 1.0 / x.shape[-1]
    d = xf - total(xf) * inverse_n
    return (d * torch.rsqrt(total(d * d) * inverse_n + eps) * w.float() + b.float()).to(x.dtype)


def layer_norm_welford(x, shape, w, b, eps):
    xf = x.float()
    mean = torch.zeros(x.shape[0], 1)
    m2 = torch.zeros(x.shape[0], 1)
    for j in range(x.shape[1]):
        v = xf[:, j:j + 1]
        delta = v - mean
        mean = mean + delta / (j + 1)
        m2 = m2 + delta * (v - mean)
    return ((xf - mean) * torch.rsqrt(m2 / x.shape[1] + eps) * w.float() + b.float()).to(x.dtype)


def layer_norm_one_pass_variance(x, shape, w, b, eps):
    xf = x.float()
    mean = xf.mean(-1, keepdim=True)
    variance = (xf * xf).mean(-1, keepdim=True) - mean * mean  # cancels under a large mean
    return ((xf - mean) * torch.rsqrt(variance + eps) * w.float() + b.float()).to(x.dtype)


def layer_norm_without_eps(x, shape, w, b, eps):
    xf = x.float()
    d = xf - xf.mean(-1, keepdim=True)
    return (d * torch.rsqrt((d * d).mean(-1, keepdim=True)) * w.float() + b.float()).to(x.dtype)


# ----- elementwise -----


def relu(x):
    return torch.where((x > 0) | x.isnan(), x, torch.zeros_like(x))


def add(x, y, alpha=1):
    return (x.float() + alpha * y.float()).to(x.dtype)
