"""The TUI's pure parts: the node model, event folding, the new-session form and the kforge
subprocess's JSON answer, GPU detection, key maps, diffs, themes and the CUDA highlight query."""

from __future__ import annotations

import re
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from tree_sitter import Parser, Query, QueryCursor

from kforge.core.candidate import Candidate
from kforge.core.settings import KeyBindings
from kforge.errors import KforgeError
from kforge.store import SessionStatus
from kforge.store.events import (
    CommandDone,
    Event,
    EventRecord,
    LogLine,
    NodeAdded,
    NodeDeleted,
    NodeFinished,
    NodePruned,
    SessionDeleted,
    SessionStatusChanged,
    UnknownEvent,
)
from kforge.store.records import NodeRow
from kforge_tui.config.keymap import unsendable, user_keymap
from kforge_tui.config.themes import SYNTAX_ROLES, load_themes, shipped_dir
from kforge_tui.diffing import candidate_diff, line_kind
from kforge_tui.follow import fold
from kforge_tui.highlight import (
    CAPTURE_ROLES,
    cuda_language,
    cuda_query,
    text_area_theme,
)
from kforge_tui.launch import (
    NewSession,
    failure_message,
    json_answer,
    parse_nvidia_smi,
    run_kforge,
    search_argv,
)
from kforge_tui.search_model import NodeFilter, SearchModel
from tests.tui.fixtures import KERNEL


def row(node_id: int, parent: int | None, status: str = "ok", speedup: float | None = 1.0,
        pruned: bool = False, card: int = 1) -> NodeRow:
    return NodeRow(id=node_id, session_id=1, card_id=card, parent_id=parent, action="refine",
                   status=status, meta={}, reward=None,
                   speedup=speedup if status == "ok" else None, median_us=None,
                   repairable=False, pruned=pruned, summary="", usd=0.0, created_at=0.0,
                   finished_at=None)


def test_model_keeps_visits_and_best_of_each_subtree_as_nodes_finish():
    model = SearchModel()
    model.load([row(1, None, speedup=1.2), row(2, 1, "evaluating"), row(3, 1, "mismatch"),
                row(4, None, speedup=0.9, card=2)])
    assert [n.id for n in model.children(1, None)] == [1]
    assert (model.nodes[1].visits, model.nodes[1].best) == (2, 1.2)
    assert model.upsert(row(2, 1, speedup=1.7)) is False  # finished, not new
    assert (model.nodes[1].visits, model.nodes[1].best) == (3, 1.7)
    assert model.upsert(row(5, 2, "proposing")) is True
    assert model.nodes[1].visits == 3  # in flight counts once it finishes
    model.remove(2)
    assert (model.nodes[1].visits, model.nodes[1].best) == (2, 1.2)
    assert 5 not in model.nodes and model.count(1) == 2


def test_model_filters_keep_the_path_to_each_match_and_pruning_covers_subtrees():
    model = SearchModel()
    model.load([row(1, None), row(2, 1, "compile_error"), row(3, 1), row(4, None),
                row(5, 4, pruned=True), row(6, 5)])
    assert model.visible(1, NodeFilter.FAILED) == {1, 2}
    assert [n.id for n in model.children(1, 1, NodeFilter.FAILED)] == [2]
    assert model.visible(1, NodeFilter.PRUNED) == {4, 5}
    assert model.pruned(6) and not model.pruned(4)
    assert model.visible(1, NodeFilter.IMPROVED) == set()  # all at 1.0x: none faster


def events(*records: EventRecord) -> list[Event]:
    return [Event(seq=seq, session_id=1, at=0.0, record=r) for seq, r in enumerate(records, 1)]


def test_a_confirming_node_reads_as_confirming_and_is_not_a_failure():
    from kforge_tui.format import ICON_CONFIRMING, node_label

    confirming = replace(row(5, None, speedup=2.0), status="confirming", speedup=2.0)
    label = node_label(confirming, visits=1, best=None, pruned=False)
    assert label.icon == ICON_CONFIRMING and "2.00x confirming" in label.text
    assert not NodeFilter.FAILED.matches(confirming)


