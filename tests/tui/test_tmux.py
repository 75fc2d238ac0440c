"""A user's session in a real 80x24 terminal (tmux), end to end and without a GPU: start
kforge-tui on no database, start a search through the new-session form with its defaults (the
config names the test doubles as proposer and evaluator), watch the tree grow, prune a node, lose
the terminal, attach again, kill -9 the engine, resume it, quit. Every wait polls the screen for
its text, with a deadline."""

from __future__ import annotations

import asyncio
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest

from kforge.core.candidate import Baseline
from kforge.core.opcard import OpCard
from kforge.store import Store
from kforge.store.commands import is_alive
from kforge.store.records import Session
from tests.doubles import FakeEvaluator

pytestmark = pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed")
REPO = Path(__file__).resolve().parents[2]
MODEL = "tests/capture/capture_toy.py:build"  # profiles on the CPU in a second or two
CONFIG = f"""
[search]
proposer = "tests.doubles:make_proposer"
evaluator = "{__name__}:slow_evaluator"
iterations_per_op = 1000
patience = 1000
top_ops = 1  # the op the tree opens on
"""


class SteadyEvaluator(FakeEvaluator):
    """The evaluator double, slowed and with no physical floor known, so that the search
    outlasts the test."""

    async def baseline(self, card: OpCard) -> Baseline:
        return replace(await super().baseline(card), floor_us=None)


def slow_evaluator(ctx) -> FakeEvaluator:
    return SteadyEvaluator(delay_s=0.2)


def tmux(*args: str) -> str:
    return subprocess.run(["tmux", *args], capture_output=True, text=True, check=False).stdout


class Terminal:
    """kforge-tui in a detached 80x24 tmux session."""

    def __init__(self, name: str, env: dict[str, str], *args: str) -> None:
        self.name = name
        command = " ".join([*(f"{k}={shlex.quote(v)}" for k, v in env.items()),
                            shlex.quote(sys.executable), "-m", "kforge_tui", "--no-mouse",
                            *map(shlex.quote, args)])
        tmux("new-session", "-d", "-s", name, "-x", "80", "-y", "24", "-c", str(REPO), command)

    def keys(self, *keys: str) -> None:
        tmux("send-keys", "-t", self.name, *keys)

    def type(self, text: str) -> None:
        tmux("send-keys", "-t", self.name, "-l", text)

    def screen(self) -> str:
        return tmux("capture-pane", "-p", "-t", self.name)

    def wait_for(self, text: str, timeout_s: float = 30.0) -> str:
        return self.wait_until(lambda screen: text in screen, repr(text), timeout_s)

    def wait_until(self, shows: Callable[[str], object], what: str,
                   timeout_s: float = 30.0) -> str:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            screen = self.screen()
            if shows(screen):
                return screen
            time.sleep(0.1)
        raise AssertionError(f"{what} never showed; the screen was:\n{screen}")

    @property
    def running(self) -> bool:
        found = subprocess.run(["tmux", "has-session", "-t", self.name], capture_output=True,
                               check=False)
        return found.returncode == 0

    def close(self) -> None:
        """Kill the terminal, as a dropped SSH connection does."""
        if self.running:
            tmux("kill-session", "-t", self.name)


def engine_live(screen: str) -> bool:
    """Whether the top bar says an engine runs (in full, or in short on a narrow terminal)."""
    top = screen.splitlines()[0] if screen else ""
    return "(engine live)" in top or "running ●" in top


def tree_size(screen: str) -> int:
    """The node count the search tree's root line shows (0 before it shows)."""
    found = re.search(r"eager\s+\((\d+) nodes?\)", screen)
    return int(found.group(1)) if found else 0


async def session_of(db: Path) -> Session:
    async with await Store.open(db, create=False) as store:
        return await store.get_session(1)


def engine_of(db: Path) -> int | None:
    session = asyncio.run(session_of(db))
    return session.engine_pid if is_alive(session) else None


def stored_nodes(db: Path) -> int:
    async def count() -> int:
        async with await Store.open(db, create=False) as store:
            return len(await store.list_nodes(1))

    return asyncio.run(count())


def until(condition: Callable[[], object], what: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


def test_search_from_the_form_survives_the_terminal_and_a_killed_engine(tmp_path: Path):
    db = tmp_path / "k.db"
    (tmp_path / "config.toml").write_text(CONFIG)
    env = {"PYTHONPATH": str(REPO), "KFORGE_CONFIG": str(tmp_path / "config.toml"),
           "KFORGE_CACHE_DIR": str(tmp_path / "cache")}
    name = f"kforge-tui-test-{os.getpid()}"
    terminals: list[Terminal] = []
    try:
        tui = Terminal(name, env, "--db", str(db))
        terminals.append(tui)
        tui.wait_for("No database at")
        tui.keys("n")
        tui.wait_for("New session")
        tui.type(MODEL)
        tui.keys("Enter")  # every other field at its default
        tui.wait_for("1 ops", timeout_s=40)

        tui.keys("2")
        first = tree_size(tui.wait_until(tree_size, "search tree nodes"))
        tui.wait_until(lambda screen: tree_size(screen) > first, "the tree growing")

        tui.keys("g", "j", "x")
        pruned = re.search(r"✂ #(\d+)", tui.wait_for("✂ #"))
        assert pruned is not None

        tui.close()  # the terminal is gone; the search is not
        engine = engine_of(db)
        assert engine is not None
        seen = stored_nodes(db)
        until(lambda: stored_nodes(db) > seen, "the engine to go on without a terminal")

        tui = Terminal(name, env, "--db", str(db), "--session", "1")
        terminals.append(tui)
        tui.wait_until(engine_live, "a live engine")
        tui.keys("2", "g")  # the top of the tree: its first node is the pruned one
        tui.wait_for(f"✂ #{pruned.group(1)}")

        os.kill(engine, signal.SIGKILL)
        tui.wait_for("engine stopped — r to resume")  # the top bar
        tui.wait_until(lambda screen: screen.count("engine stopped") == 2, "the notice")

        tui.keys("r")
        tui.wait_until(engine_live, "the resumed engine", timeout_s=45)
        resumed = engine_of(db)
        assert resumed is not None and resumed != engine

        tui.keys("q")
        until(lambda: not tui.running, "kforge-tui to quit on q", timeout_s=10)
    finally:
        for terminal in terminals:
            terminal.close()
        if db.exists() and (pid := engine_of(db)) is not None:
            os.kill(pid, signal.SIGKILL)
