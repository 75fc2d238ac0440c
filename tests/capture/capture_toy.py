"""A small plain-torch model for capture tests (needs nothing but torch), also a model file:
``kforge profile tests/capture/capture_toy.py:build``."""

from __future__ import annotations

import sys

import torch
from torch import nn

WIDTH = 16


class Block(nn.Module):
    """Masked attention-like mixing: a linear layer, a causal mask, a softmax, an in-place scale."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.proj = nn.Linear(width, width)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        scores = self.proj(x) @ x.transpose(-1, -2)
        scores = scores.masked_fill(mask, float("-inf"))
        out = torch.softmax(scores, dim=-1) @ x
        return out.mul_(0.5)


class Toy(nn.Module):
    def __init__(self, width: int = WIDTH, depth: int = 2) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(Block(width) for _ in range(depth))

    def trunk(self, x: torch.Tensor) -> torch.Tensor:
        n = x.shape[-2]
        mask = torch.ones(n, n, dtype=torch.bool, device=x.device).triu(1)
        for block in self.blocks:
            x = x + block(x, mask)
        return x

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(self.trunk(x)[:, 1:])  # a strided view with a storage offset


def build(batch: int = 2, seq_len: int = 8):
    torch.manual_seed(0)
    return Toy(), (torch.randn(batch, seq_len, WIDTH),)


def build_with_kwargs():
    model, (x,) = build()
    return model, (), {"x": x}


def broken():
    raise ValueError("no weights here")


def not_a_model():
    return "model", ()


class Fails(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x @ torch.ones(3, 3)  # shapes do not match


def failing_model():
    return Fails(), (torch.ones(2, 4),)


def no_inputs():
    return Toy()


def exiting_model():
    sys.exit(3)


class Idle(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x  # runs no operator


def idle_model():
    return Idle(), (torch.ones(2, 4),)


class OutOfMemory(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        raise torch.OutOfMemoryError("DefaultCPUAllocator: not enough memory")


def out_of_memory_model():
    return OutOfMemory(), (torch.ones(2, 4),)


class Sleeps(nn.Module):
    """Says it runs (a file named by $KFORGE_TOY_RUNNING), then runs for a minute."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        import os
        import time
        from pathlib import Path

        Path(os.environ["KFORGE_TOY_RUNNING"]).touch()
        time.sleep(60)
        return x * 2


def sleeping_model():
    return Sleeps(), (torch.ones(2, 4),)
