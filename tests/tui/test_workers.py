"""A search on a Ray cluster in the TUI: the workers line (what it says, how it fits, when it
shows) and the new-session form's cluster field."""

from __future__ import annotations

import os

from textual.widgets import Input

from kforge.eval.process.cluster import WorkerStatus
from kforge.store import SessionStatus, Store
from kforge_tui.screens import new_session
from kforge_tui.screens.session import SessionScreen
from kforge_tui.widgets.status_bar import StatusBar
from kforge_tui.widgets.workers import WorkersBar, workers_line
from tests.tui.conftest import NO_GPU, make_app, until
from tests.tui.test_defects import SMALL, Recorder, open_form

WORKERS = [WorkerStatus("gpu-a", 0, "H200", "sm_90", busy=True, done=12),
           WorkerStatus("gpu-a", 1, "H200", "sm_90", done=9),
           WorkerStatus("gpu-b", 0, "H200", "sm_90", done=4, lost=True)]


def test_the_line_names_each_worker_its_state_and_its_count():
    assert workers_line(WORKERS, 200) == (
        "workers 1/2 busy · gpu-a:0 busy 12 · gpu-a:1 idle 9 · gpu-b:0 lost 4")
    assert workers_line([], 200) == ""


def test_the_line_fits_its_width_by_counting_the_workers_it_leaves_out():
    for width in range(10, 90):
        line = workers_line(WORKERS, width)
        assert len(line) <= width
        assert line.startswith("workers 1/2 busy"[:width])
    assert workers_line(WORKERS, 50) == "workers 1/2 busy · gpu-a:0 busy 12 · +2 more"


async def test_the_bar_shows_under_the_status_bar_while_the_engine_reports_workers(fixture_db):
    db, _ = fixture_db
    store = await Store.open(db, create=False)
    try:
        await store.claim_engine(1, pid=os.getpid())
        await store.set_session_status(1, SessionStatus.RUNNING)
        await store.update_settings(1, {"workers": [w.to_dict() for w in WORKERS]})
        app = make_app(db, session=1)
        async with app.run_test(size=(100, 30)) as pilot:
            def rows() -> list[str]:
                return [strip.text for strip in app.screen._compositor.render_strips()]

            await until(pilot, lambda: isinstance(app.screen, SessionScreen)
                        and "workers 1/2 busy · gpu-a:0 busy 12" in rows()[1],
                        what="the workers bar under the status bar")
            screen = app.screen
            assert str(screen.query_one(StatusBar).content).strip()[:20] in rows()[0]
            await store.update_settings(1, {"workers": []})  # the search ended
            await until(pilot, lambda: not screen.query_one(WorkersBar).display,
                        what="the bar to go")
    finally:
        await store.close()



async def test_a_cluster_in_the_form_searches_there_without_a_gpu_here(tmp_path, monkeypatch):
    kforge = Recorder()
    monkeypatch.setattr(new_session, "run_kforge", kforge)
    app = make_app(tmp_path / "k.db", gpu=NO_GPU)
    async with app.run_test(size=SMALL) as pilot:
        form = await open_form(pilot)
        assert form.query_one("#warning").display  # no GPU here, and no cluster yet
        form.query_one("#model", Input).value = "resnet50"
        form.query_one("#cluster", Input).value = "head:6379"
        await until(pilot, lambda: not form.query_one("#warning").display,
                    what="the refusal to go")
        await pilot.click("#start")
        await until(pilot, lambda: kforge.argvs, what="the search to start")
    assert kforge.argvs[0][-2:] == ["--cluster", "head:6379"]
