"""Capture: profile a real model into op cards, with sample inputs, and the built-in model zoo.

``load_model(spec, options)`` builds a built-in model or imports ``path/to/file.py:factory``;
``profile(loaded, samples_per_card=..., staging_dir=...)`` turns it into ranked op cards. The names
below are imported on first use, so ``import kforge.capture.zoo`` (for ``--list``) stays cheap.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "ModelOptions": "kforge.capture.loader",
    "LoadedModel": "kforge.capture.loader",
    "load_model": "kforge.capture.loader",
    "Profile": "kforge.capture.profiler",
    "profile": "kforge.capture.profiler",
    "encode_call": "kforge.core.argspec",
}
__all__ = [*_EXPORTS, "zoo"]


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    if name == "zoo":
        return importlib.import_module("kforge.capture.zoo")
    raise AttributeError(f"module 'kforge.capture' has no attribute {name!r}")
