"""Capture at several sequence lengths: op variants that follow the length become range cards,
the rest stay exact; end to end, `kforge profile --seq-lengths` stores them with their samples
and `kforge show` prints their ranges."""

from __future__ import annotations

import asyncio
import importlib.util

import pytest

from kforge.capture.ranges import LengthProfile, find_range_cards
from kforge.cli.main import main
from kforge.core.opcard import OpCard
from kforge.errors import KforgeError
from kforge.store import Store


def kv(length: int, dim: int = 8) -> dict:
    return {"t": "tensor", "shape": [1, 2, length, dim], "stride": [2 * length * dim,
                                                                    length * dim, dim, 1],
            "dtype": "bfloat16", "offset": 0}


def decode_step(length: int) -> tuple[list[OpCard], dict[str, list[str]]]:
    """The cards of a toy decode step at KV length ``length``: the KV append (keys and values
    from one module: two variants alike but for their sizes), a softmax over the scores, a
    matmul that does not vary, and a position add whose scalar is the length."""
    cards = [OpCard("aten.cat.default", [{"t": "list", "items": [kv(length), kv(1)]}, -2]),
             OpCard("aten.cat.default", [{"t": "list", "items": [kv(length, 4), kv(1, 4)]}, -2]),
             OpCard("aten._softmax.default", [kv(length + 1), -1, False]),
             OpCard("aten.mm.default", [kv(4), kv(4)]),
             OpCard("aten.add.Tensor", [kv(1), length])]
    modules = {cards[0].key: ["attn"], cards[1].key: ["attn"], cards[2].key: ["attn"],
               cards[3].key: ["mlp"], cards[4].key: ["model"]}
    return cards, modules


def others(*lengths: int) -> list[LengthProfile]:
    return [LengthProfile(n, *decode_step(n)) for n in lengths]


def test_the_variants_that_follow_the_length_become_range_cards():
    cards, modules = decode_step(64)
    ranged = find_range_cards(cards, modules, 64, others(32, 100), (1, 4095))
    assert set(ranged) == {cards[0].key, cards[1].key, cards[2].key, cards[4].key}
    assert ranged[cards[2].key].signature == "bf16[1,2,L+1,8], -1, False for L=1..4095"
    assert ranged[cards[4].key].signature == "bf16[1,2,1,8], L for L=1..4095"
    assert ranged[cards[0].key].args == cards[0].args  # the profiled variant, kept


def test_two_lengths_do_not_make_a_range_and_ambiguous_matches_stay_exact():
    cards, modules = decode_step(64)
    assert find_range_cards(cards, modules, 64, others(32), (1, 4095)) == {}
    # at one length the softmax moved to another module: it is no longer the same call
    moved = others(32, 100)
    softmax = moved[1].cards[2]
    moved[1].modules[softmax.key] = ["elsewhere"]
    assert cards[2].key not in find_range_cards(cards, modules, 64, moved, (1, 4095))


def test_the_range_is_narrowed_to_valid_sizes_and_must_hold_the_profiled_length():
    def sliding(length: int) -> tuple[list[OpCard], dict]:
        """A window of the last 16 entries of a growing buffer: its offset follows the length."""
        window = {**kv(16), "stride": [2 * 512 * 8, 512 * 8, 8, 1], "offset": 8 * (length - 16)}
        card = OpCard("aten.clone.default", [window])
        return [card], {card.key: ["attn"]}

    cards, modules = sliding(64)
    lengths = [LengthProfile(n, *sliding(n)) for n in (32, 100)]
    (card,) = find_range_cards(cards, modules, 64, lengths, (1, 4095)).values()
    assert card.range_text == "L=16..4095"
    assert find_range_cards(cards, modules, 64, lengths, (1, 40)) == {}


pytestmark_transformers = pytest.mark.skipif(
    importlib.util.find_spec("transformers") is None, reason="transformers is not installed")


@pytestmark_transformers
def test_profile_with_seq_lengths_stores_range_cards_and_show_prints_them(tmp_path, capsys):
    db = tmp_path / "kforge.db"
    code = main(["profile", "gemma4-tiny", "--mode", "decode", "--device", "cpu", "--batch", "1",
                 "--seq-len", "32", "--seq-lengths", "48,80", "--samples", "1",
                 "--no-regions", "--db", str(db)])
    assert code == 0
    assert "op variants follow the sequence length" in capsys.readouterr().out

    async def read():
        store = await Store.open(db)
        try:
            session = await store.get_session(1)
            return session, await store.list_cards(1), store.samples_dir(1)
        finally:
            await store.close()

    session, rows, samples = asyncio.run(read())
    assert session.settings["seq_lengths"] == [48, 80] and session.settings["seq_len"] == 32
    ranged = [row.card for row in rows if row.card.ranges]
    appends = [c for c in ranged if c.signature.startswith("[bf16[1,1,L,")]
    assert appends and appends[0].op == "aten.cat.default"
    assert all(c.range_text.endswith("..4095") for c in appends)
    assert (samples / appends[0].key / "0.pt").exists()  # the samples moved to the new key
    assert main(["show", "1", "--db", str(db)]) == 0
    assert "L=1..4095" in capsys.readouterr().out


def test_seq_lengths_must_add_two_other_lengths(tmp_path):
    with pytest.raises(KforgeError, match="two or more lengths"):
        from kforge.capture import ModelOptions
        from kforge.capture.ranges import profile_lengths

        profile_lengths("gemma4-tiny", ModelOptions(seq_len=32), [32, 48])
