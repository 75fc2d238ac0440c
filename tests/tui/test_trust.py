"""Resuming a session whose database names plug-ins or a Ray cluster: the TUI asks first, naming
each literally, as ``kforge resume`` would refuse them (``needs_consent``, the CLI's own rule), and
starts the engine with those given again (``--proposer SPEC``...) only on a yes, never with
``--trust-plugins``; a plain session resumes as before."""

from __future__ import annotations

from pathlib import Path

import pytest
from textual.containers import Vertical
from textual.geometry import Region
from textual.widgets import Button, Label

import kforge_tui.app as app_module
from kforge.core.settings import Origin, Settings
from kforge.engine.plugins import PluginConsent, needs_consent, settled_search
from kforge.errors import KforgeError
from kforge.store import Store
from kforge_tui.launch import resume_argv
from kforge_tui.screens.dialogs import TrustPlugins
from kforge_tui.screens.session import SessionScreen
from kforge_tui.screens.sessions import SessionsScreen
from kforge_tui.widgets.tables import VimTable
from tests.doubles import sample_cards
from tests.tui.conftest import make_app, until
from tests.tui.fixtures import GPU
from tests.tui.test_defects import (
    Recorder,
    notices,
    on_screen,
    screen_lines,
    wrapped_on_screen,
)

SMALL = (80, 24)
PROPOSER = "tests.doubles:make_proposer"
ESCAPE = "\x1b]52;c;cm0gLXJmIH4K\x07"  # OSC 52: write the clipboard
EVALUATOR = f"run[/final]/ev[b]il:make{ESCAPE}"
CLUSTER = "ray://[@click=app.quit]host:10001"
NAMING = {"search": {"proposer": PROPOSER, "evaluator": EVALUATOR, "cluster": CLUSTER}}


async def one_session(db: Path, settings: dict) -> int:
    async with await Store.open(db) as store:
        return await store.create_profiled_session("toy", settings, GPU, sample_cards())


async def press_resume(pilot, sid: int) -> None:
    """``r`` on the session's row of the sessions list."""
    app = pilot.app
    await until(pilot, lambda: isinstance(app.screen, SessionsScreen)
                and app.screen.query_one(VimTable).row_count == 1, what="the sessions list")
    app.screen.query_one(VimTable).select_key(str(sid))
    await pilot.press("r")


async def asked(pilot) -> TrustPlugins:
    await until(pilot, lambda: isinstance(pilot.app.screen, TrustPlugins), what="the question")
    await pilot.pause()
    return pilot.app.screen


def test_what_needs_consent_is_what_the_cli_refuses():
    config = Settings()
    named = needs_consent(1, NAMING, config)
    assert named == [("proposer", PROPOSER), ("evaluator", EVALUATOR), ("cluster", CLUSTER)]
    search = settled_search(NAMING, {}, config, Origin.stored(1))
    with pytest.raises(KforgeError, match="the session names the proposer"):
        PluginConsent().check(search, NAMING["search"], config.search)
    PluginConsent(every=True).check(search, NAMING["search"], config.search)
    # given again on the command line, or the config file's own: confirmed
    confirmed = PluginConsent(frozenset({("proposer", PROPOSER)}))
    assert needs_consent(1, NAMING, config, confirmed) == named[1:]
    mine = Settings.from_dict({"search": {"evaluator": EVALUATOR, "cluster": CLUSTER}})
    assert needs_consent(1, NAMING, mine) == [("proposer", PROPOSER)]
    assert needs_consent(1, {"search": {"proposer": "llm", "evaluator": "gpu"}}, config) == []
    assert needs_consent(1, {}, Settings.from_dict({"search": {"proposer": PROPOSER}})) == []


async def test_the_question_names_each_spec_literally(tmp_path: Path, monkeypatch):
    db = tmp_path / "k.db"
    sid = await one_session(db, NAMING)
    kforge = Recorder(session=sid)
    monkeypatch.setattr(app_module, "run_kforge", kforge)
    app = make_app(db)
    async with app.run_test(size=SMALL) as pilot:
        await press_resume(pilot, sid)
        dialog = await asked(pilot)
        assert on_screen(app, f"Session {sid} names code to run on this machine")
        assert on_screen(app, "import and run the proposer") and on_screen(app, PROPOSER)
        assert on_screen(app, "import and run the evaluator")
        assert on_screen(app, "run[/final]/ev[b]il:make]52;c;cm0gLXJmIH4K")  # ESC, BEL dropped
        assert on_screen(app, "control characters, left out above")
        assert on_screen(app, "connect to the Ray cluster") and on_screen(app, CLUSTER)
        assert wrapped_on_screen(app, "Trust & resume runs that code on this machine")
        assert not any("\x1b" in line or "\x07" in line for line in screen_lines(app))
        specs = [label for label in dialog.query(Label) if label.has_class("spec")]
        assert [str(label.render()) for label in specs] == [PROPOSER,
                                                           EVALUATOR.replace(ESCAPE, "]52;c;"
                                                                             "cm0gLXJmIH4K"),
                                                           CLUSTER]
        assert not [span for label in specs for span in label.render().spans]  # no markup
        assert dialog.query_one("#cancel", Button).has_focus
    assert kforge.argvs == []


