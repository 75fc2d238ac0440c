"""Shared pieces of the TUI tests: a fixture database, an app bound to it, and a wait helper."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest
from rich.color import ColorSystem

from kforge_tui.app import KforgeApp
from kforge_tui.launch import GpuCheck
from tests.tui.fixtures import NOW, build

# What the terminal says of itself, as over SSH (no COLORTERM) unless it says truecolor.
TERMINALS = {
    "truecolor": ({"TERM": "xterm-256color", "COLORTERM": "truecolor"}, ColorSystem.TRUECOLOR),
    "256": ({"TERM": "xterm-256color"}, ColorSystem.EIGHT_BIT),
    "16": ({"TERM": "xterm"}, ColorSystem.STANDARD),
}

FAKE_GPU = GpuCheck("Fake GPU", "1 GPU(s)")
NO_GPU = GpuCheck(None, "nvidia-smi not found")


def make_app(db: Path, **options) -> KforgeApp:
    """An app with a fixed clock, a known GPU answer and a fast poll; it never saves the theme."""
    defaults = {"gpu": FAKE_GPU, "clock": lambda: NOW, "poll_s": 0.05, "remember_theme": False}
    return KforgeApp(db, **{**defaults, **options})


@pytest.fixture(autouse=True)
def truecolour_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    """The app fits its theme to the terminal's colours: every test sees a terminal of 16 million
    colours, whatever runs the tests, unless it sets another."""
    monkeypatch.setenv("COLORTERM", "truecolor")


@pytest.fixture
async def fixture_db(tmp_path: Path) -> tuple[Path, dict[str, int]]:
    db = tmp_path / "k.db"
    return db, await build(db)


async def until(pilot, condition: Callable[[], bool], timeout_s: float = 30.0,
                what: str = "condition") -> None:
    """Let the app run until ``condition()`` holds: a bound on a broken app, not a speed test
    (a loaded 2-core machine has taken over 10 s for a screen to open)."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await pilot.pause(0.02)


@pytest.fixture
def terminal(request, monkeypatch: pytest.MonkeyPatch) -> ColorSystem:
    """The environment of a terminal of the parametrized depth; the app reads it at start."""
    environ, depth = TERMINALS[request.param]
    monkeypatch.delenv("COLORTERM", raising=False)
    for name, value in environ.items():
        monkeypatch.setenv(name, value)
    return depth
