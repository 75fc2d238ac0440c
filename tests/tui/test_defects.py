"""The TUI as a user meets it in an 80x24 terminal: the new-session form with its defaults, a dead
engine, what fits on screen, the one no-GPU rule, an unreadable database, the palette after a
remap, escape and the kernel pane, filters and the delete confirmation, and the demo. Each test
drives the real widgets with the pilot and reads what the screen shows."""

from __future__ import annotations

import asyncio
import os
import sqlite3
import stat
import threading
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from textual.widgets import Select

import kforge_tui.app as app_module
from kforge.core.candidate import Candidate, EvalOutcome, EvalStatus
from kforge.core.settings import Settings
from kforge.errors import KforgeError
from kforge.store import SessionStatus, Store
from kforge_tui.demo import build_demo, recording
from kforge_tui.header import Part, fit, session_header, short_gpu, short_model
from kforge_tui.launch import (
    GpuCheck,
    NewSession,
    needs_gpu,
    resume_argv,
    search_argv,
    search_evaluator,
)
from kforge_tui.screens import new_session
from kforge_tui.screens.dialogs import Choose, Confirm
from kforge_tui.screens.help import Help
from kforge_tui.screens.new_session import NewSessionScreen
from kforge_tui.screens.session import SessionScreen
from kforge_tui.screens.sessions import SessionsScreen
from kforge_tui.widgets.code_view import CodeView
from kforge_tui.widgets.search_tree import SearchTree
from kforge_tui.widgets.tables import OpTable, VimTable
from kforge_tui.widgets.wrapping_log import WrappingLog
from tests.doubles import sample_cards
from tests.tui.conftest import NO_GPU, make_app, until
from tests.tui.fixtures import GPU, KERNEL, LAUNCHER, build, timing
from tests.tui.test_navigation import open_first_session

SMALL = (80, 24)
PLUG_IN = "tests.doubles:make_evaluator"
LONG_MODEL = "/home/someone/projects/models/a_rather_long_model_file_name.py:build_the_model"


def screen_lines(app) -> list[str]:
    """The terminal's rows as the user sees them now (the top screen and its toasts)."""
    return [strip.text for strip in app.screen._compositor.render_strips()]


def on_screen(app, text: str) -> bool:
    return any(text in line for line in screen_lines(app))


def wrapped_on_screen(app, text: str) -> bool:
    """Whether ``text`` shows whole, wrapped over rows of a bordered box."""
    def bare(shown: str) -> str:
        return "".join(c for c in shown if not c.isspace() and c not in "│▏")

    return bare(text) in bare("".join(screen_lines(app)))


def notices(app, text: str) -> list[str]:
    return [n.message for n in app._notifications if text in n.message]


class Recorder:
    """Stands in for the ``kforge`` subprocess: keeps each argv, answers with a session."""

    def __init__(self, session: int = 1) -> None:
        self.argvs: list[list[str]] = []
        self.session = session

    async def __call__(self, argv: list[str], on_line) -> dict:
        self.argvs.append(argv)
        return {"session": self.session}


async def open_form(pilot) -> NewSessionScreen:
    await pilot.press("n")
    await until(pilot, lambda: isinstance(pilot.app.screen, NewSessionScreen), what="the form")
    return pilot.app.screen


# ----- 1. the new-session form's defaults -----


async def test_the_form_with_its_defaults_runs_a_plain_search(tmp_path: Path, monkeypatch):
    db = tmp_path / "k.db"
    kforge = Recorder()
    monkeypatch.setattr(new_session, "run_kforge", kforge)
    app = make_app(db)
    async with app.run_test(size=SMALL) as pilot:
        form = await open_form(pilot)
        assert form.query_one("#dtype", Select).is_blank()
        await pilot.press(*"resnet50", "enter")
        await until(pilot, lambda: kforge.argvs, what="the search to start")
    assert kforge.argvs[0][4:] == ["search", "resnet50", "--db", str(db), "--detach", "--json"]


