"""What every integration test shares: whole-model timings on the CPU run on one thread."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(autouse=True)
def one_cpu_thread():
    """The CPU tests that choose kernels by whole-model time compare forwards of a few hundred
    microseconds: with torch's thread pool on a busy machine a forward may wait a whole
    scheduler slice at a barrier (over 100 ms), which is more than any kernel's effect."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