@pytest.mark.parametrize("keys", [("escape",), ("enter",)])  # enter presses the focused Cancel
async def test_cancel_starts_nothing(tmp_path: Path, monkeypatch, keys):
    db = tmp_path / "k.db"
    sid = await one_session(db, NAMING)
    kforge = Recorder(session=sid)
    monkeypatch.setattr(app_module, "run_kforge", kforge)
    app = make_app(db)
    async with app.run_test(size=SMALL) as pilot:
        await press_resume(pilot, sid)
        await asked(pilot)
        await pilot.press(*keys)
        await until(pilot, lambda: notices(app, "was not resumed"), what="the answer")
        assert isinstance(app.screen, SessionsScreen)
    assert kforge.argvs == []


@pytest.mark.parametrize("keys", [("t",), ("right", "enter")])  # the key, or the Trust button
async def test_trust_resumes_with_the_flag(tmp_path: Path, monkeypatch, keys):
    db = tmp_path / "k.db"
    sid = await one_session(db, NAMING)
    kforge = Recorder(session=sid)
    monkeypatch.setattr(app_module, "run_kforge", kforge)
    app = make_app(db)
    async with app.run_test(size=SMALL) as pilot:
        await press_resume(pilot, sid)
        await asked(pilot)
        await pilot.press(*keys)
        await until(pilot, lambda: kforge.argvs, what="the resume")
        await until(pilot, lambda: isinstance(app.screen, SessionScreen), what="the session")
    assert kforge.argvs == [resume_argv(sid, db, needs_consent(sid, NAMING, Settings()))]
    assert kforge.argvs[0][-6:] == ["--cluster", CLUSTER, "--evaluator", EVALUATOR,
                                    "--proposer", PROPOSER]
    assert "--trust-plugins" not in kforge.argvs[0]


async def test_the_session_screens_resume_asks_too(tmp_path: Path, monkeypatch):
    db = tmp_path / "k.db"
    sid = await one_session(db, {"search": {"evaluator": EVALUATOR}})
    kforge = Recorder(session=sid)
    monkeypatch.setattr(app_module, "run_kforge", kforge)
    app = make_app(db, session=sid)
    async with app.run_test(size=SMALL) as pilot:
        await until(pilot, lambda: isinstance(app.screen, SessionScreen)
                    and app.screen.state is not None, what="the session")
        await pilot.press("r")
        dialog = await asked(pilot)
        assert dialog.named == [("evaluator", EVALUATOR)]
        said = " ".join(str(label.render()) for label in dialog.query(Label))
        assert "evaluator" in said and "proposer" not in said and "Ray cluster" not in said
        await pilot.press("t")
        await until(pilot, lambda: kforge.argvs, what="the resume")
    assert kforge.argvs == [resume_argv(sid, db, [("evaluator", EVALUATOR)])]


@pytest.mark.parametrize("settings", [
    {"search": {"proposer": "library", "evaluator": "gpu"}},
    {"search": {"evaluator": EVALUATOR}},  # the config file names it: the user's own
])
async def test_a_session_needing_no_consent_resumes_without_a_question(tmp_path: Path,
                                                                      monkeypatch, settings):
    db = tmp_path / "k.db"
    sid = await one_session(db, settings)
    kforge = Recorder(session=sid)
    monkeypatch.setattr(app_module, "run_kforge", kforge)
    app = make_app(db, config=Settings.from_dict({"search": {"evaluator": EVALUATOR}}))
    async with app.run_test(size=SMALL) as pilot:
        await press_resume(pilot, sid)
        await until(pilot, lambda: kforge.argvs, what="the resume")
        await until(pilot, lambda: isinstance(app.screen, SessionScreen), what="the session")
        assert not any(isinstance(screen, TrustPlugins) for screen in app.screen_stack)
    assert kforge.argvs == [resume_argv(sid, db)]
    assert "--trust-plugins" not in kforge.argvs[0]


async def test_settings_changed_while_asking_start_nothing(tmp_path: Path, monkeypatch):
    db = tmp_path / "k.db"
    sid = await one_session(db, {"search": {"evaluator": EVALUATOR}})
    kforge = Recorder(session=sid)
    monkeypatch.setattr(app_module, "run_kforge", kforge)
    app = make_app(db)
    async with app.run_test(size=SMALL) as pilot:
        await press_resume(pilot, sid)
        await asked(pilot)
        async with await Store.open(db) as writer:
            await writer.update_settings(sid, {"search": {"evaluator": "other:factory"}})
        await pilot.press("t")
        await until(pilot, lambda: notices(app, "changed while you were asked"),
                    what="the refusal")
    assert kforge.argvs == []


@pytest.mark.parametrize("evaluator", [EVALUATOR, "pkg." * 150 + "x:make"])
async def test_the_question_fits_80x24(tmp_path: Path, monkeypatch, evaluator):
    db = tmp_path / "k.db"
    sid = await one_session(db, {"search": {**NAMING["search"], "evaluator": evaluator}})
    monkeypatch.setattr(app_module, "run_kforge", Recorder(session=sid))
    app = make_app(db)
    async with app.run_test(size=SMALL) as pilot:
        await press_resume(pilot, sid)
        dialog = await asked(pilot)
        box = dialog.query_one(Vertical)
        assert Region(0, 0, *SMALL).contains_region(box.region)
        for button in ("#cancel", "#trust"):
            region = dialog.query_one(button, Button).region
            assert region.height and box.content_region.contains_region(region), button
        assert on_screen(app, "Cancel (escape)") and on_screen(app, "Trust & resume (t)")
        assert wrapped_on_screen(app, "Trust & resume runs that code on this machine")
        lines = screen_lines(app)
        assert all(len(line) <= SMALL[0] for line in lines) and len(lines) == SMALL[1]