async def test_values_picked_in_the_form_reach_the_command(tmp_path: Path, monkeypatch):
    db = tmp_path / "k.db"
    kforge = Recorder()
    monkeypatch.setattr(new_session, "run_kforge", kforge)
    app = make_app(db)
    async with app.run_test(size=SMALL) as pilot:
        form = await open_form(pilot)
        await pilot.press(*"resnet50", "tab")  # to the dtype list
        assert form.query_one("#dtype", Select).has_focus
        await pilot.press("enter", "down", "down", "enter")  # model default, float16, bfloat16
        await pilot.press("tab", "enter", "down", "down", "enter")  # proposer: library, llm
        await pilot.press("tab", *"12", "enter")
        await until(pilot, lambda: kforge.argvs, what="the search to start")
    assert kforge.argvs[0][10:] == ["--dtype", "bfloat16", "--proposer", "llm",
                                    "--iterations", "12"]


@pytest.mark.parametrize("form, says", [
    (NewSession("resnet50", iterations="0"),
     r"\[search\] iterations_per_op in the new-session form must be at least 1, not 0"),
    (NewSession("resnet50", usd="nan"), "usd in the new-session form must be a finite number"),
    (NewSession("resnet50", usd="-1"), "usd in the new-session form must be a finite number"),
    (NewSession("resnet50", time="0"), "wall_s in the new-session form must be a finite number"),
])
def test_the_form_checks_budgets_by_the_settings_own_rules(tmp_path: Path, form, says):
    with pytest.raises(KforgeError, match=says):
        search_argv(form, tmp_path / "k.db")


# ----- 2. a dead engine -----


async def running_with_engine(db: Path, pid: int) -> None:
    async with await Store.open(db, create=False) as store:
        await store.claim_engine(1, pid=pid)
        await store.set_session_status(1, SessionStatus.RUNNING)


async def test_a_dead_engine_is_reported_once_and_pause_says_so_in_80_columns(fixture_db):
    db, _ = fixture_db
    engine = await asyncio.create_subprocess_exec("sleep", "60")
    await running_with_engine(db, engine.pid)
    app = make_app(db, session=1)
    try:
        async with app.run_test(size=SMALL) as pilot:
            await until(pilot, lambda: isinstance(app.screen, SessionScreen)
                        and app.screen.state is not None and app.screen.state.alive,
                        what="the live engine")
            screen = app.screen
            assert not notices(app, "stopped; r resumes the search")
            engine.kill()
            await engine.wait()
            await until(pilot, lambda: not screen.state.alive, what="the engine to look dead")
            await pilot.pause(0.1)
            assert "engine stopped — r to resume" in screen_lines(app)[0]
            await pilot.pause(2.5)  # another liveness check: nothing new to say
            assert len(notices(app, "stopped; r resumes the search")) == 1
            log = screen.query_one("#log", WrappingLog)
            assert sum("stopped; r resumes the search" in line for line in log.messages) == 1
            await pilot.press("p")
            await until(pilot, lambda: isinstance(app.screen, Confirm), what="the offer")
            question = app.screen.question
            assert question.startswith("The engine of session 1 has stopped.")
            await pilot.pause(0.1)
            assert wrapped_on_screen(app, question)
            await pilot.press("n")
    finally:
        if engine.returncode is None:
            engine.kill()
            await engine.wait()


async def test_opening_on_a_session_leaves_one_connection_that_quit_closes(fixture_db):
    """Both screens ask for the store as the app starts; a second connection would keep its
    thread, and the process, alive after quit."""
    db, _ = fixture_db
    app = make_app(db, session=1)
    async with app.run_test(size=SMALL) as pilot:
        await until(pilot, lambda: isinstance(app.screen, SessionScreen)
                    and app.screen.state is not None, what="the session")
        connections = [t for t in threading.enumerate() if "connection" in t.name]
        assert len(connections) == 1
        await pilot.press("q")
    connections[0].join(timeout=5)
    assert not connections[0].is_alive()


# ----- 3. an 80x24 terminal -----


async def long_named_session(db: Path) -> int:
    async with await Store.open(db) as store:
        return await store.create_profiled_session(LONG_MODEL, {}, GPU, sample_cards())


