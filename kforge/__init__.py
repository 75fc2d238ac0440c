"""kforge: search, verify and integrate custom CUDA kernels for the operators a PyTorch model runs.

Importing the package is cheap and needs no GPU: torch, CUDA and NVRTC are imported only by the
modules that use them.
"""

__version__ = "0.1.0"


def __getattr__(name: str):
    """``kforge.patch(session_id)``, imported on first use (it brings in torch)."""
    if name == "patch":
        from kforge.integrate.patching import patch

        return patch
    raise AttributeError(f"module 'kforge' has no attribute {name!r}")
