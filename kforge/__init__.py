"""kforge: search, verify and integrate custom CUDA kernels for the operators a PyTorch model runs.

Importing the package is cheap and needs no GPU: torch, CUDA and NVRTC are imported only by the
modules that use them.
"""

__version__ = "0.1.0"
