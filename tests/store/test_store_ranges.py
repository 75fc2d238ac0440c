"""Range cards in the store: their ranges are kept, exact cards keep none, and a database from
before ranges is migrated in place."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from kforge.core.laws import Law, Ranges, Symbol
from kforge.core.opcard import OpCard
from kforge.core.ranges import range_card
from kforge.store import Store
from kforge.store.schema import LATEST, MIGRATIONS
from tests.doubles import sample_cards


def kv_card(length: int = 64) -> OpCard:
    spec = {"t": "tensor", "shape": [1, 2, length, 8], "stride": [16 * length, 8 * length, 8, 1],
            "dtype": "float32", "offset": 0}
    ranges = Ranges((Symbol("L", 1, 512, length),),
                    (Law(("args", 0, "shape", 2), "L", 1, 0),
                     Law(("args", 0, "stride", 0), "L", 16, 0),
                     Law(("args", 0, "stride", 1), "L", 8, 0)))
    return range_card(OpCard("aten.relu.default", [spec], share=0.2, calls=4), ranges)


async def test_a_range_card_reads_back_with_its_ranges(tmp_path: Path):
    store = await Store.open(tmp_path / "k.db")
    try:
        ranged = kv_card()
        sid = await store.create_profiled_session("toy", {}, {}, [*sample_cards(), ranged])
        rows = {row.card.key: row.card for row in await store.list_cards(sid)}
    finally:
        await store.close()
    back = rows[ranged.key]
    assert back.ranges == ranged.ranges and back.signature.endswith("for L=1..512")
    assert all(card.ranges is None for key, card in rows.items() if key != ranged.key)


async def test_a_database_from_before_ranges_is_migrated(tmp_path: Path):
    path = tmp_path / "old.db"
    con = sqlite3.connect(path)
    before_ranges = 3  # migration 4 added them
    for script in MIGRATIONS[:before_ranges]:
        con.executescript(script)
    con.execute(f"PRAGMA user_version = {before_ranges}")
    con.close()
    store = await Store.open(path)
    try:
        sid = await store.create_profiled_session("toy", {}, {}, [kv_card(32)])
        (row,) = await store.list_cards(sid)
    finally:
        await store.close()
    assert row.card.range_text == "L=1..512"
    assert sqlite3.connect(path).execute("PRAGMA user_version").fetchone()[0] == LATEST

