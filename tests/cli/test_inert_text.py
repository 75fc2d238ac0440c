"""Database text is inert on the terminal: escape sequences stored in a session (a clipboard
write, a window title, a screen clear) reach `kforge sessions`, `kforge show` and its node view,
and kforge's error lines, without their control characters."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from pathlib import Path

import pytest

from kforge.cli.main import main
from kforge.core.candidate import Candidate, EvalOutcome, EvalStatus
from kforge.core.inert import inert
from kforge.store import Store
from tests.doubles import sample_cards

OSC52 = "\x1b]52;c;cm0gLXJmIH4K\x07"
PAYLOAD = f"{OSC52}\x1b]0;owned\x1b\\\x1b[2J\x9b2J\u202e\u061c"
CONTROLS = ("\x1b", "\x07", "\x9b", "\u202e", "\u061c")


def test_inert_keeps_text_and_drops_what_drives_a_terminal():
    assert inert(f"model{PAYLOAD}.py\tok\n") == "model]52;c;cm0gLXJmIH4K]0;owned\\[2J2J.py\tok\n"


@pytest.fixture
def db(tmp_path: Path) -> tuple[Path, int, int]:
    async def make() -> tuple[int, int]:
        store = await Store.open(tmp_path / "k.db")
        try:
            cards = [replace(sample_cards()[0], library=f"lib{PAYLOAD}")]
            sid = await store.create_profiled_session(f"model{PAYLOAD}.py", {},
                                                      {"name": f"GPU{PAYLOAD}", "arch": "sm_90"}, cards)
            card = (await store.list_cards(sid))[0]
            node_id = await store.add_node(sid, card.id, None, "new")
            await store.set_candidate(node_id, Candidate(f"// {PAYLOAD}\n", plan={},
                                                         meta={"approach": PAYLOAD}))
            await store.finish_node(node_id, EvalOutcome(EvalStatus.COMPILE_ERROR,
                                                         summary=PAYLOAD,
                                                         compile_log=PAYLOAD), None)
            await store.log(sid, PAYLOAD, "warning")
            return sid, node_id
        finally:
            await store.close()

    return (tmp_path / "k.db", *asyncio.run(make()))


@pytest.mark.parametrize("command", [["sessions"], ["show", "{sid}"],
                                     ["show", "{sid}", "--node", "{node}"]])
def test_stored_escape_sequences_do_not_reach_the_terminal(db, command, capsys):
    path, sid, node_id = db
    argv = [part.format(sid=sid, node=node_id) for part in command] + ["--db", str(path)]
    assert main(argv) == 0
    shown = capsys.readouterr()
    text = shown.out + shown.err
    assert "model" in text
    assert not [c for c in CONTROLS if c in text]


def test_an_error_line_quoting_data_is_inert(db, capsys):
    path, _sid, _node = db
    assert main(["profile", f"missing{PAYLOAD}.py:build", "--db", str(path)]) == 1
    err = capsys.readouterr().err
    assert "kforge: model file not found" in err
    assert not [c for c in CONTROLS if c in err]


def test_the_delete_prompt_quoting_the_model_is_inert(db, monkeypatch, capsys):
    import sys

    path, sid, _node = db
    asked = []
    monkeypatch.setattr(sys.stdin, "isatty", lambda: True)
    monkeypatch.setattr("builtins.input", lambda prompt: asked.append(prompt) or "n")
    assert main(["delete", str(sid), "--db", str(path)]) == 1
    assert len(asked) == 1 and "model" in asked[0]
    assert not [c for c in CONTROLS if c in asked[0]]
