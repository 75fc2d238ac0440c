"""Every screen and dialog at 80x24 keeps its meaning, on a wide session of many dtypes: a
Llama-shaped profile (int64 token ids, bf16 weights, long shapes)."""

from __future__ import annotations

from pathlib import Path

from textual.containers import Vertical
from textual.widgets import Button, DataTable
from textual.widgets._footer import FooterKey

from kforge.core.candidate import EvalOutcome, EvalStatus
from kforge.core.laws import Law, Ranges, Symbol
from kforge.core.opcard import OpCard
from kforge.core.ranges import range_card
from kforge.errors import KforgeError
from kforge.store import CardStatus, Store
from kforge_tui.screens import new_session
from kforge_tui.screens.help import Help
from kforge_tui.screens.session import SessionScreen
from kforge_tui.widgets.search_tree import SearchTree
from kforge_tui.widgets.tables import OpTable
from kforge_tui.widgets.wrapping_log import WrappingLog
from tests.doubles import tensor
from tests.tui.conftest import make_app, until
from tests.tui.fixtures import GPU, baseline, timing
from tests.tui.test_defects import (
    notices,
    on_screen,
    open_form,
    screen_lines,
    wrapped_on_screen,
)

SIZE = (80, 24)


def llama_cards() -> list[OpCard]:
    """One decoder layer's ops at 2048 tokens, hidden 4096, 32 heads, vocabulary 128256."""
    bf16 = "bfloat16"
    ids, x = tensor([1, 2048], "int64"), tensor([1, 2048, 4096], bf16)
    heads = tensor([1, 32, 2048, 128], bf16)
    return [
        OpCard("aten._scaled_dot_product_flash_attention.default", [heads, heads, heads],
               calls=32, total_us=9000.0, share=0.3),
        OpCard("aten.mm.default", [tensor([2048, 4096], bf16), tensor([4096, 14336], bf16)],
               calls=96, total_us=7000.0, share=0.25),
        OpCard("aten.embedding.default", [tensor([128256, 4096], bf16), ids], calls=1,
               total_us=300.0, share=0.01),
        OpCard("aten.index_select.default", [tensor([131072, 64], "float32"), 0, ids],
               calls=32, total_us=800.0, share=0.03),
        OpCard("aten._to_copy.default", [x], {"dtype": "float32"}, calls=65, total_us=2400.0,
               share=0.08),
        OpCard("aten.silu.default", [tensor([1, 2048, 14336], bf16)], calls=32,
               total_us=1800.0, share=0.06),
        OpCard("aten.mul.Tensor", [x, tensor([4096], bf16)], calls=65, total_us=1500.0,
               share=0.05),
        OpCard("aten.cat.default", [[tensor([1, 2048, 64], bf16), tensor([1, 2048, 64], bf16)],
                                    -1], calls=64, total_us=900.0, share=0.03),
        OpCard("aten.cumsum.default", [ids, 1], calls=1, total_us=20.0, share=0.001),
    ]


async def llama_session(db: Path) -> int:
    async with await Store.open(db) as store:
        sid = await store.create_profiled_session("meta-llama/Llama-3.1-8B-Instruct", {}, GPU,
                                                  llama_cards())
        rows = await store.list_cards(sid)
        await store.update_card(rows[0].id, status=CardStatus.SEARCHING)
        await store.update_card(rows[1].id, status=CardStatus.DONE,
                                stop_reason="8 iterations spent without a faster kernel")
        await store.update_settings(sid, {"search": {"focus": rows[0].id}})
    return sid


async def open_session(pilot, cards: int) -> OpTable:
    app = pilot.app
    await until(pilot, lambda: isinstance(app.screen, SessionScreen)
                and app.screen.state is not None
                and app.screen.query_one(OpTable).row_count == cards, what="the op table")
    await pilot.pause(0.1)
    return app.screen.query_one(OpTable)