async def test_every_screen_keeps_help_and_quit_in_its_footer(fixture_db):
    db, _ = fixture_db
    app = make_app(db)
    async with app.run_test(size=SMALL) as pilot:
        await until(pilot, lambda: isinstance(app.screen, SessionsScreen)
                    and app.screen.query_one(VimTable).row_count == 2)
        await footer_shows_help_and_quit(pilot)
        await open_first_session(pilot)
        for pane in "1234":
            await pilot.press(pane)
            await footer_shows_help_and_quit(pilot)


async def footer_shows_help_and_quit(pilot) -> None:
    def shown() -> bool:
        footer = screen_lines(pilot.app)[-1]
        return "? help" in footer and "q quit" in footer

    await until(pilot, shown, timeout_s=3, what="? help and q quit in the footer")


async def test_the_top_bar_abbreviates_instead_of_dropping(fixture_db):
    db, _ = fixture_db
    sid = await long_named_session(db)
    app = make_app(db, session=sid, gpu=GpuCheck("NVIDIA H100 80GB HBM3 (+7)", "8 GPU(s)"))
    async with app.run_test(size=SMALL) as pilot:
        await until(pilot, lambda: isinstance(app.screen, SessionScreen)
                    and app.screen.state is not None)
        await pilot.pause(0.1)
        top = screen_lines(app)[0]
        for shown in (f"#{sid} a_rather_long_model", "0/72", "$0.00", "0m", "H100 +7"):
            assert shown in top, top


async def test_confirm_dialogs_wrap_their_question(fixture_db):
    db, _ = fixture_db
    sid = await long_named_session(db)
    app = make_app(db)
    async with app.run_test(size=SMALL) as pilot:
        await until(pilot, lambda: isinstance(app.screen, SessionsScreen)
                    and app.screen.query_one(VimTable).row_count == 3)
        assert on_screen(app, "0s ago")  # the last column, at 80 columns
        await pilot.press("G", "d")
        await until(pilot, lambda: isinstance(app.screen, Confirm))
        await pilot.pause(0.1)
        assert app.screen.question == (f"Delete session {sid} ({LONG_MODEL}) and all its "
                                       "kernels?")
        assert wrapped_on_screen(app, app.screen.question)
        assert on_screen(app, "Yes (y)") and on_screen(app, "No (n)")
        assert app.screen.query_one("#no").has_focus


async def test_help_and_the_form_fit_80x24(fixture_db):
    db, _ = fixture_db
    app = make_app(db, gpu=NO_GPU)
    async with app.run_test(size=SMALL) as pilot:
        await open_first_session(pilot)
        await pilot.press("question_mark")
        await until(pilot, lambda: isinstance(app.screen, Help))
        await pilot.pause(0.1)
        assert on_screen(app, "escape closes this")
        await pilot.press("escape", "escape", "escape")
        await until(pilot, lambda: isinstance(app.screen, SessionsScreen))
        await open_form(pilot)
        await pilot.pause(0.1)
        assert on_screen(app, "Start") and on_screen(app, "Cancel") and on_screen(app, "time")


@given(st.lists(st.tuples(st.text(min_size=1, max_size=30), st.text(min_size=1, max_size=8),
                          st.integers(0, 5)), min_size=1, max_size=6),
       st.integers(0, 120))
def test_a_fitted_bar_is_never_wider_than_asked_and_full_when_it_fits(raw, width):
    parts = [Part(full, short, keep) for full, short, keep in raw]
    line = fit(parts, width)
    assert len(line) <= width
    full = " · ".join(p.full for p in parts)
    if len(full) <= width:
        assert line == full


def test_short_forms_keep_what_names_a_model_and_a_gpu():
    assert short_model(LONG_MODEL, 60) == "a_rather_long_model_file_name.py:build_the_model"
    assert short_model("gemma4-tiny") == "gemma4-tiny"
    assert short_gpu("NVIDIA H200 (+3)") == "H200 +3" and short_gpu("no GPU") == "no GPU"
    assert short_gpu("Fake GPU") == "Fake GPU"


