"""Integration: put a session's winning kernels into its model behind an exact-variant guard,
export them as a standalone package, and measure the whole model eager, patched and compiled.

``patch(session_id)`` (also ``kforge.patch``) is the Python API; ``kforge apply``, ``kforge export``
and ``kforge e2e`` the commands. Names are imported on first use, so importing this package is
cheap.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "patch": "kforge.integrate.patching",
    "SessionPatch": "kforge.integrate.patching",
    "export_session": "kforge.integrate.export",
    "read_plan": "kforge.integrate.plan",
    "run_e2e": "kforge.integrate.measure",
}
__all__ = list(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'kforge.integrate' has no attribute {name!r}")