def test_fold_turns_events_into_the_reads_that_catch_up():
    got = fold(events(NodeAdded(7, 1, None, "new"), NodeFinished(7, 1, "ok", 1.2),
                      NodeAdded(8, 1, 7, "refine"), NodeDeleted(8, 1),
                      LogLine("slow", level="warning"), CommandDone(1, "paused")))
    assert got.nodes == {7} and got.deleted == {8} and got.state
    assert got.log[0].endswith("WARNING: slow") and got.results == ["paused"]
    assert fold(events(SessionDeleted())).gone
    assert not fold(events(NodePruned(3, 1, True))).state
    assert fold(events(UnknownEvent("from_a_newer_kforge", {"x": 1}))).state


def test_a_search_that_ends_is_said_with_the_line_it_logged_last_even_a_poll_before():
    done = SessionStatusChanged(SessionStatus.DONE)
    whole = fold(events(LogLine("search done: no op left to search (3 done)"), done))
    assert whole.ended == ("done", "search done: no op left to search (3 done)")
    first = fold(events(LogLine("iteration budget spent")))  # the poll splits them
    assert fold(events(done), first.said).ended == ("done", "iteration budget spent")
    failed = SessionStatusChanged(SessionStatus.FAILED, error="proposer: no API key")
    assert fold(events(LogLine("node 7 confirmed"), failed)).ended == (
        "failed", "proposer: no API key")
    stopped = fold(events(LogLine("node 7 confirmed"), SessionStatusChanged("stopped")))
    assert stopped.ended == ("stopped", "")  # a stop logs no reason: none is made up
    assert fold(events(done, SessionStatusChanged("running"))).ended is None  # resumed since


def test_new_session_form_becomes_a_checked_kforge_command(tmp_path: Path):
    db = tmp_path / "k.db"
    argv = search_argv(NewSession("resnet50", "float16", "llm", "12", "2.5", "30m"), db)
    assert argv[:4] == [sys.executable, "-P", "-m", "kforge"]  # not the current folder's modules
    assert argv[4:] == ["search", "resnet50", "--db", str(db), "--detach", "--json",
                        "--dtype", "float16", "--proposer", "llm", "--iterations", "12",
                        "--usd", "2.5", "--time", "30m"]
    factory = tmp_path / "net.py"
    factory.write_text("def build(): ...\n")
    assert f"{factory}:build" in search_argv(NewSession(f"{factory}:build"), db)
    for bad, says in ((NewSession(""), "name a model"),
                      (NewSession("missing.py:build"), "is not a file"),
                      (NewSession("resnet50", iterations="lots"), "whole number"),
                      (NewSession("resnet50", usd="-1"), "usd .* of at least 0, not -1.0"),
                      (NewSession("resnet50", time="soon"), "duration"),
                      # `kforge search --help` would answer with its usage, not a session
                      (NewSession("--help"), "does not start with '-'")):
        with pytest.raises(KforgeError, match=says):
            search_argv(bad, db)


async def test_kforge_subprocess_streams_stderr_and_answers_with_stdout_json():
    seen: list[str] = []
    script = ("import sys; sys.stderr.write('profiling: 1/2\\nhalf\\r'); "
              "print('{\"session\": 7, \"status\": \"ready\"}')")
    answer = await run_kforge([sys.executable, "-c", script], seen.append)
    assert seen == ["profiling: 1/2", "half"]
    assert answer == {"session": 7, "status": "ready"}
    failing = ("import sys; sys.stderr.write('step\\nkforge: no GPU here\\n'); "
               "sys.exit(1)")
    with pytest.raises(KforgeError, match="^no GPU here$"):
        await run_kforge([sys.executable, "-c", failing], seen.append)
    assert failure_message(["boom"], 2) == "kforge exited with code 2: boom"


@pytest.mark.parametrize("stdout", ["", "stored as session 3\n", "[3]", '{"status": "ready"}',
                                    '{"session": "3"}', '{"session": 3}\n{"session": 4}'])
def test_an_answer_that_names_no_session_is_one_clear_error(stdout):
    with pytest.raises(KforgeError, match="^kforge answered without naming a session"):
        json_answer(stdout)