# ----- 4. one rule for what needs a GPU -----


def test_only_the_builtin_evaluator_needs_a_gpu_and_a_session_keeps_its_own():
    assert needs_gpu("gpu") and not needs_gpu(PLUG_IN)
    config = Settings.from_dict({"search": {"evaluator": PLUG_IN}})
    assert search_evaluator(config) == PLUG_IN
    assert search_evaluator(config, {"search": {"evaluator": "gpu"}}) == "gpu"
    assert search_evaluator(Settings(), {"search": {"iterations_per_op": 3}}) == "gpu"


async def test_without_a_gpu_a_plug_in_evaluator_searches_and_resumes(fixture_db, monkeypatch):
    db, _ = fixture_db
    kforge = Recorder(session=2)
    monkeypatch.setattr(new_session, "run_kforge", kforge)
    monkeypatch.setattr(app_module, "run_kforge", kforge)
    config = Settings.from_dict({"search": {"evaluator": PLUG_IN}})
    app = make_app(db, gpu=NO_GPU, config=config)
    async with app.run_test(size=SMALL) as pilot:
        await until(pilot, lambda: isinstance(app.screen, SessionsScreen)
                    and app.screen.query_one(VimTable).row_count == 2)
        notice = str(app.screen.query_one("#notice").render())
        assert "No NVIDIA GPU here" in notice and "need a GPU" not in notice
        assert PLUG_IN in notice
        form = await open_form(pilot)
        assert not form.query_one("#warning").display
        await pilot.press(*"resnet50", "enter")
        await until(pilot, lambda: kforge.argvs, what="the search to start")
        await until(pilot, lambda: isinstance(app.screen, SessionScreen))
        await pilot.press("escape")
        await until(pilot, lambda: isinstance(app.screen, SessionsScreen))
        await pilot.press("j", "r")  # session 2 stored no evaluator: the config's plug-in
        await until(pilot, lambda: len(kforge.argvs) == 2, what="the resume")
    assert kforge.argvs[1] == resume_argv(2, db)


async def test_without_a_gpu_a_session_on_the_gpu_evaluator_is_not_resumed(fixture_db,
                                                                          monkeypatch):
    db, _ = fixture_db
    kforge = Recorder()
    monkeypatch.setattr(app_module, "run_kforge", kforge)
    config = Settings.from_dict({"search": {"evaluator": PLUG_IN}})
    app = make_app(db, gpu=NO_GPU, config=config)
    async with app.run_test(size=SMALL) as pilot:
        await until(pilot, lambda: isinstance(app.screen, SessionsScreen)
                    and app.screen.query_one(VimTable).row_count == 2)
        await pilot.press("r")  # session 1 was searched with the gpu evaluator
        await until(pilot, lambda: notices(app, "needs an NVIDIA GPU"), what="the refusal")
    assert kforge.argvs == []


# ----- 5. an unreadable database -----


async def test_a_corrupt_database_is_said_once_in_the_notice_and_recovers(tmp_path: Path):
    db = tmp_path / "k.db"
    db.write_bytes(b"this is not a database" * 100)
    app = make_app(db)
    async with app.run_test(size=SMALL) as pilot:
        await until(pilot, lambda: notices(app, "not a kforge database"), what="the error")
        await pilot.pause(0.5)  # ten more tries
        assert len(notices(app, "not a kforge database")) == 1
        notice = str(app.screen.query_one("#notice").render())
        assert "not a kforge database" in notice and "No sessions yet" not in notice
        good = tmp_path / "good.db"
        await build(good)
        os.replace(good, db)
        await until(pilot, lambda: app.screen.query_one(VimTable).row_count == 2,
                    what="the sessions once the file reads")
        assert "not a kforge database" not in str(app.screen.query_one("#notice").render())


@pytest.mark.parametrize("column, value", [("usd", "lots"), ("seconds", "slow"),
                                           ("prompt", b"\xff\x00")])
