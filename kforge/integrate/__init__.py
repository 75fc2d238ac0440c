"""Integration: put a session's winning kernels into its model (behind an exact-variant guard,
through a torch.compile backend, or captured in a CUDA graph), choose them by measuring the whole
model, export them as a standalone package, and measure the model in every mode a user may pick.

``patch(session_id)``, ``backend(session_id)``, ``compile(model, session_id)`` and
``accelerate(model, inputs, session_id)`` (also as ``kforge.<name>``) are the Python API;
``kforge apply``, ``kforge export`` and ``kforge e2e`` the commands. Names are imported on first
use, so importing this package is cheap.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "patch": "kforge.integrate.api",
    "SessionPatch": "kforge.integrate.patching",
    "export_session": "kforge.integrate.export",
    "read_plan": "kforge.integrate.plan",
    "run_e2e": "kforge.integrate.measure",
    "run_modes": "kforge.integrate.measure",
    "backend": "kforge.integrate.api",
    "compile": "kforge.integrate.api",
    "accelerate": "kforge.integrate.api",
}
__all__ = list(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'kforge.integrate' has no attribute {name!r}")
