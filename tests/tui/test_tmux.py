"""Smoke test in a real terminal: start kforge-tui in a detached tmux session, open a session,
prune a node with the keyboard, quit, and check the store changed."""

from __future__ import annotations

import asyncio
import os
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kforge.store import Store
from tests.tui.fixtures import build_sync

pytestmark = pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed")
REPO = Path(__file__).resolve().parents[2]


def tmux(*args: str) -> str:
    return subprocess.run(["tmux", *args], capture_output=True, text=True, check=False).stdout


def wait_for(name: str, text: str, timeout_s: float = 20.0) -> str:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        screen = tmux("capture-pane", "-p", "-t", name)
        if text in screen:
            return screen
        time.sleep(0.1)
    raise AssertionError(f"{text!r} never appeared; the screen was:\n{screen}")


def running(name: str) -> bool:
    done = subprocess.run(["tmux", "has-session", "-t", name], capture_output=True, check=False)
    return done.returncode == 0


def test_start_navigate_prune_quit_in_tmux(tmp_path: Path):
    db = tmp_path / "k.db"
    ids = build_sync(db)
    name = f"kforge-tui-test-{os.getpid()}"
    env = {"PYTHONPATH": str(REPO), "KFORGE_CONFIG": str(tmp_path / "config.toml")}
    command = " ".join([*(f"{k}={shlex.quote(v)}" for k, v in env.items()),
                        shlex.quote(sys.executable), "-m", "kforge_tui", "--db",
                        shlex.quote(str(db)), "--no-mouse"])
    tmux("new-session", "-d", "-s", name, "-x", "80", "-y", "24", "-c", str(REPO), command)
    try:
        wait_for(name, "resnet50-tiny")
        tmux("send-keys", "-t", name, "Enter")
        wait_for(name, "1 ops")
        tmux("send-keys", "-t", name, "2")
        wait_for(name, "2 search tree")
        wait_for(name, f"#{ids['a']} new")  # the tree is filled: keys now reach its rows
        tmux("send-keys", "-t", name, "g", "j", "x")
        screen = wait_for(name, f"✂ #{ids['a']} new")
        assert "1.25x" in screen
        tmux("send-keys", "-t", name, "q")
        deadline = time.monotonic() + 10
        while running(name) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not running(name), "kforge-tui did not quit on q"
    finally:
        if running(name):
            tmux("kill-session", "-t", name)
    assert asyncio.run(is_pruned(db, ids["a"]))


async def is_pruned(db: Path, node_id: int) -> bool:
    async with await Store.open(db, create=False) as store:
        return (await store.get_nodes([node_id]))[0].pruned