async def test_a_llama_session_shows_every_column_at_80x24(tmp_path: Path):
    db = tmp_path / "k.db"
    sid = await llama_session(db)
    app = make_app(db, session=sid)
    async with app.run_test(size=SIZE) as pilot:
        table = await open_session(pilot, len(llama_cards()))
        lines = screen_lines(app)
        header = lines[table.region.y]
        for name in OpTable.COLUMNS:
            assert table.heading(name) in header, name
        assert table.max_scroll_x == 0
        rows = "\n".join(lines[table.region.y + 1:table.region.bottom])
        assert "i64" in rows and "bf16" in rows and "int64" not in rows
        assert "◎ run" in rows or "◎ searching" in rows


async def mid_search(db: Path) -> int:
    """The Llama session mid-search: some ops timed by the evaluator, the others still at their
    profile's time (an eager column of both sources), and a would-be best of the focused op
    under confirmation."""
    sid = await llama_session(db)
    async with await Store.open(db) as store:
        rows = await store.list_cards(sid)
        for row in rows[:3]:
            await store.update_card(row.id, eager_us=254.9, compiled_us=300.0,
                                    baseline=baseline(254.9, 300.0))
        for row in rows[3:]:  # the profile's GPU time per call
            await store.update_card(row.id, eager_us=row.card.total_us / row.card.calls)
        node = await store.add_node(sid, rows[0].id, None, "new")
        await store.finish_node(node, EvalOutcome(EvalStatus.OK, timing=timing(200.0),
                                                  eager=timing(254.9), speedup=1.27),
                                0.1, confirming=True)
    return sid


async def test_mid_search_every_column_keeps_its_meaning_at_80x24(tmp_path: Path):
    db = tmp_path / "k.db"
    sid = await mid_search(db)
    app = make_app(db, session=sid)
    async with app.run_test(size=SIZE) as pilot:
        table = await open_session(pilot, len(llama_cards()))
        lines = screen_lines(app)
        header = lines[table.region.y]
        for name in OpTable.COLUMNS:
            assert table.heading(name) in header, name
        assert table.heading("eager") == "eager us"  # both sources: each cell names its own
        assert table.max_scroll_x == 0
        rows = lines[table.region.y + 1:table.region.y + 1 + len(llama_cards())]
        shown = "\n".join(rows)
        assert "bf16,i64" in shown and "f32,i64" in shown  # the dtypes whole
        assert "254.9 eval" in shown and "20.0 prof" in shown
        assert "◎ conf" in shown  # the focused op's would-be best is confirming
        assert "1.27x" not in shown  # and counts for nothing until confirmed
        names = [row.split("│")[1].split()[0] for row in rows]
        assert all(len(name) >= 8 for name in names if name.endswith("…")), names


def ranged(card: OpCard) -> OpCard:
    """``card`` as a range card over the sequence length (its first argument's dimension 1)."""
    return range_card(card, Ranges((Symbol("L", 1, 131071, 2048),),
                                   (Law(("args", 0, "shape", 1), "L", 1, 0),)))


async def test_a_session_profiled_at_several_lengths_keeps_every_column_at_80x24(
        tmp_path: Path):
    """Range cards' ops carry their range: where it does not fit beside the name the op shows
    its symbol (``mm L…``) and the search tree's root the whole range; no column scrolls off."""
    db = tmp_path / "k.db"
    cards = llama_cards()
    cards[4:7] = [ranged(card) for card in cards[4:7]]  # _to_copy, silu, mul follow L
    async with await Store.open(db) as store:
        sid = await store.create_profiled_session("meta-llama/Llama-3.1-8B-Instruct", {}, GPU,
                                                  cards)
    app = make_app(db, session=sid)
    async with app.run_test(size=SIZE) as pilot:
        table = await open_session(pilot, len(cards))
        lines = screen_lines(app)
        header = lines[table.region.y]
        for name in OpTable.COLUMNS:
            assert table.heading(name) in header, name
        assert table.max_scroll_x == 0
        rows = "\n".join(lines[table.region.y + 1:table.region.y + 1 + len(cards)])
        assert " L…" in rows or "L=1..131071" in rows
        table.select_card(next(row.id for row in app.screen.state.cards
                               if row.card.short_op == "silu"))
        tree = app.screen.query_one(SearchTree)
        await until(pilot, lambda: tree.card is not None and tree.card.card.short_op == "silu",
                    what="silu's tree")
        await pilot.press("2")  # at 80 columns the panes take turns
        await until(pilot, lambda: on_screen(app, "silu L=1..131071  eager"),
                    what="the whole range atop the tree")


