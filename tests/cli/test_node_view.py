"""`kforge show SESSION --node N`: one node in full, with the prompts and replies of its LLM
calls as they were stored."""

from __future__ import annotations

import asyncio
from pathlib import Path

from kforge.cli.main import main
from kforge.core.candidate import Candidate, EvalOutcome, EvalStatus, LlmCall, Timing
from kforge.core.outcome import CompileFacts
from kforge.store import Store
from tests.doubles import FAKE_PLAN, sample_cards

PROMPT = "[system]\nYou are an expert CUDA performance engineer.\n\n[user]\n# Task: repair"
REPLY = "Approach: fix the missing semicolon\n```cuda\nextern \"C\" __global__ void k() {}\n```"
SOURCE = 'extern "C" __global__ void k(float* x) { x[0] = 1.f }'


def make_session(db: Path) -> tuple[int, int, int]:
    """A session with a working node and a failed repair of it made by two LLM calls."""

    async def go() -> tuple[int, int, int]:
        async with await Store.open(db) as store:
            sid = await store.create_profiled_session("toy", {}, {"name": "Fake GPU",
                                                                  "arch": "sm_90"},
                                                      sample_cards())
            card = (await store.list_cards(sid))[0].id
            parent = await store.add_node(sid, card, None, "new")
            await store.set_candidate(parent, Candidate("// first", FAKE_PLAN,
                                                        {"approach": "one block per row"}))
            await store.finish_node(parent, EvalOutcome(
                EvalStatus.OK, speedup=1.4, timing=Timing(40.0, 39.0, 41.0, 100, host_us=6.0, wall_us=41.5),
                eager=Timing(56.0, 55.0, 57.0, 100),
                compile=CompileFacts(registers={"k": 32}, spills=False)), 0.3, confirmed=True)
            node = await store.add_node(sid, card, parent, "refine")
            calls = [LlmCall("kernel-writer-1", 0, 0, 0.0, 2.5, prompt=PROMPT,
                             error="rate limited (429)"),
                     LlmCall("kernel-writer-1", 1800, 700, 0.0159, 41.0, prompt=PROMPT,
                             reply=REPLY)]
            await store.set_candidate(node, Candidate(SOURCE, FAKE_PLAN, {
                "proposer": "llm", "model": "kernel-writer-1", "approach": "vectorised rows"}),
                calls)
            await store.finish_node(node, EvalOutcome(
                EvalStatus.COMPILE_ERROR, summary="error: expected a ';'",
                compile_log="candidate.cu(1): error: expected a \";\""), None)
            return sid, parent, node

    return asyncio.run(go())


def test_a_node_shows_how_it_was_made_its_outcome_code_and_every_call(tmp_path: Path, capsys):
    db = tmp_path / "k.db"
    sid, parent, node = make_session(db)
    assert main(["show", str(sid), "--node", str(node), "--db", str(db)]) == 0
    shown = capsys.readouterr().out
    assert f"node {node}  session {sid}" in shown and "_softmax" in shown
    assert "proposer  llm (kernel-writer-1)" in shown
    assert "action    refine: a rewrite of a working parent" in shown
    assert f"parent    node {parent} (new, 1.40x over eager): one block per row" in shown
    assert "status    compile_error" in shown and "error: expected a ';'" in shown
    assert "1 | " + SOURCE in shown  # the source line the compiler log points at
    assert SOURCE in shown and '"kernel": "k"' in shown  # the kernel and its launch plan
    assert "language-model calls: 2, $0.0159" in shown
    assert "call 1: kernel-writer-1  0 prompt + 0 reply tokens  $0.0000  2.5 s" in shown
    assert "error: rate limited (429)" in shown
    assert "call 2: kernel-writer-1  1800 prompt + 700 reply tokens  $0.0159  41.0 s" in shown
    assert shown.count(PROMPT) == 2 and REPLY in shown


def test_a_working_node_shows_its_timings_and_profile(tmp_path: Path, capsys):
    db = tmp_path / "k.db"
    sid, parent, node = make_session(db)
    assert main(["show", str(sid), "--node", str(parent), "--db", str(db)]) == 0
    shown = capsys.readouterr().out
    assert ("time      device median 40.0 us, p10 39.0 us, p90 41.0 us (100 reps); "
            "host 6.0 us; wall 41.5 us") in shown
    assert "eager     device median 56.0 us, p10 55.0 us, p90 57.0 us (100 reps)" in shown
    assert "speedup   1.40x" in shown and "ptxas: k 32 registers/thread" in shown
    assert f"children  {node} (refine, compile_error)" in shown
    assert "none (the kernel library" in shown
    # the card's eager time names its source: the profile's, the evaluator never timed it alone
    assert (f"  eager     profile 50.0 us per call, torch.compile device -, physical floor -; "
            f"the card's best 1.40x over eager (node {parent})") in shown


def test_no_prompt_leaves_the_prompts_and_replies_out(tmp_path: Path, capsys):
    db = tmp_path / "k.db"
    sid, _, node = make_session(db)
    assert main(["show", str(sid), "--node", str(node), "--no-prompt", "--db", str(db)]) == 0
    shown = capsys.readouterr().out
    assert "1800 prompt + 700 reply tokens" in shown
    assert PROMPT not in shown and REPLY not in shown


def test_a_node_of_another_session_is_refused_in_one_line(tmp_path: Path, capsys):
    db = tmp_path / "k.db"
    sid, _, node = make_session(db)
    other, _, _ = make_session(db)
    assert main(["show", str(other), "--node", str(node), "--db", str(db)]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"kforge: no search node {node} in session {other} "
                   f"(`kforge show {other}` lists its op cards)"]
