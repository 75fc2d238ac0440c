"""Scrolling a kernel writes only what changed: a move of a few lines is a scroll of the
terminal's own rows and the lines scrolled in, under 2 KB per line moved at 80x24, and what the
terminal then shows is what a full repaint would. A small terminal emulator (cursor moves,
scrolling regions, scrolls, text) replays every byte the app writes."""

from __future__ import annotations

import random
import re
from pathlib import Path

import pytest
from rich.console import Console
from textual.app import App

from kforge.core.candidate import Candidate
from kforge.store import Store
from kforge_tui.widgets.code_view import CodeView
from tests.tui.conftest import make_app, until
from tests.tui.fixtures import KERNEL
from tests.tui.test_render_budget import session_open

CSI = re.compile(r"\x1b\[([?0-9;]*)([A-Za-z])|\x1b[()][0-9A-B]|\x1b[=>78]|([^\x1b]+)")


class Terminal:
    """Enough of a VT terminal to replay Textual's output: cursor moves, line feeds, a
    scrolling region and scrolls, and text (styles are ignored: the characters are compared)."""

    def __init__(self, width: int, height: int) -> None:
        self.width, self.height = width, height
        self.rows = [[" "] * width for _ in range(height)]
        self.x = self.y = 0
        self.top, self.bottom = 0, height - 1

    def feed(self, data: str) -> None:
        for match in CSI.finditer(data):
            params, final, text = match.groups()
            if text is not None:
                self.write(text)
            elif final is not None:
                self.control(params or "", final)

    def write(self, text: str) -> None:
        for char in text:
            if char == "\n":
                self.y = min(self.y + 1, self.height - 1)
            elif char == "\r":
                self.x = 0
            elif self.x < self.width:
                self.rows[self.y][self.x] = char
                self.x += 1

    def control(self, params: str, final: str) -> None:
        numbers = [int(p) for p in params.split(";") if p.isdigit()]
        if final == "H":
            row, col = (numbers + [1, 1])[:2]
            self.y, self.x = row - 1, col - 1
        elif final == "r":
            top, bottom = numbers if len(numbers) == 2 else (1, self.height)
            self.top, self.bottom = top - 1, bottom - 1
            self.x = self.y = 0
        elif final in "ST":
            count = numbers[0] if numbers else 1
            band = self.rows[self.top:self.bottom + 1]
            blank = [[" "] * self.width for _ in range(count)]
            band = band[count:] + blank if final == "S" else blank + band[:-count]
            self.rows[self.top:self.bottom + 1] = band[:self.bottom - self.top + 1]

    def lines(self) -> list[str]:
        return ["".join(row) for row in self.rows]


def replay_output(monkeypatch, size: tuple[int, int]) -> Terminal:
    """Feed every update the app writes (what would go to a 256-colour terminal) to a Terminal."""
    terminal = Terminal(*size)
    console = Console(color_system="256", force_terminal=True, width=size[0])
    written = {"bytes": 0}

    def display(app, screen, renderable) -> None:
        if renderable is not None:
            data = renderable.render_segments(console)
            written["bytes"] += len(data.encode())
            terminal.feed(data)

    monkeypatch.setattr(App, "_display", display)
    terminal.written = written  # type: ignore[attr-defined]
    return terminal


def drawn(app) -> list[str]:
    """The screen as a full repaint draws it."""
    return [strip.text for strip in app.screen._compositor.render_strips()]


async def long_kernel(db: Path) -> None:
    from tests.tui.fixtures import build

    ids = await build(db)
    lines = KERNEL.splitlines()
    source = "\n".join(f"{lines[i % len(lines)]} // line {i}" for i in range(300))
    async with await Store.open(db) as store:
        await store.set_candidate(ids["a1"], Candidate(source, "launch()"), [])


async def kernel_in_view(pilot) -> CodeView:
    screen = await session_open(pilot)
    await pilot.press("3")
    kernel = screen.query_one("#kernel", CodeView)
    await until(pilot, lambda: "line 299" in kernel.text, what="the long kernel")
    await pilot.pause(0.2)
    return kernel


KEYS = ["j", "j", "j", "k", "k", "ctrl+d", "ctrl+u", "g", "G", "down", "up"]


