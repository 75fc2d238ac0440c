"""Models whose tensors or control flow are out of the ordinary, for the profile's tests: a sparse
input, a nested input, a quantized input, ``torch.cond``, a forward that only fails under a
dispatch mode, a TorchScript submodule, branches on a thread pool, a new length every forward,
and random numbers."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import torch
from torch import nn
from torch.utils._python_dispatch import _get_current_dispatch_mode


class SparseMatmul(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(16, 8))

    def forward(self, a: torch.Tensor) -> torch.Tensor:
        return torch.sparse.mm(a, self.weight).relu()


def sparse_model():
    indices = torch.tensor([[0, 1, 3], [2, 0, 15]])
    return SparseMatmul(), (torch.sparse_coo_tensor(indices, torch.randn(3), (4, 16)),)


class Padded(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x * 2 + 1).to_padded_tensor(0.0).relu()


def nested_model():
    return Padded(), (torch.nested.nested_tensor([torch.randn(3, 4), torch.randn(5, 4)]),)


class Dequantized(nn.Module):
    def forward(self, q: torch.Tensor) -> torch.Tensor:
        return q.dequantize().relu()


def quantized_model():
    return Dequantized(), (torch.quantize_per_tensor(torch.randn(4, 8), 0.1, 0, torch.quint8),)


class Branches(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cond(x.sum() > 0, lambda t: t.sin(), lambda t: t.cos(), (x,)) * 2


def cond_model():
    return Branches(), (torch.randn(4, 8),)


class Shy(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if _get_current_dispatch_mode() is not None:
            raise RuntimeError("watched")
        return x.relu()


def shy_model():
    return Shy(), (torch.randn(4, 8),)


class Scripted(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inner = torch.jit.script(nn.Sequential(nn.Linear(8, 8), nn.Tanh()))
        self.out = nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.inner(x))


def scripted_model():
    return Scripted(), (torch.randn(4, 8),)


class Pooled(nn.Module):
    """Two branches on a thread pool beside a layer of its own."""

    def __init__(self) -> None:
        super().__init__()
        self.branches = nn.ModuleList(nn.Sequential(nn.Linear(8, 8), nn.GELU()) for _ in range(2))
        self.own = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with ThreadPoolExecutor(2) as pool:
            futures = [pool.submit(branch, x) for branch in self.branches]
            return self.own(x) + sum(f.result() for f in futures)


def pooled_model():
    return Pooled(), (torch.randn(4, 8),)


class Wandering(nn.Module):
    """Runs a new length on every forward."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        return (x[:, : 2 + self.calls % 5] * 2).relu().sum(1)


def wandering_model():
    return Wandering(), (torch.randn(2, 8, 4),)


class Noisy(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + torch.randn_like(x)


def noisy_model():
    return Noisy(), (torch.randn(4, 8),)