async def test_a_damaged_llm_call_is_said_and_the_session_stays_open(fixture_db, column, value):
    """The kernel pane shows a node's LLM calls: one whose cost, time or prompt is not what
    kforge stores is named in a notice (it ended the app with a ValueError before). The
    values are damaged within kforge's own schema: a schema that is not kforge's is refused as
    the database opens."""
    db, ids = fixture_db
    with sqlite3.connect(db) as raw:
        raw.execute(f"UPDATE llm_calls SET {column} = ?", (value,))
    app = make_app(db, session=ids["session"])
    async with app.run_test(size=SMALL) as pilot:
        await until(pilot, lambda: notices(app, "a language-model call of search node"),
                    what="the damaged call named")
        assert isinstance(app.screen, SessionScreen)
        await pilot.press("2", "j", "k")
        await pilot.pause(0.3)
        assert app.is_running and isinstance(app.screen, SessionScreen)


async def test_a_log_line_of_no_date_is_said_and_the_session_stays_open(fixture_db):
    """The log pane shows each line's time: one no date can show is a damaged row, named (it
    ended the app with an OverflowError before)."""
    db, ids = fixture_db
    with sqlite3.connect(db) as raw:
        raw.execute("UPDATE events SET at = ? WHERE kind = 'log'", (2**63 - 1,))
    app = make_app(db, session=ids["session"])
    async with app.run_test(size=SMALL) as pilot:
        await until(pilot, lambda: notices(app, "must be a moment kforge wrote"),
                    what="the damaged event named")
        await pilot.pause(0.2)
        assert app.is_running


async def test_a_session_not_in_the_database_is_said_and_leaves_for_the_list(fixture_db):
    """kforge-tui --session 99 over a database without it: the error, then the sessions list
    (not a session screen that says loading forever)."""
    db, _ = fixture_db
    app = make_app(db, session=99)
    async with app.run_test(size=SMALL) as pilot:
        await until(pilot, lambda: notices(app, "no session 99"), what="the error")
        await until(pilot, lambda: isinstance(app.screen, SessionsScreen), what="the list")


@pytest.mark.parametrize("number", [str(2**64), "0", "-1"])
def test_a_session_number_no_database_holds_is_a_usage_error(number: str, capsys):
    with pytest.raises(SystemExit) as exit_:
        app_module.parse_args(["--session", number])
    assert exit_.value.code == 2
    assert f"a session is named by its number (1 to {2**63 - 1}), not {number}" in \
        capsys.readouterr().err


# ----- 6. the palette after a remap -----


async def test_the_palette_shows_the_keys_as_remapped(fixture_db):
    db, _ = fixture_db
    app = make_app(db, config=Settings.from_dict({"keys": {"prune": "z"}}))
    async with app.run_test(size=SMALL) as pilot:
        await open_first_session(pilot)
        await pilot.press("ctrl+p")
        await pilot.press(*"prune the")
        await until(pilot, lambda: on_screen(app, "Prune the selected subtree"),
                    what="the palette's answer")
        lines = screen_lines(app)
        at = next(i for i, line in enumerate(lines) if "Prune the selected subtree" in line)
        assert lines[at + 1].strip(" │▊▎▌▐") == "z", lines[at:at + 2]


# ----- 7. escape and the kernel pane -----


async def two_ops_with_a_best_each(db: Path) -> dict[str, int]:
    """Two ops whose trees have the same shape: a new kernel refined into the best."""
    async with await Store.open(db) as store:
        sid = await store.create_profiled_session("twins", {}, GPU, sample_cards()[:2])
        ids = {}
        for card in await store.list_cards(sid):
            parent = None
            for action, speed in (("new", 1.2), ("refine", 1.5)):
                node = await store.add_node(sid, card.id, parent, action)
                source = KERNEL.replace("softmax_rows", f"kernel_of_node_{node}")
                await store.set_candidate(node, Candidate(source, LAUNCHER, {}))
                await store.finish_node(node, EvalOutcome(
                    EvalStatus.OK, timing=timing(100 / speed), eager=timing(100.0),
                    speedup=speed), 0.1, confirmed=True)
                parent = node
            ids[card.card.short_op] = parent
        return ids


