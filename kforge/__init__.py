"""kforge: search, verify and integrate custom CUDA kernels for the operators a PyTorch model runs.

Importing the package is cheap and needs no GPU: torch, CUDA and NVRTC are imported only by the
modules that use them.
"""

__version__ = "0.1.0"


_API = {name: "kforge.integrate.api" for name in ("patch", "backend", "compile", "accelerate")}


def __getattr__(name: str):
    """``kforge.patch``, ``kforge.backend``, ``kforge.compile`` and ``kforge.accelerate``,
    imported on first use (they bring in torch)."""
    if name in _API:
        import importlib

        return getattr(importlib.import_module(_API[name]), name)
    raise AttributeError(f"module 'kforge' has no attribute {name!r}")
