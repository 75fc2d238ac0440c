"""Profiling on a CUDA GPU: kernel time joined to op cards, and the library each op runs."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from kforge.capture.loader import LoadedModel
from kforge.capture.profiler import profile

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


class Mixed(nn.Module):
    """One op from each library: cuDNN conv, cuBLAS linear, flash attention, native softmax."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(64, 64, 3, padding=1)
        self.proj = nn.Linear(1024, 1024)

    def forward(self, image: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        features = self.conv(image).flatten(1)
        hidden = self.proj(tokens)
        q = hidden.view(4, 512, 8, 128).transpose(1, 2)
        attended = nn.functional.scaled_dot_product_attention(q, q, q, is_causal=True)
        return torch.softmax(attended.sum(), dim=0) + features.mean()


@pytest.fixture(scope="module")
def gpu_profile(tmp_path_factory):
    device = torch.device("cuda")
    model = Mixed().to(device, torch.bfloat16).eval()
    args = (torch.randn(8, 64, 56, 56, device=device, dtype=torch.bfloat16),
            torch.randn(4, 512, 1024, device=device, dtype=torch.bfloat16))
    loaded = LoadedModel("mixed", model, args, {}, torch.bfloat16, device)
    staging = tmp_path_factory.mktemp("staging")
    return profile(loaded, samples_per_card=1, staging_dir=staging), staging


def library_of(result, fragment: str) -> str:
    return next(c.library for c in result.cards if fragment in c.op)


def test_kernel_time_is_joined_to_cards(gpu_profile):
    result, _ = gpu_profile
    assert result.timing == "cuda" and result.total_us > 0
    # Op cards split the time; a region card's share is its member ops' share counted again.
    assert sum(c.share for c in result.cards if c.region is None) == pytest.approx(1.0)
    big = [c for c in result.cards if c.target and c.share > 0.05]
    assert big and all(c.eager_us > 0 for c in big)


def test_libraries_are_told_apart(gpu_profile):
    result, _ = gpu_profile
    assert library_of(result, "convolution") == "cudnn"
    assert library_of(result, "mm") == "cublas"
    assert library_of(result, "_scaled_dot_product") in ("flash", "cudnn")
    assert library_of(result, "_softmax") == "native"


def test_gpu_samples_are_saved_as_cpu_tensors(gpu_profile):
    result, staging = gpu_profile
    conv = next(c for c in result.cards if "convolution" in c.op)
    sample = torch.load(staging / conv.key / "0.pt", weights_only=True)
    assert sample["args"][0].device.type == "cpu"
    assert list(sample["args"][0].shape) == conv.args[0]["shape"]
