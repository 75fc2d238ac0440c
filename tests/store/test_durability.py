"""The durability level is the caller's: the ``[store] durability`` setting where the user's
config gives it to the store, full unless the config says so."""

from __future__ import annotations

from pathlib import Path

import pytest

from kforge.core.settings import Settings, SettingsError
from kforge.store import Store
from kforge.store.config import store_options


async def synchronous(db: Path) -> int:
    store = await Store.open(db, options=store_options())
    try:
        rows = await store._read("PRAGMA synchronous", ())
        return rows[0][0]
    finally:
        await store.close()


async def test_finished_results_survive_a_power_loss_by_default(tmp_path, monkeypatch):
    monkeypatch.setenv("KFORGE_CONFIG", str(tmp_path / "absent.toml"))
    assert await synchronous(tmp_path / "k.db") == 2  # FULL


async def test_the_config_can_trade_durability_for_speed(tmp_path, monkeypatch):
    config = tmp_path / "config.toml"
    config.write_text('[store]\ndurability = "normal"\n')
    monkeypatch.setenv("KFORGE_CONFIG", str(config))
    assert await synchronous(tmp_path / "k.db") == 1  # NORMAL


def test_an_unknown_durability_is_refused_with_the_choices():
    with pytest.raises(SettingsError, match=r"\[store\] durability .*must be one of full, normal, not .fast."):
        Settings.from_dict({"store": {"durability": "fast"}})
