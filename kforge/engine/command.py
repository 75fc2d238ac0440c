"""How kforge starts another kforge process (a detached engine, the TUI's searches): the command
and its environment. Torch-free, so the TUI can use it."""

from __future__ import annotations

import os
import sys
from pathlib import Path


def kforge_command() -> list[str]:
    """``python -m kforge`` for a child process, without the current folder on its ``sys.path``
    (``-P``): a ``.py`` file lying next to a shared database is never imported as a module.
    Run it with ``kforge_env``, which finds kforge where this process found it."""
    return [sys.executable, "-P", "-m", "kforge"]


def kforge_env() -> dict[str, str]:
    """The environment of a ``kforge_command`` child: this one's, with the folder this kforge
    is imported from first on ``PYTHONPATH`` and output unbuffered."""
    root = str(Path(__file__).resolve().parents[2])
    rest = os.environ.get("PYTHONPATH")
    return {**os.environ, "PYTHONPATH": os.pathsep.join([root, rest] if rest else [root]),
            "PYTHONUNBUFFERED": "1"}
