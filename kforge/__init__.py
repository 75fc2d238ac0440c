"""kforge: search, verify and integrate custom CUDA kernels for the operators a PyTorch model runs.

    with kforge.patch(session, model=model, example_inputs=(x,)):   # the session's kernels
        model(x)
    compiled = kforge.compile(model, session)                        # torch.compile + kernels
    compiled = torch.compile(model, backend=kforge.backend(session)) # the same, as a backend
    graphed = kforge.accelerate(model, (x,), session)                # a CUDA graph + kernels

Importing the package is cheap and needs no GPU: torch, CUDA and NVRTC are imported only by the
modules that use them.
"""

__version__ = "0.1.0"
__all__ = ["accelerate", "backend", "compile", "patch", "__version__"]

_API = {name: "kforge.integrate.api" for name in ("patch", "backend", "compile", "accelerate")}


def __dir__() -> list[str]:
    return sorted({*globals(), *_API})


def __getattr__(name: str):
    """``kforge.patch``, ``kforge.backend``, ``kforge.compile`` and ``kforge.accelerate``,
    imported on first use (they bring in torch)."""
    if name in _API:
        import importlib

        return getattr(importlib.import_module(_API[name]), name)
    raise AttributeError(f"module 'kforge' has no attribute {name!r}")