async def test_the_kernel_pane_shows_the_node_the_tree_highlights(tmp_path: Path):
    db = tmp_path / "k.db"
    best = await two_ops_with_a_best_each(db)
    app = make_app(db, session=1)
    async with app.run_test(size=SMALL) as pilot:
        await until(pilot, lambda: isinstance(app.screen, SessionScreen)
                    and app.screen.query_one(SearchTree).card is not None)
        screen = app.screen
        kernel = screen.query_one("#kernel", CodeView)
        tree = screen.query_one(SearchTree)
        for op, keys in (("_softmax", ()), ("add", ("j",))):
            await pilot.press("1", *keys)
            await until(pilot, lambda op=op: tree.card.card.short_op == op)
            assert tree.selected_id == best[op]
            await until(pilot, lambda op=op: f"kernel_of_node_{best[op]}(" in kernel.text,
                        timeout_s=3, what=f"the kernel of {op}'s best node")


async def test_the_kernel_pane_follows_a_best_node_found_after_opening(fixture_db):
    db, _ = fixture_db
    app = make_app(db, session=2)  # profiled, never searched
    async with app.run_test(size=SMALL) as pilot:
        await until(pilot, lambda: isinstance(app.screen, SessionScreen)
                    and app.screen.query_one(SearchTree).card is not None)
        screen = app.screen
        assert "select a node" in screen.query_one("#kernel", CodeView).text
        async with await Store.open(db, create=False) as store:
            card = screen.query_one(SearchTree).card
            node = await store.add_node(2, card.id, None, "new")
            await store.set_candidate(node, Candidate(KERNEL, LAUNCHER, {}))
            await store.finish_node(node, EvalOutcome(EvalStatus.OK, timing=timing(50.0),
                                                      eager=timing(100.0), speedup=2.0), 0.1,
                                     confirmed=True)
        await until(pilot, lambda: screen.query_one(SearchTree).selected_id == node,
                    what="the tree to highlight the new best node")
        await until(pilot, lambda: "softmax_rows" in screen.query_one("#kernel", CodeView).text,
                    what="its kernel")


async def test_escape_steps_back_from_the_kernel_to_the_tree_then_out(fixture_db):
    db, _ = fixture_db
    app = make_app(db)
    async with app.run_test(size=SMALL) as pilot:
        screen = await open_first_session(pilot)
        await pilot.press("2", "3")
        assert screen.active == "code"
        await pilot.press("escape")
        assert app.screen is screen and screen.active == "tree"
        await pilot.press("4", "escape")
        assert app.screen is screen and screen.active == "tree"
        await pilot.press("escape")
        assert isinstance(app.screen, SessionsScreen)


# ----- 8. filters and the delete confirmation -----


async def test_an_active_filter_shows_in_the_title_and_escape_clears_it(fixture_db):
    db, _ = fixture_db
    app = make_app(db)
    async with app.run_test(size=SMALL) as pilot:
        screen = await open_first_session(pilot)
        await pilot.press("slash", *"zzz", "enter")
        await pilot.pause(0.1)
        assert on_screen(app, 'no ops match "zzz" — esc to clear')
        await pilot.press("escape")
        assert app.screen is screen and screen.query_one(OpTable).row_count == 4
        assert not on_screen(app, "zzz")
        await pilot.press("2", "slash")
        await until(pilot, lambda: isinstance(app.screen, Choose))
        await pilot.press("j", "j", "enter")  # all, ok, failed
        await pilot.pause(0.1)
        assert on_screen(app, "2 search tree · filter: failed")
        await pilot.press("1", "j", "2")  # add: no failed node
        await pilot.pause(0.1)
        assert on_screen(app, "no nodes match filter failed — esc to clear")
        await pilot.press("escape")
        await pilot.pause(0.1)
        assert app.screen is screen and not on_screen(app, "filter:")
        assert screen.query_one(SearchTree).root.children