def test_gpu_detection_reads_nvidia_smi():
    two = "GPU 0: NVIDIA H200 (UUID: GPU-1)\nGPU 1: NVIDIA H200 (UUID: GPU-2)\n"
    assert parse_nvidia_smi(0, two).label == "NVIDIA H200 (+1)"
    failed = parse_nvidia_smi(9, "NVIDIA-SMI has failed because it couldn't communicate\n")
    assert not failed.present and "couldn't communicate" in failed.detail


def test_keymap_keeps_known_sendable_keys_only():
    keys = KeyBindings({"prune": "z", "diff": "ctrl+enter", "prnue": "a", "zzz": "b"})
    keymap, problems = user_keymap(keys, {"prune", "diff", "best"})
    assert keymap == {"prune": "z"}
    assert problems == ["[keys] diff: terminals cannot send ctrl+enter; pick another key",
                        ("[keys] prnue: no such binding (did you mean prune? press ? to see "
                         "the ids)"),
                        "[keys] zzz: no such binding (press ? to see the ids)"]
    assert unsendable("x,ctrl+shift+p") == "ctrl+shift+p" and unsendable("ctrl+p,G") is None


def test_diff_against_the_parent_and_against_nothing():
    parent = Candidate("a\nb\n", "launch()\n")
    child = Candidate("a\nc\n", "launch()\n")
    lines = candidate_diff(parent, child, "#1", "#2")
    assert lines[:3] == ["--- #1/kernel.cu", "+++ #2/kernel.cu", "@@ -1,2 +1,2 @@"]
    assert [line_kind(x) for x in lines[3:]] == ["context", "removed", "added"]
    assert sum(line.startswith("+") for line in candidate_diff(None, child, "-", "#2")) == 5


def test_shipped_themes_load_complete_and_user_files_add_or_fail_clearly(tmp_path: Path):
    user = tmp_path / "themes"
    user.mkdir()
    (user / "mine.toml").write_text('name = "mine"\nprimary = "#ff0000"\ndark = false\n'
                                    '[syntax]\nkeyword = "bold red"\n')
    (user / "broken.toml").write_text('name = "broken"\n')
    (user / "typo.toml").write_text('name = "typo"\nprimary = "#ff0000"\nprimery = "x"\n')
    specs, problems = load_themes([shipped_dir(), user])
    assert {"kforge-dark", "kforge-light", "kforge-ansi", "mine"} <= set(specs)
    for name in ("kforge-dark", "kforge-light", "kforge-ansi"):
        assert set(specs[name].syntax) == set(SYNTAX_ROLES), name  # every role styled
    assert specs["kforge-ansi"].theme.ansi
    assert specs["mine"].syntax["keyword"] == "bold red"
    assert specs["mine"].syntax["type"] == specs["kforge-light"].syntax["type"]
    assert len(problems) == 2 and any("needs a primary" in p for p in problems)
    assert any("unknown keys ['primery']" in p for p in problems)


def test_cuda_query_parses_and_styles_every_capture_it_makes():
    names = set(re.findall(r"@([a-z][a-z._]*)", cuda_query()))
    assert names <= set(CAPTURE_ROLES)
    specs, _ = load_themes([shipped_dir()])
    styles = text_area_theme(specs["kforge-dark"].syntax).syntax_styles
    assert names <= set(styles)
    language = cuda_language()
    tree = Parser(language).parse(KERNEL.encode())
    captures = QueryCursor(Query(language, cuda_query())).captures(tree.root_node)
    text = {name: {KERNEL.encode()[n.start_byte:n.end_byte].decode() for n in nodes}
            for name, nodes in captures.items()}
    assert {"__global__", "__shared__", "__restrict__", "__launch_bounds__"} <= text["keyword.cuda"]
    assert {"blockIdx", "threadIdx", "blockDim"} <= text["variable.builtin"]
    assert "__syncthreads" in text["function.cuda"] and "fmaxf" in text["function.call"]
    assert "__syncthreads" not in text["function.call"]
    assert "#include" in text["preprocessor"] and "TILE" in text["constant"]


def test_the_tui_never_imports_torch():
    import subprocess

    code = "import sys, kforge_tui.app; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, cwd=Path(__file__).resolve().parents[2])
    assert out.stdout.strip() == "False"
