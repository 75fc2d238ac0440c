"""How kforge starts another kforge process (a detached engine, the TUI's searches): the command
and its environment (``kforge.core.child``). Torch-free, so the TUI can use it."""

from __future__ import annotations

from kforge.core.child import child_env, python_command


def kforge_command() -> list[str]:
    """``python -P -m kforge`` for a child process, without the current folder on its
    ``sys.path``: a ``.py`` file lying next to a shared database is never imported as a module.
    Run it with ``kforge_env``, which finds kforge where this process found it."""
    return python_command("kforge")


def kforge_env() -> dict[str, str]:
    """The environment of a ``kforge_command`` child (``kforge.core.child.child_env``)."""
    return child_env()
