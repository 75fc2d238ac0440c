"""A small model for integration tests (plain torch), also a model file for the CLI:
``tests/integrate/toy_model.py:build``. It calls softmax, layer_norm and a tanh GELU, ops the kernel
library has kernels for, through composite functions (F.softmax, F.layer_norm, nn.Linear)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

WIDTH = 64


class Mixer(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.proj = nn.Linear(width, width)
        self.norm = nn.LayerNorm(width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scores = F.softmax(self.proj(x) @ x.transpose(-1, -2), dim=-1)
        return self.norm(F.gelu(scores @ x, approximate="tanh") + x)


class Toy(nn.Module):
    def __init__(self, width: int = WIDTH, depth: int = 2) -> None:
        super().__init__()
        self.blocks = nn.Sequential(*(Mixer(width) for _ in range(depth)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.blocks(x)


def build(batch: int = 2, seq_len: int = 32, width: int = WIDTH):
    torch.manual_seed(0)
    return Toy(width), (torch.randn(batch, seq_len, width),)


def build_wider(batch: int = 2, seq_len: int = 32):
    """The same model, wider and longer: none of build()'s op variants."""
    return build(batch, seq_len + 16, width=WIDTH + 32)