async def failing_kforge(argv: list[str], on_line) -> dict:
    for line in ("profiling resnet50 on cpu", "loading torchvision"):
        on_line(line)
    raise KforgeError("the model 'resnet50' needs torchvision: pip install torchvision")


async def test_after_a_failed_start_the_form_keeps_start_and_cancel_on_screen(
        tmp_path: Path, monkeypatch):
    monkeypatch.setattr(new_session, "run_kforge", failing_kforge)
    app = make_app(tmp_path / "k.db")
    async with app.run_test(size=SIZE) as pilot:
        form = await open_form(pilot)
        await pilot.press(*"resnet50")
        form.query_one("#start", Button).press()
        await until(pilot, lambda: notices(app, "needs torchvision"),
                    what="the failure")
        await pilot.pause(0.1)
        inside = form.query_one(Vertical).content_region
        for button in ("#start", "#cancel"):
            region = form.query_one(button, Button).region
            assert region.height and inside.contains_region(region), (button, region)
        assert any("Start" in line and "Cancel" in line for line in screen_lines(app))
        progress = form.query_one("#progress", WrappingLog)
        assert progress.region.height >= 4
        assert progress.messages[0].startswith("$ kforge search resnet50 --db ")


async def test_help_shows_kforges_own_keys_first_and_fits(tmp_path: Path):
    db = tmp_path / "k.db"
    sid = await llama_session(db)
    app = make_app(db, session=sid)
    async with app.run_test(size=SIZE) as pilot:
        await open_session(pilot, len(llama_cards()))
        await pilot.press("question_mark")
        await until(pilot, lambda: isinstance(app.screen, Help), what="help")
        await pilot.pause(0.1)
        table = app.screen.query_one(DataTable)
        shown = {str(table.get_row_at(i)[2])
                 for i in range(table.scrollable_content_region.height - 1)}
        assert {"prune", "unprune", "pause", "resume", "stop", "best", "diff", "filter",
                "sort", "focus", "quit", "help"} <= shown
        assert on_screen(app, "Remap a key by its id")


E2E_SUMMARY = ("e2e: eager 41.20 ms, eager+kforge 39.87 ms (1.03x, 14 kernels ran), compile "
               "22.10 ms, compile+kforge 21.95 ms (1.01x, within noise), max-autotune 20.40 ms")


async def test_a_long_log_line_wraps_whole_and_rewraps_on_resize(fixture_db):
    db, _ = fixture_db
    async with await Store.open(db) as store:
        await store.log(1, E2E_SUMMARY)
    app = make_app(db, session=1)
    async with app.run_test(size=SIZE) as pilot:
        await open_session(pilot, 4)
        await pilot.press("4", "right_square_bracket", "right_square_bracket")
        log = app.screen.query_one("#log", WrappingLog)
        await until(pilot, lambda: log.region.width and any(
            E2E_SUMMARY in line for line in log.messages), what="the summary in the log")
        await pilot.pause(0.1)
        assert wrapped_on_screen(app, E2E_SUMMARY.split(": ", 1)[1])
        await pilot.resize_terminal(100, 24)
        await pilot.pause(0.2)
        assert wrapped_on_screen(app, E2E_SUMMARY.split(": ", 1)[1])


async def test_the_footer_shows_whole_keys_only(tmp_path: Path):
    db = tmp_path / "k.db"
    sid = await llama_session(db)
    app = make_app(db, session=sid)
    async with app.run_test(size=SIZE) as pilot:
        await open_session(pilot, len(llama_cards()))
        await pilot.press("2")  # the search tree: the most keys
        await until(pilot, lambda: len(app.screen.query(FooterKey)) > 2
                    and "^p commands" in screen_lines(app)[-1], what="the footer")
        footer = screen_lines(app)[-1]
        keys = list(app.screen.query(FooterKey))
        for key in keys:
            assert f"{key.key_display} {key.description}" in footer, footer
        await pilot.resize_terminal(120, 24)
        await until(pilot, lambda: len(app.screen.query(FooterKey)) > len(keys),
                    what="more keys on a wider terminal")
