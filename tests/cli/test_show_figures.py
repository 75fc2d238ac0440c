"""Every figure `kforge show` and `kforge sessions` print says what it is relative to and where it
came from: the eager column names its source (the profile before the evaluator timed the op, the
evaluator's device time after), and a kernel slower than eager and torch.compile is no best."""

from __future__ import annotations

import asyncio
from pathlib import Path

from kforge.cli.main import main
from kforge.core.candidate import EvalOutcome, EvalStatus
from kforge.store import Store
from tests.doubles import sample_cards, timing
from tests.tui.fixtures import GPU, baseline


def table_rows(shown: str) -> dict[str, str]:
    """The card table's lines by the op they show, and its heading as "heading"."""
    lines = shown.splitlines()
    head = next(i for i, line in enumerate(lines) if line.lstrip().startswith("card "))
    rows = {"heading": lines[head]}
    for line in lines[head + 1:]:
        words = line.split()
        if len(words) > 1 and words[0].isdigit():
            rows[words[1]] = line
    return rows


def show(db: Path, sid: int, capsys) -> dict[str, str]:
    assert main(["show", str(sid), "--db", str(db)]) == 0
    return table_rows(capsys.readouterr().out)


async def profiled(db: Path) -> tuple[int, dict[str, int]]:
    """The sample cards as profiled: softmax at 50 us per call, add at 10 us."""
    softmax, add, relu, view = sample_cards()
    async with await Store.open(db) as store:
        sid = await store.create_profiled_session("toy", {}, GPU,
                                                  [softmax, add.with_(eager_us=10.0), relu, view])
        return sid, {row.card.short_op: row.id for row in await store.list_cards(sid)}


def test_the_eager_column_names_its_source_before_during_and_after_the_evaluator(
        tmp_path: Path, capsys):
    db = tmp_path / "k.db"
    sid, ids = asyncio.run(profiled(db))
    before = show(db, sid, capsys)  # the profile's time per call: softmax's 50 us
    assert "eager profile" in before["heading"] and "eager device" not in before["heading"]
    assert "50.0 us" in before["_softmax"]

    async def time_softmax(cards: list[str]) -> None:
        async with await Store.open(db) as store:
            for op in cards:
                await store.update_card(ids[op], eager_us=120.0, baseline=baseline(120.0))

    asyncio.run(time_softmax(["_softmax"]))
    during = show(db, sid, capsys)  # a table of both: each figure names its source
    assert " eager " in during["heading"] and "eager profile" not in during["heading"] \
        and "eager device" not in during["heading"]
    assert "120.0 us device" in during["_softmax"] and "10.0 us profile" in during["add"]
    asyncio.run(time_softmax(["add"]))
    after = show(db, sid, capsys)
    assert "eager device" in after["heading"] and "120.0 us device" not in after["_softmax"]


async def with_best(db: Path, speedup: float, compiled_us: float) -> int:
    """softmax timed by the evaluator (eager 100 us, torch.compile ``compiled_us``) with a
    confirmed best of ``speedup`` over eager (as an older database may hold a slower one)."""
    sid, ids = await profiled(db)
    async with await Store.open(db) as store:
        card = ids["_softmax"]
        node = await store.add_node(sid, card, None, "new")
        await store.finish_node(node, EvalOutcome(EvalStatus.OK, timing=timing(100 / speedup),
                                                  eager=timing(100.0), speedup=speedup),
                                0.1, confirmed=True)
        await store.update_card(card, eager_us=100.0, compiled_us=compiled_us,
                                baseline=baseline(100.0, compiled_us), best_node=node,
                                best_speedup=speedup)
    return sid


def test_a_kernel_slower_than_eager_and_compile_is_no_best(tmp_path: Path, capsys):
    db = tmp_path / "k.db"
    sid = asyncio.run(with_best(db, 0.8, 110.0))
    row = show(db, sid, capsys)["_softmax"]
    assert "0.80x" not in row and "125.0 us" not in row  # neither its speedup nor its time
    assert main(["sessions", "--db", str(db)]) == 0
    listed = capsys.readouterr().out
    assert "best vs eager" in listed and "0.80x" not in listed


def test_a_kernel_slower_than_eager_but_faster_than_compile_says_so(tmp_path: Path, capsys):
    db = tmp_path / "k.db"
    sid = asyncio.run(with_best(db, 0.9, 200.0))
    rows = show(db, sid, capsys)
    assert "best vs eager" in rows["heading"]
    assert "0.90x (1.80x vs compile)" in rows["_softmax"] and "111.1 us" in rows["_softmax"]