async def test_enter_in_the_delete_confirmation_keeps_the_session(fixture_db):
    db, _ = fixture_db
    app = make_app(db)
    async with app.run_test(size=SMALL) as pilot:
        await until(pilot, lambda: isinstance(app.screen, SessionsScreen)
                    and app.screen.query_one(VimTable).row_count == 2)
        await pilot.press("j", "d")
        await until(pilot, lambda: isinstance(app.screen, Confirm))
        await pilot.press("enter")
        await until(pilot, lambda: isinstance(app.screen, SessionsScreen))
        await pilot.pause(0.3)
        assert app.screen.query_one(VimTable).row_count == 2
        await pilot.press("d", "y")
        await until(pilot, lambda: app.screen.query_one(VimTable).row_count == 1)


# ----- 9. the demo -----


def test_the_demo_flag_runs_the_recording_from_a_temporary_read_only_file(monkeypatch):
    seen = {}

    def run(app, args) -> int:
        seen.update(db=app.db_path, exists=app.db_path.exists(), demo=app.demo,
                    mode=app.db_path.stat().st_mode)
        return 0

    monkeypatch.setattr(app_module, "run", run)
    assert app_module.main(["--demo"]) == 0
    assert seen["exists"] and seen["demo"] and not seen["mode"] & stat.S_IWUSR
    assert not seen["db"].exists()  # removed on the way out


async def test_the_demo_opens_its_session_to_browse_and_writes_nothing(tmp_path: Path):
    db, sid = await asyncio.to_thread(build_demo, tmp_path)
    app = make_app(db, session=sid, demo=True, gpu=NO_GPU)
    async with app.run_test(size=SMALL) as pilot:
        await until(pilot, lambda: isinstance(app.screen, SessionScreen)
                    and app.screen.query_one(SearchTree).card is not None)
        screen = app.screen
        assert len(screen.model.nodes) == len(recording.STEPS)
        assert "demo" in screen_lines(app)[0]
        await until(pilot, lambda: screen.detail is not None, what="the best node's kernel")
        assert "softmax" in screen.query_one("#kernel", CodeView).text
        await pilot.press("2", "x", "p")
        await until(pilot, lambda: len(notices(app, "read-only recording")) == 2)
        assert not isinstance(app.screen, Confirm)
    async with await Store.open_read_only(db) as store:
        pruned = {n.id for n in await store.list_nodes(sid) if n.pruned}
    assert pruned == {index + 1 for index, step in enumerate(recording.STEPS) if step.pruned}


async def test_the_demos_eager_times_read_as_the_evaluators_after_its_search(tmp_path: Path):
    """The recording is a finished search: its ops' eager times are the evaluator's, as a search
    leaves them (not the profile's), and their kernels beat eager by the evaluator's figures."""
    db, sid = await asyncio.to_thread(build_demo, tmp_path)
    app = make_app(db, session=sid, demo=True, gpu=NO_GPU)
    async with app.run_test(size=SMALL) as pilot:
        await until(pilot, lambda: isinstance(app.screen, SessionScreen)
                    and app.screen.state is not None)
        await pilot.pause(0.1)
        table = app.screen.query_one(OpTable)
        eager = {row.card.short_op: table.get_row(str(row.id))[4].plain
                 for row in app.screen.state.cards if row.card.target}
        assert eager and all(cell.endswith("eval") for cell in eager.values()), eager
    async with await Store.open_read_only(db) as store:
        said = [n.summary for n in await store.list_nodes(sid) if n.ok]
    assert said and all(" eager (device " in summary for summary in said), said


def test_session_header_names_a_dead_engine(fixture_db_sync):
    session, cards = fixture_db_sync
    line = session_header(session, cards, alive=False, gpu="GPU: Fake GPU", width=200)
    assert "engine stopped — r to resume" in line


@pytest.fixture
def fixture_db_sync(tmp_path: Path):
    async def read():
        db = tmp_path / "k.db"
        await build(db)
        async with await Store.open(db, create=False) as store:
            await store.set_session_status(1, SessionStatus.RUNNING)
            return await store.get_session(1), await store.list_cards(1)

    return asyncio.run(read())

