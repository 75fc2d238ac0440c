"""Colours on terminals of 16 million, 256 and 16 colours: the theme the app starts with, and the
search tree's node states as each shipped theme draws them, reduced to the terminal's palette the
way Rich reduces them, each state apart from the others and readable under the cursor."""

from __future__ import annotations

from itertools import combinations

import pytest
from rich.color import Color, ColorSystem
from rich.console import Console
from rich.segment import Segment

from kforge.core.settings import DEFAULT_THEME, Settings
from kforge_tui.config.themes import ANSI_THEME, colour_depth, starting_theme
from kforge_tui.widgets.search_tree import SearchTree
from kforge_tui.widgets.status_bar import StatusBar
from tests.tui.conftest import TERMINALS, make_app
from tests.tui.test_render_budget import session_open

THEMES = ("kforge-dark", "kforge-light", ANSI_THEME)


def shown(color: Color | None, depth: ColorSystem) -> tuple:
    """The colour the terminal shows: a palette number, or for 16 million colours the triplet
    (a terminal's default colour is (None, None))."""
    if color is None:
        return (None, None)
    reduced = color.downgrade(depth)
    return (reduced.number, reduced.triplet)


def is_blue(color: Color) -> bool:
    red, green, blue = color.downgrade(ColorSystem.EIGHT_BIT).get_truecolor()
    return blue > max(red, green) + 32


def line_of(tree: SearchTree, node_id: int) -> list[Segment]:
    for y in range(tree.size.height):
        node = tree.get_node_at_line(y + int(tree.scroll_offset.y))
        if node is not None and node.data is not None and node.data.id == node_id:
            return list(tree.render_line(y))
    raise AssertionError(f"node #{node_id} is not on screen")


def segment(line: list[Segment], starts: tuple[str, ...]) -> Segment:
    return next(s for s in line if s.text.lstrip().startswith(starts))


async def tree_of_every_state(pilot, ids: dict[str, int]) -> SearchTree:
    """The fixture session's tree, focused and fully open, the cursor on the failed node."""
    screen = await session_open(pilot)
    await pilot.press("2")
    tree = screen.query_one(SearchTree)
    tree.open_all()
    tree.select_id(ids["b"])
    await pilot.pause(0.1)
    return tree


def state_colours(tree: SearchTree, ids: dict[str, int], depth: ColorSystem) -> dict[str, tuple]:
    """The colour of each state's mark, and the cursor's background."""
    icon = {"ok": ("a", "✔"), "failed": ("b", "✗"), "in flight": ("a11", ("…", "◷")),
            "pruned": ("c", "✂")}
    colours = {state: shown(segment(line_of(tree, ids[node]), tuple(marks)).style.color, depth)
               for state, (node, marks) in icon.items()}
    colours["best"] = shown(segment(line_of(tree, ids["a1"]), ("★",)).style.color, depth)
    cursor = segment(line_of(tree, ids["b"]), ("#",)).style
    colours["cursor"] = shown(cursor.bgcolor, depth)
    return colours


def test_the_colour_depth_is_what_rich_reads_from_colorterm_and_term():
    for name, (environ, depth) in TERMINALS.items():
        console = Console(force_terminal=True, _environ=environ)
        assert colour_depth(console) is depth, name
    dumb = Console(force_terminal=True, _environ={"TERM": "dumb"})
    assert colour_depth(dumb) is ColorSystem.STANDARD


def test_sixteen_colours_start_the_ansi_theme_unless_one_was_chosen():
    assert starting_theme(None, DEFAULT_THEME, ColorSystem.STANDARD) == ANSI_THEME
    assert starting_theme(None, DEFAULT_THEME, ColorSystem.EIGHT_BIT) == DEFAULT_THEME
    assert starting_theme(None, DEFAULT_THEME, ColorSystem.TRUECOLOR) == DEFAULT_THEME
    assert starting_theme("kforge-dark", DEFAULT_THEME, ColorSystem.STANDARD) == "kforge-dark"
    assert starting_theme(None, "kforge-light", ColorSystem.STANDARD) == "kforge-light"


@pytest.mark.parametrize("terminal", ["16"], indirect=True)
async def test_the_app_picks_its_theme_from_the_terminal_and_the_user(fixture_db, terminal):
    db, _ = fixture_db
    app = make_app(db)
    assert app.theme == ANSI_THEME
    chosen = make_app(db, theme="kforge-dark")
    assert chosen.theme == "kforge-dark"
    assert chosen.current_theme.accent == "#ff55ff"  # its 16-colour fallback
    # kforge-light is not made for 16 colours: the ANSI theme, and a word why.
    configured = make_app(db, config=Settings.from_dict({"tui": {"theme": "kforge-light"}}))
    assert configured.theme == ANSI_THEME
    assert configured._problems == [
        "theme 'kforge-light' is not made for this terminal's 16 colours; using kforge-ansi"]


@pytest.mark.parametrize("terminal", list(TERMINALS), indirect=True)
@pytest.mark.parametrize("theme", THEMES)
async def test_every_node_state_has_its_own_colour_at_every_depth(fixture_db, terminal, theme):
    db, ids = fixture_db
    app = make_app(db, session=1, theme=theme)
    async with app.run_test(size=(120, 40)) as pilot:
        tree = await tree_of_every_state(pilot, ids)
        colours = state_colours(tree, ids, terminal)
        clashes = [(a, b) for a, b in combinations(colours, 2) if colours[a] == colours[b]]
        assert clashes == [], colours
        if terminal is ColorSystem.EIGHT_BIT and not app.current_theme.ansi:
            backgrounds = {"screen": app.screen.rich_style.bgcolor,
                           "status bar": app.screen.query_one(StatusBar).rich_style.bgcolor,
                           "tree": segment(line_of(tree, ids["a"]), ("✔",)).style.bgcolor}
            assert [name for name, colour in backgrounds.items() if is_blue(colour)] == []
        # The tree's guides show on the terminal's background.
        guide = segment(line_of(tree, ids["a2"]), ("│", "├", "└")).style
        assert shown(guide.color, terminal) not in (shown(guide.bgcolor, terminal), (0, None))

        # A pruned node under the cursor reads like any other there, struck through.
        failed = segment(line_of(tree, ids["b"]), ("#",)).style
        tree.select_id(ids["c"])
        await pilot.pause(0.1)
        pruned = segment(line_of(tree, ids["c"]), ("#",)).style
        assert pruned.strike
        assert shown(pruned.color, terminal) == shown(failed.color, terminal)
        assert shown(pruned.bgcolor, terminal) == shown(failed.bgcolor, terminal)
        assert shown(pruned.color, terminal) != shown(pruned.bgcolor, terminal)
