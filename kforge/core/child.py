"""How kforge starts a Python process of its own (an engine, a GPU worker, a tool's child under
compute-sanitizer): the command and its environment. Torch-free, so the TUI can use it.

The folder a child starts in may be the one a shared database lies in, with any ``.py`` file
beside it: it is never on the child's ``sys.path``. ``-P`` keeps Python from putting it there for
``-m``, and the environment's ``PYTHONPATH`` loses its empty entries, which name it too.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from pathlib import Path

_ROOT = str(Path(__file__).resolve().parents[2])  # the folder this kforge is imported from


def python_command(module: str, *args: str) -> list[str]:
    """``python -P -m module args...``: run it with ``child_env``."""
    return [sys.executable, "-P", "-m", module, *args]


def child_env(base: Mapping[str, str] | None = None, **changes: str) -> dict[str, str]:
    """``base`` (this process's environment) with the folder this kforge is imported from first
    on ``PYTHONPATH``, no empty entry there, output unbuffered, and ``changes``."""
    env = dict(os.environ if base is None else base)
    rest = [part for part in env.get("PYTHONPATH", "").split(os.pathsep) if part]
    env["PYTHONPATH"] = os.pathsep.join([_ROOT, *(part for part in rest if part != _ROOT)])
    return {**env, "PYTHONUNBUFFERED": "1", **changes}
