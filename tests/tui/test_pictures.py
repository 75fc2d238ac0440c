"""The small pictures of the session screen: each op's best speedup over its iterations as a
sparkline, its share of the model's time as a bar, and the whole model's projected speedup."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given
from hypothesis import strategies as st

from kforge.store.records import CardRow, NodeRow
from kforge_tui.format import (
    BAR_EIGHTHS,
    BAR_FULL,
    SPARK_BLOCKS,
    model_projection,
    share_bar,
    sparkline,
)
from kforge_tui.search_model import SearchModel
from kforge_tui.widgets.status_bar import StatusBar
from kforge_tui.widgets.tables import OpTable
from tests.doubles import sample_cards
from tests.tui.conftest import make_app
from tests.tui.test_render_budget import session_open

speeds = st.floats(min_value=0.01, max_value=100.0, allow_nan=False)
widths = st.integers(min_value=1, max_value=40)


def filled(bar: str) -> int:
    """A share bar's length in eighths of a cell."""
    return sum(8 if c == BAR_FULL else BAR_EIGHTHS.index(c) for c in bar)


@given(st.lists(speeds, max_size=200), widths)
def test_a_sparkline_fits_its_width_and_spans_the_series(values, width):
    line = sparkline(values, width)
    assert len(line) == min(width, len(values))
    assert set(line) <= set(SPARK_BLOCKS)
    if values and max(values) > min(values):
        assert SPARK_BLOCKS[-1] in line  # the largest value reaches the top
    if values and max(values) == min(values):
        assert set(line) == {SPARK_BLOCKS[0]}


@given(st.lists(speeds, min_size=1, max_size=200), widths)
def test_a_rising_series_draws_a_rising_line(values, width):
    rising = sorted(values)
    heights = [SPARK_BLOCKS.index(c) for c in sparkline(rising, width)]
    assert heights == sorted(heights)
    if width >= len(values):  # a cell for each value: the smallest is the floor
        assert heights[0] == 0


def test_a_sparkline_in_pictures():
    assert sparkline([1.0, 1.2, 1.2, 1.6, 2.0], 8) == "▁▂▂▅█"
    assert sparkline([1.0, 1.0, 1.0, 1.0, 2.0, 2.0], 3) == "▁▁█"  # runs of two, at their best
    assert sparkline([], 8) == "" and sparkline([1.5], 8) == "▁"


@given(st.floats(min_value=-1.0, max_value=2.0, allow_nan=False),
       st.floats(min_value=-1.0, max_value=2.0, allow_nan=False), widths)
def test_a_share_bar_is_its_width_and_grows_with_the_share(a, b, width):
    low, high = sorted((a, b))
    assert len(share_bar(low, width)) == len(share_bar(high, width)) == width
    assert filled(share_bar(low, width)) <= filled(share_bar(high, width))
    assert abs(filled(share_bar(high, width)) - min(max(high, 0.0), 1.0) * width * 8) <= 0.5


def test_a_share_bar_in_pictures():
    assert share_bar(0.4375, 8) == "███▌    "
    assert share_bar(0.0, 4) == "    " and share_bar(1.0, 4) == "████"


def card_row(index: int, best: float | None) -> CardRow:
    card = replace(sample_cards()[index], id=index + 1)
    return CardRow(card=card, status="searching", stop_reason="", spent=3,
                   best_node=None, best_speedup=best, modules=[], baseline=None)


def test_the_model_projection_is_amdahls_law_over_the_faster_ops():
    assert model_projection([card_row(0, None), card_row(1, 0.8)]) is None
    # softmax is 60% of the time at 2x: 1 / (1 - 0.6 * 0.5); add at 0.8x stays on eager.
    assert model_projection([card_row(0, 2.0), card_row(1, 0.8)]) == 1 / 0.7
    assert model_projection([card_row(3, 4.0)]) is None  # a view is never replaced


def node(node_id: int, status: str = "ok", speedup: float | None = None,
         parent: int | None = None, card: int = 1) -> NodeRow:
    return NodeRow(id=node_id, session_id=1, card_id=card, parent_id=parent, action="new",
                   status=status, meta={}, reward=None, speedup=speedup, median_us=None,
                   repairable=False, pruned=False, summary="", usd=0.0, created_at=0.0,
                   finished_at=0.0)


def test_the_trend_is_the_best_so_far_after_each_finished_node():
    model = SearchModel()
    model.load([node(1, "compile_error"), node(2, speedup=1.2), node(3, speedup=1.1),
                node(4, "evaluating"), node(5, speedup=1.5), node(6, speedup=3.0, card=2)])
    assert model.best_trend(1) == [1.2, 1.2, 1.5]  # from the first kernel that worked
    model.upsert(node(4, speedup=1.4))
    assert model.best_trend(1) == [1.2, 1.2, 1.4, 1.5]
    assert model.best_trends() == {1: [1.2, 1.2, 1.4, 1.5], 2: [3.0]}


def test_the_model_names_the_lines_a_change_touched():
    model = SearchModel()
    model.load([node(1, speedup=1.0), node(2, "evaluating", parent=1), node(3, parent=2),
                node(4, speedup=1.0)])
    model.take_touched()
    model.upsert(node(2, speedup=2.0, parent=1))  # its figures and its ancestors'
    assert model.take_touched() == {1, 2}
    assert model.take_touched() == set()
    model.upsert(replace(node(2, speedup=2.0, parent=1), pruned=True))  # its whole subtree
    assert model.take_touched() == {1, 2, 3}


async def test_the_op_table_draws_trends_and_shares_and_the_bar_the_projection(fixture_db):
    db, ids = fixture_db
    app = make_app(db, session=1)
    async with app.run_test(size=(80, 24)) as pilot:
        screen = await session_open(pilot)
        table = screen.query_one(OpTable)
        cells = dict(zip([c.label.plain for c in table.ordered_columns],
                         [c.plain for c in table.get_row(str(ids["card"]))], strict=True))
        assert cells["trend"].rstrip() == "▁█████"  # 1.25x, then 1.60x found and kept
        assert cells["share"] == "▋ 60.0%"  # a bar of one cell: so the shapes fit at 80
        visible = table.scrollable_content_region.width
        widths = {c.label.plain: c.get_render_width(table) for c in table.ordered_columns}
        before_status = list(widths)[:list(widths).index("status")]
        assert sum(widths[name] for name in before_status) < visible  # status starts on screen
        # 60% of the time at 1.60x and 30% at 1.05x: the model at most 1.31x faster.
        assert "model ≤1.31x" in str(screen.query_one(StatusBar).content)
