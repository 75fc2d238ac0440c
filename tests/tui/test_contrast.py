"""Text contrast as each offered theme renders on terminals of 256 and of 16 colours: every
character drawn on the screen, its colour and its background reduced to the terminal's palette
(the 16 colours as xterm draws them), at 4.5:1 or better (WCAG AA): the session, every dialog
(help, the command palette, the theme picker, a confirmation, the new-session form), the toasts
and the sessions list."""

from __future__ import annotations

import pytest
from rich._palettes import EIGHT_BIT_PALETTE
from rich.color import Color, ColorSystem, ColorType
from textual.command import CommandPalette
from textual.containers import Vertical
from textual.geometry import Region
from textual.widgets._toast import Toast

from kforge_tui.screens.dialogs import Confirm
from kforge_tui.screens.new_session import NewSessionScreen
from kforge_tui.screens.sessions import SessionsScreen
from tests.tui.conftest import make_app, until
from tests.tui.test_render_budget import session_open

# xterm's 16 colours; a terminal's default text is its white, its default background black.
XTERM = [(0, 0, 0), (205, 0, 0), (0, 205, 0), (205, 205, 0), (0, 0, 238), (205, 0, 205),
         (0, 205, 205), (229, 229, 229), (127, 127, 127), (255, 0, 0), (0, 255, 0),
         (255, 255, 0), (92, 92, 255), (255, 0, 255), (0, 255, 255), (255, 255, 255)]
DEFAULT_TEXT, DEFAULT_BACKGROUND = XTERM[7], XTERM[0]
MINIMUM = 4.5


def rgb(color: Color | None, depth: ColorSystem, default: tuple) -> tuple[int, int, int]:
    """The colour a terminal of ``depth`` shows for ``color``."""
    if color is None or color.type is ColorType.DEFAULT:
        return default
    shown = color.downgrade(depth)
    if shown.number is not None and shown.number < 16:
        return XTERM[shown.number]
    if shown.number is not None:
        return EIGHT_BIT_PALETTE[shown.number]
    return shown.get_truecolor()


def luminance(colour: tuple[int, int, int]) -> float:
    def channel(value: int) -> float:
        c = value / 255
        return c / 12.92 if c <= 0.03928 else ((c + 0.055) / 1.055) ** 2.4
    red, green, blue = (channel(v) for v in colour)
    return 0.2126 * red + 0.7152 * green + 0.0722 * blue


def contrast(a: tuple, b: tuple) -> float:
    high, low = sorted((luminance(a), luminance(b)), reverse=True)
    return (high + 0.05) / (low + 0.05)


def poor_text(app, depth: ColorSystem, region: Region | None = None) -> list[tuple[str, float]]:
    """Each run of text (letters or digits) on the screen below the minimum contrast, with its
    contrast; only inside ``region`` where given (a dialog: what it covers is veiled on
    purpose)."""
    poor = []
    for y, strip in enumerate(app.screen._compositor.render_strips()):
        if region is not None:
            if not region.y <= y < region.bottom:
                continue
            strip = strip.crop(region.x, region.right)
        for segment in strip:
            if segment.style is None or not any(c.isalnum() for c in segment.text):
                continue  # borders, guides, bars and scrollbars are no text
            style = segment.style
            text = rgb(style.color, depth, DEFAULT_TEXT)
            ground = rgb(style.bgcolor, depth, DEFAULT_BACKGROUND)
            if style.reverse:
                text, ground = ground, text
            ratio = contrast(text, ground)
            if ratio < MINIMUM:
                poor.append((segment.text.strip(), round(ratio, 2)))
    return poor


def dialog(app) -> Region:
    """The box of the dialog on top."""
    return app.screen.query_one(Vertical).region


@pytest.mark.parametrize("terminal", ["256", "16"], indirect=True)
async def test_every_offered_theme_keeps_text_readable(fixture_db, terminal):
    db, _ = fixture_db
    app = make_app(db)
    names = sorted(app.available_themes)
    # Textual's own themes have no fallbacks, nor kforge-light one for 16 colours: not offered.
    assert names == sorted(name for name, spec in app.specs.items() if spec.offered_at(terminal))
    assert "textual-dark" not in names
    assert ("kforge-light" in names) == (terminal is not ColorSystem.STANDARD)
    found = {}
    for name in names:
        app = make_app(db, session=1, theme=name)
        async with app.run_test(size=(120, 40), notifications=True) as pilot:
            screen = await session_open(pilot)
            found[name, "session"] = poor_text(app, terminal)
            await pilot.press("question_mark")
            await until(pilot, lambda: app.screen is not screen, what="help")
            await pilot.pause(0.1)
            found[name, "help"] = poor_text(app, terminal, dialog(app))
            await pilot.press("escape")
            for key, what in (("ctrl+p", "palette"), ("ctrl+t", "theme picker")):
                await until(pilot, lambda: app.screen is screen, what="the session")
                await pilot.press(key)
                await until(pilot, lambda: isinstance(app.screen, CommandPalette), what=what)
                await pilot.pause(0.1)
                box = app.screen.query_one("#--container").region
                found[name, what] = poor_text(app, terminal, box)
                await pilot.press("escape")
            await until(pilot, lambda: app.screen is screen, what="the session")
            app.notify("set [search] evaluator", title="kforge", severity="error")
            app.notify("the engine stopped", title="engine stopped", severity="warning")
            app.notify("ops sorted by best")
            await until(pilot, lambda: len(app.screen.query(Toast)) == 3, what="the toasts")
            await pilot.pause(0.1)
            found[name, "toasts"] = [poor for toast in app.screen.query(Toast)
                                     for poor in poor_text(app, terminal, toast.region)]
            await pilot.press("escape")
            await until(pilot, lambda: isinstance(app.screen, SessionsScreen), what="the list")
            await pilot.pause(0.1)
            found[name, "sessions"] = poor_text(app, terminal)
            await pilot.press("d")
            await until(pilot, lambda: isinstance(app.screen, Confirm), what="the confirmation")
            await pilot.pause(0.1)
            found[name, "confirm"] = poor_text(app, terminal, dialog(app))
            await pilot.press("escape")
            await until(pilot, lambda: isinstance(app.screen, SessionsScreen), what="the list")
            await pilot.press("n")
            await until(pilot, lambda: isinstance(app.screen, NewSessionScreen), what="the form")
            await pilot.pause(0.1)
            found[name, "form"] = poor_text(app, terminal, dialog(app))
    assert {where: poor for where, poor in found.items() if poor} == {}