@pytest.mark.parametrize("seed", range(6))
async def test_what_the_terminal_shows_after_scrolling_is_a_full_repaint(tmp_path: Path,
                                                                        monkeypatch, seed):
    db = tmp_path / "k.db"
    await long_kernel(db)
    size = (80, 24)
    terminal = replay_output(monkeypatch, size)
    app = make_app(db, session=1)
    rng = random.Random(seed)
    async with app.run_test(size=size) as pilot:
        await kernel_in_view(pilot)
        for _ in range(8):
            burst = [rng.choice(KEYS) for _ in range(rng.randint(1, 10))]
            await pilot.press(*burst)
            await pilot.pause(0.1)
            assert terminal.lines() == drawn(app), burst


async def test_scrolling_a_kernel_sends_under_2_kb_per_line_at_80x24(tmp_path: Path,
                                                                     monkeypatch):
    db = tmp_path / "k.db"
    await long_kernel(db)
    terminal = replay_output(monkeypatch, (80, 24))
    app = make_app(db, session=1)
    async with app.run_test(size=(80, 24)) as pilot:
        kernel = await kernel_in_view(pilot)
        for key, lines in (("j", 1), ("k", -1), ("ctrl+d", 8), ("ctrl+u", -8)):
            for _ in range(5):
                before, at = terminal.written["bytes"], kernel.scroll_y
                await pilot.press(key)
                await pilot.pause(0.05)
                assert kernel.scroll_y - at == lines
                per_line = (terminal.written["bytes"] - before) / abs(lines)
                assert per_line < 2000, (key, per_line)
        assert terminal.lines() == drawn(app)


async def test_slash_finds_text_in_the_kernel_and_n_and_shift_n_step_through(tmp_path: Path):
    db = tmp_path / "k.db"
    await long_kernel(db)
    app = make_app(db, session=1)
    async with app.run_test(size=(80, 24)) as pilot:
        kernel = await kernel_in_view(pilot)
        height = kernel.scrollable_content_region.height

        def found() -> int:
            start, end = kernel.selection
            assert start != end and kernel.text.split("\n")[start[0]][start[1]:end[1]] \
                .lower() == "line 150"
            assert kernel.scroll_y <= start[0] < kernel.scroll_y + height  # in view
            return start[0]

        await pilot.press("slash", *"LINE 150", "enter")  # a capital letter: match case
        await pilot.pause(0.1)
        assert any("no match for 'LINE 150'" in n.message for n in app._notifications)
        await pilot.press("slash")
        await until(pilot, lambda: app.screen is not kernel.screen, what="the question")
        await pilot.press(*"line 150", "enter")
        await until(pilot, lambda: kernel.selection.start != kernel.selection.end,
                    what="the match")
        assert found() == 150
        # from the match selected on: "line 29" is on lines 29 and 290 to 299
        await pilot.press("slash", *"line 29", "enter")  # typed over the last pattern
        await until(pilot, lambda: kernel.selection.start[0] == 290, what="the next match")
        await pilot.press(*["n"] * 9)
        await until(pilot, lambda: kernel.selection.start[0] == 299, what="n nine times")
        await pilot.press("n")  # past the last: round to the first
        await until(pilot, lambda: kernel.selection.start[0] == 29, what="round the end")
        assert kernel.scroll_y <= 29 < kernel.scroll_y + height
        await pilot.press("N")
        await until(pilot, lambda: kernel.selection.start[0] == 299, what="N: round back")
        assert kernel.scroll_y <= 299 < kernel.scroll_y + height


async def test_the_session_log_takes_the_same_keys(fixture_db):
    from kforge_tui.widgets.wrapping_log import WrappingLog

    db, _ = fixture_db
    async with await Store.open(db) as store:
        for i in range(60):
            await store.log(1, f"log line {i}")
    app = make_app(db, session=1)
    async with app.run_test(size=(80, 24)) as pilot:
        await session_open(pilot)
        await pilot.press("4", "right_square_bracket", "right_square_bracket")
        log = app.screen.query_one("#log", WrappingLog)
        await until(pilot, lambda: log.has_focus and log.max_scroll_y > 10, what="the log")
        await pilot.press("g")
        await until(pilot, lambda: log.scroll_y == 0, what="g: the top")
        await pilot.press("j", "j")
        await until(pilot, lambda: log.scroll_y == 2, what="j twice")
        await pilot.press("ctrl+d")
        await until(pilot, lambda: log.scroll_y > 2, what="half a page")
        await pilot.press("G")
        await until(pilot, lambda: log.scroll_y == log.max_scroll_y, what="G: the end")
