"""Whatever a user types and whatever a database holds, `kforge` ends in one line on stderr and a
non-zero exit code, never a traceback; with --json, one object naming the error on stdout. And
`--version` / `--help` import no command module (no torch)."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kforge.cli.main import COMMANDS, main
from kforge.core.candidate import Candidate, EvalOutcome, EvalStatus
from kforge.store import SessionStatus, Store
from kforge.store.events import ModelMeasured
from tests.doubles import sample_cards, timing

REPO = Path(__file__).resolve().parents[2]
PROGRESS = re.compile(r"[a-z ()-]+: \d+/\d+")
FAKE_GPU = {"name": "Fake GPU", "arch": "sm_90"}
PROPOSER, EVALUATOR = "tests.doubles:make_proposer", "tests.doubles:make_evaluator"


def make_db(path: Path) -> None:
    """Session 1: op cards, one finished search node (node 1) and a whole-model measurement."""

    async def go() -> None:
        async with await Store.open(path) as store:
            sid = await store.create_profiled_session("toy", {}, FAKE_GPU, sample_cards())
            card = (await store.list_cards(sid))[0].id
            node = await store.add_node(sid, card, None, "new")
            await store.set_candidate(node, Candidate("__global__ void k() {}", {"launches": []}))
            await store.finish_node(node, EvalOutcome(EvalStatus.OK, "ok", speedup=1.5,
                                                      timing=timing(30.0)), 0.4,
                                    confirmed=True)  # the card's best, as confirmation leaves it
            await store.add_model_measurement(sid, ModelMeasured({"eager": 1.0}, {}, 1.1))

    asyncio.run(go())


def run(capsys: pytest.CaptureFixture, *argv: str) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def assert_one_line(code: int, err: str) -> str:
    """The one line that says what went wrong (after any progress lines, `stage: 0/1`)."""
    assert code != 0
    lines = [line for line in err.strip().splitlines() if not PROGRESS.fullmatch(line)]
    assert len(lines) == 1 and lines[0].startswith("kforge: "), err
    assert "Traceback" not in err
    return lines[0]


@pytest.fixture
def db(tmp_path: Path) -> Path:
    path = tmp_path / "k.db"
    make_db(path)
    return path


def model_file(tmp_path: Path, body: str) -> str:
    path = tmp_path / "model.py"
    path.write_text("import torch\n\n" + body)
    return f"{path}:build"


TO_RAISES = '''
class Stubborn(torch.nn.Module):
    def to(self, *args, **kwargs):
        raise TypeError("this model stays where it is")

def build():
    return Stubborn(), (torch.zeros(2),)
'''


@pytest.mark.parametrize("argv, said", [
    ([], "argument COMMAND: invalid choice"),
    (["frobnicate"], "invalid choice: 'frobnicate'"),
    (["show"], "show: the following arguments are required: session"),
    (["show", str(2**64)], "a session is named by its number (1 to 9223372036854775807)"),
    (["show", str(2**63)], "a session is named by its number"),
    (["show", "-1"], "a session is named by its number"),
    (["show", "1.5"], "a session is named by its number"),
    (["show", "1", "--node", str(2**64)],
     "must be a whole number from 1 to 9,223,372,036,854,775,807"),
    (["show", "9223372036854775807"], "no session 9223372036854775807"),
    (["show", "1", "--node", "99"], "no search node 99"),
    (["delete", "1"], "add --yes"),
    (["stop", "1"], "no search is running for session 1"),
    (["resume", "1", "--time", "1e999h"], "1e999h"),
    (["resume", "1", "--proposer", "builtins:len", "--evaluator", EVALUATOR],
     "the proposer factory builtins:len raised TypeError"),
    (["resume", "1", "--proposer", PROPOSER, "--evaluator", "builtins:id"],
     "the evaluator factory builtins:id returned int, which is no evaluator"),
    (["resume", "1", "--proposer", EVALUATOR,
      "--evaluator", EVALUATOR], "which is no proposer"),
    (["profile", "no-such-model", "--device", "cpu"], "no-such-model"),
    # an option only by its whole name: --jso would answer in JSON without saying so on failure
    (["profile", "no-such-model", "--jso"], "profile: unrecognized arguments: --jso (see "
                                            "`kforge profile --help`)"),
    (["search", "--ses", "1"], "search: unrecognized arguments: --ses"),
])
def test_bad_command_lines(db: Path, capsys, argv, said):
    code, out, err = run(capsys, *argv, "--db", str(db))
    assert said in assert_one_line(code, err)


@pytest.mark.parametrize("argv, said", [
    # the audit's: each was accepted
    (["resume", "1", "--parallel", "100000"],
     "argument --parallel: must be a whole number from 1 to 256, not '100000'"),
    (["resume", "1", "--time", "99999999999h"],
     "argument --time: must be a duration above 0 s and at most 366 days"),
    (["resume", "1", "--seed", "-1"],
     "argument --seed: must be a whole number from 0 to 4,294,967,295, not '-1'"),
    (["resume", "1", "--usd", "inf"], "argument --usd: must be a number from 0 to 1,000,000"),
    (["resume", "1", "--iterations", str(10**7)], "from 1 to 1,000,000"),
    (["resume", "1", "--top", "0"], "argument --top: must be a whole number from 1 to 100,000"),
    (["profile", "toy", "--batch", "100000"],
     "argument --batch: must be a whole number from 1 to 65,536"),
    (["profile", "toy", "--samples", "5000"], "argument --samples: must be a whole number from "
                                              "0 to 1,000"),
    (["profile", "toy", "--seq-lengths", "8,0"], "argument --seq-lengths: must be a whole "
                                                 "number from 1 to 16,777,216, not '0'"),
    (["e2e", "1", "--warmup", str(10**9)], "argument --warmup: must be a whole number from 1"),
    (["show", "1", "--top", "0"],
     "show: argument --top: must be a whole number from 1 to 100,000, not '0'"),
    (["show", "1", "--top", "all"], "argument --top: must be a whole number from 1 to 100,000"),
])
def test_a_number_out_of_its_stated_range_is_one_line(db: Path, capsys, argv, said):
    code, out, err = run(capsys, *argv, "--db", str(db))
    assert said in assert_one_line(code, err) and code == 2


@pytest.mark.parametrize("command", COMMANDS)
def test_every_numeric_option_states_a_range(command: str):
    """No option takes a bare int or float: each number has a range, and what lies outside it
    (a huge number, a negative one, nan) is refused by the option itself, saying the range."""
    import argparse

    from kforge.cli.main import build_parser

    parser = build_parser(command)
    (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    for action in sub.choices[command]._actions:
        assert action.type not in (int, float), f"{command} {action.option_strings}"
        if action.type is None or action.type in (str, Path):
            continue
        for text in ("9" * 30, "-1", "nan", "1e999"):
            with pytest.raises(argparse.ArgumentTypeError, match="from|number|duration|LO:HI"):
                action.type(text)


@pytest.mark.parametrize("where", ["long-name", "long-path"])
def test_over_long_database_paths(tmp_path: Path, capsys, where):
    path = (tmp_path / ("x" * 300) / "k.db" if where == "long-name"
            else Path("/" + "/".join(["d" * 200] * 30)) / "k.db")
    for argv in (["sessions"], ["show", "1"], ["profile", "nothing", "--device", "cpu"]):
        line = assert_one_line(*run(capsys, *argv, "--db", str(path))[::2])
        assert len(line) < 400


@pytest.mark.parametrize("source, said", [
    (os.devnull, "is not a regular file (a pipe, socket or device), not a CUDA source file"),
    ("long.cu", "holds more than 1048576 characters: too long to be a CUDA source"),
])
def test_a_kernel_source_that_is_a_device_or_too_long_is_one_line(db: Path, tmp_path: Path,
                                                                   capsys, source, said):
    """A device as --source (/dev/zero) was read to its end that never comes."""
    (tmp_path / "long.cu").write_text("//" * (1 << 20))
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"outputs": [{"name": "out", "like": "self"}], "launches": []}))
    code, out, err = run(capsys, "add-kernel", "1", "--card", "1", "--source",
                         str(tmp_path / source), "--plan", str(plan), "--db", str(db))
    assert said in assert_one_line(code, err)


@pytest.mark.parametrize("command", [["sessions"], ["show", "1"], ["stop", "1"]])
def test_a_database_path_that_is_a_pipe_or_a_device_is_one_line(tmp_path: Path, command):
    """SQLite fails on a pipe or a device inside aiosqlite's thread, which then answered the
    closed event loop with a traceback: such a path is refused before."""
    fifo = tmp_path / "k.db"
    os.mkfifo(fifo)
    for path in (fifo, Path(os.devnull)):
        proc = kforge_process("-m", "kforge", *command, "--db", str(path))
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 1 and err == (f"kforge: {path} is not a regular file (a pipe, "
                                                "socket or device), not a kforge database "
                                                "file\n"), err


def test_a_model_whose_to_raises_type_error(tmp_path: Path, capsys):
    spec = model_file(tmp_path, TO_RAISES)
    code, _, err = run(capsys, "profile", spec, "--device", "cpu", "--db", str(tmp_path / "k.db"))
    assert "cannot move" in assert_one_line(code, err) and "stays where it is" in err


@pytest.mark.parametrize("method, said", [
    ("def eval(self):\n        raise TypeError('not now')", "its eval() raised TypeError: not now"),
    ("def parameters(self, recurse=True):\n        raise RuntimeError('none here')",
     "its parameters() raised RuntimeError: none here"),
])
def test_a_model_whose_own_methods_raise(tmp_path: Path, capsys, method: str, said: str):
    spec = model_file(tmp_path, f"""
class Odd(torch.nn.Module):
    def forward(self, x):
        return x + 1

    {method}

def build():
    return Odd(), (torch.zeros(2),)
""")
    code, _, err = run(capsys, "profile", spec, "--device", "cpu", "--db", str(tmp_path / "k.db"))
    assert said in assert_one_line(code, err)


PLUGINS = """
import sys

raise_at_import = None

def exits(ctx):
    sys.exit(0)

def generator_exit(ctx):
    raise GeneratorExit("done")
"""


@pytest.mark.parametrize("spec, said", [
    ("kf_plugins:exits", "the proposer factory kf_plugins:exits raised SystemExit: 0"),
    ("kf_plugins:generator_exit", "raised GeneratorExit: done"),
    ("kf_broken:make", "importing it raised RuntimeError: broken at import"),
    ("..:make", "cannot import '..'"),
])
def test_plugins_that_exit_or_fail_to_import(db: Path, tmp_path: Path, monkeypatch, capsys, spec,
                                             said):
    (tmp_path / "kf_plugins.py").write_text(PLUGINS)
    (tmp_path / "kf_broken.py").write_text("raise RuntimeError('broken at import')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    code, out, err = run(capsys, "resume", "1", "--proposer", spec, "--evaluator", EVALUATOR,
                         "--json", "--db", str(db))
    line = assert_one_line(code, err)
    assert said in line and json.loads(out) == {"error": line.removeprefix("kforge: ")}


def test_a_plugin_that_exits_mid_search_is_no_success(db: Path, tmp_path: Path, monkeypatch,
                                                      capsys):
    """sys.exit() in a proposer's propose (run by the engine, not a factory) ends the command in
    one line and a failure, never a silent exit 0."""
    (tmp_path / "kf_exits.py").write_text(
        "from tests.doubles import FakeProposer\n\nclass Exits(FakeProposer):\n"
        "    async def propose(self, request):\n        raise SystemExit(0)\n\n"
        "def make(ctx):\n    return Exits()\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    code, out, err = run(capsys, "resume", "1", "--proposer", "kf_exits:make", "--evaluator",
                         EVALUATOR, "--iterations", "8", "--quiet", "--json", "--db", str(db))
    line = assert_one_line(code, err)
    assert "sys.exit(0)" in line and json.loads(out)["error"] == line.removeprefix("kforge: ")


def test_a_search_tree_that_does_not_link_up_stops_a_resume_in_one_line(db: Path, capsys):
    with sqlite3.connect(db) as raw:  # node 1's parent is gone (no foreign keys outside kforge)
        raw.execute("UPDATE nodes SET parent_id = 999 WHERE id = 1")
    code, out, err = run(capsys, "resume", "1", "--proposer", PROPOSER, "--evaluator", EVALUATOR,
                         "--quiet", "--db", str(db))
    assert "kforge: the search tree of op card 1 in the database cannot be read (parent 999 " \
           "does not exist)" in assert_one_line(code, err)


@pytest.mark.parametrize("status", ["evaluating", "confirming"])
def test_a_node_in_flight_without_its_kernel_stops_a_resume_in_one_line(db: Path, capsys,
                                                                        status: str):
    """A resume evaluates or confirms again the nodes a stop left in flight: one whose kernel is
    gone is a damaged row, named."""
    with sqlite3.connect(db) as raw:
        raw.execute("UPDATE nodes SET status = ?, source = NULL WHERE id = 1", (status,))
    code, out, err = run(capsys, "resume", "1", "--proposer", PROPOSER, "--evaluator", EVALUATOR,
                         "--quiet", "--db", str(db))
    line = assert_one_line(code, err)
    assert "kforge: search node 1 in the database cannot be read (it was being" in line \
        and "holds no kernel" in line


@pytest.mark.parametrize("content, said", [
    (b"\xff\xfe[search]\n", "is not UTF-8 text"),
    (b"[search\n", "is not valid TOML"),
    (b"x = " + b"[" * 50_000 + b"]" * 50_000 + b"\n", "nests its arrays or tables too deeply"),
    ("folder", "is a folder, not a config file"),
    # reading one would wait for a writer forever
    ("pipe", "is not a regular file (a pipe, socket or device), not a config file"),
])
def test_unreadable_config_files(db: Path, _isolated_kforge_dirs: Path, capsys, content, said):
    config = _isolated_kforge_dirs / "config.toml"
    if content == "folder":
        config.mkdir()
    elif content == "pipe":
        os.mkfifo(config)
    else:
        config.write_bytes(content)
    line = assert_one_line(*run(capsys, "resume", "1", "--db", str(db))[::2])
    assert said in line and str(config) in line


# An outcome whose facts hold a figure that is not a number: read leniently, the fact is dropped.
SHOWN_BADLY = json.dumps({"status": "ok", "timing": timing(30.0).__dict__,
                          "extra": {"host_us": "fast", "eager_host_us": 5.0}})
NOT_A_SPEEDUP = json.dumps({"status": "ok", "timing": timing(30.0).__dict__, "speedup": "fast"})
INFINITE_TIME = json.dumps({"status": "ok", "timing": {**timing(30.0).__dict__,
                                                       "median_us": float("inf")}})
NO_TIME = json.dumps({"speedups": {"eager": 1.0}, "gains": {}, "projected": 1.1,
                      "times_us": {"eager": 30.0, "eager+kforge": 0.0}})
DAMAGE = [  # (table, column, value stored, where the row is read, what the error names)
    ("sessions", "gpu", "{not json", ["sessions"], "session 1 "),
    ("sessions", "gpu", "[1, 2]", ["show", "1"], "session 1 "),
    ("sessions", "settings", '"text"', ["show", "1"], "session 1 "),
    ("sessions", "usd_spent", "lots", ["sessions"], "session 1 "),
    ("sessions", "created_at", b"\x00\x01", ["sessions"], "session 1 "),
    ("sessions", "status", b"\x00", ["show", "1"], "session 1 "),
    ("op_cards", "args", '{"a": 1}', ["show", "1"], "op card 1 "),
    ("op_cards", "args", '[{"t": "tensor"}]', ["show", "1"], "op card 1 "),
    ("op_cards", "region", '"a region"', ["show", "1"], "op card 1 "),
    ("op_cards", "best_speedup", "fast", ["sessions"], "the op cards of session 1 "),
    ("op_cards", "calls", 2.5, ["show", "1"], "op card 1 "),
    ("op_cards", "baseline", '{"eager": {}}', ["show", "1"], "op card 1 "),
    ("op_cards", "share", float("inf"), ["resume", "1", "--proposer", PROPOSER, "--evaluator",
                                         EVALUATOR, "--quiet"], "op card 1 "),
    ("sessions", "usd_spent", float("-inf"), ["sessions"], "session 1 "),
    ("nodes", "created_at", 2**63 - 1, ["show", "1", "--node", "1"], "search node 1 "),
    ("sessions", "heartbeat_at", -5.0, ["sessions"], "session 1 "),
    ("op_cards", "baseline", '{"eager": {}}', ["resume", "1", "--proposer", PROPOSER,
                                              "--evaluator", EVALUATOR, "--quiet"],
     "op card 1 "),
    ("nodes", "meta", "{", ["show", "1", "--node", "1"], "search node 1 "),
    ("nodes", "speedup", "x", ["show", "1", "--node", "1"], "search node 1 "),
    ("evaluations", "outcome", '{"status": "nonsense"}', ["show", "1", "--node", "1"],
     "the evaluation of search node 1 "),
    ("evaluations", "outcome", "not json", ["show", "1"], "the evaluation of search node 1 "),
    ("events", "data", "[", ["show", "1"], "event "),
    ("sessions", "settings", '{"search": 5}', ["show", "1"], "session 1 "),
    ("sessions", "gpu", '{"name": "G", "arch": 90}', ["sessions"], "session 1 "),
    ("nodes", "action", "sideways", ["show", "1", "--node", "1"], "search node 1 "),
    ("nodes", "parent_id", 999, ["show", "1", "--node", "1"], "search node 1 "),
    # figures the decisions and the headline compute with: no text, no infinity, no zero time
    ("evaluations", "outcome", NOT_A_SPEEDUP, ["apply", "1"], "the evaluation of search node 1 "),
    ("evaluations", "outcome", INFINITE_TIME, ["show", "1", "--node", "1"],
     "the evaluation of search node 1 "),
    ("events", "data", NO_TIME, ["show", "1"], "event "),
]


@pytest.mark.parametrize("table, column, value, argv, what", DAMAGE)
def test_damaged_rows_are_one_clear_line(db: Path, capsys, table, column, value, argv, what):
    with sqlite3.connect(db) as raw:
        where = "kind = 'model_measured'" if table == "events" else "1"
        raw.execute(f"UPDATE {table} SET {column} = ? WHERE {where}", (value,))
    line = assert_one_line(*run(capsys, *argv, "--db", str(db))[::2])
    assert f"kforge: {what}" in line and "in the database cannot be read" in line


def test_a_damaged_fact_of_a_stored_outcome_is_dropped_and_said(db: Path, capsys):
    with sqlite3.connect(db) as raw:
        raw.execute("UPDATE evaluations SET outcome = ? WHERE 1", (SHOWN_BADLY,))
    code, out, err = run(capsys, "show", "1", "--node", "1", "--db", str(db))
    assert code == 0 and "Traceback" not in err
    assert 'dropped from the stored row:\nhost.host_us is "fast", not a finite number' in out
    assert "patched   host time" not in out
    code, out, err = run(capsys, "show", "1", "--db", str(db))
    assert code == 0 and "Traceback" not in err


@pytest.mark.parametrize("argv", [
    ["profile", "no-such-model", "--device", "cpu", "--json"],
    ["search", "--session", "5", "--json"],
    ["resume", "1", "--json", "--patience", "0"],
    ["profile", "--json", "--no-such-option"],
    ["search", "--session", str(2**64), "--json"],
])
def test_json_failures_answer_one_object_with_the_error(db: Path, capsys, argv):
    code, out, err = run(capsys, *argv, "--db", str(db))
    line = assert_one_line(code, err)
    assert json.loads(out) == {"error": line.removeprefix("kforge: ")}


WORDS = ["sessions", "show", "delete", "stop", "resume", "apply", "add-kernel", "1",
         "0", "-1", "99", str(2**64), "nan", "é", "--node", "--card", "--yes", "--json",
         "--targets", "--run", "--iterations", "--top", "--time", "--focus", "--source", "-v",
         "--", "x"]


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.sampled_from(WORDS), max_size=6))
def test_any_command_line_is_an_answer_or_one_line(db: Path, capsys, argv: list[str]):
    try:
        code, out, err = run(capsys, *argv, "--db", str(db))
    except SystemExit as exit_:  # --help
        assert exit_.code == 0
        return
    if code:
        line = assert_one_line(code, err)
        if "--json" in argv[:argv.index("--")] if "--" in argv else "--json" in argv:
            assert json.loads(out) == {"error": line.removeprefix("kforge: ")}
    assert "Traceback" not in err


def kforge_process(*argv: str, **options) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(REPO), **options.pop("env", {})}
    return subprocess.Popen([sys.executable, *argv], cwd=REPO, text=True, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, **options)


@pytest.mark.parametrize("flag", ["--version", "--help"])
def test_version_and_help_import_no_command_module(flag: str):
    probe = ("import sys\nfrom kforge.cli.main import main\ntry:\n    main([%r])\n"
             "except SystemExit:\n    pass\nprint(sorted(m for m in sys.modules if "
             "m.startswith(('torch', 'kforge.cli.cmd_', 'kforge.store', 'rich'))))" % flag)
    out, _ = kforge_process("-c", probe).communicate(timeout=60)
    assert out.strip().splitlines()[-1] == "[]"


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_a_commands_help_imports_no_torch(command: str):
    """`kforge COMMAND --help` needs only the command's arguments: its module defers what brings
    in torch (seconds) to the command's own run."""
    probe = ("import sys\nfrom kforge.cli.main import main\ntry:\n    main([%r, '--help'])\n"
             "except SystemExit:\n    pass\nprint(sorted(m for m in sys.modules if "
             "m.split('.')[0] in ('torch', 'numpy')))" % command)
    out, _ = kforge_process("-c", probe).communicate(timeout=60)
    assert out.strip().splitlines()[-1] == "[]"


def test_a_plugin_bug_in_a_foreground_search_is_one_line(db: Path, tmp_path: Path):
    """An evaluator whose start() raises fails the search in one line; its traceback is for
    --verbose (and a detached search's log file, which runs verbose)."""
    (tmp_path / "kf_starts.py").write_text(
        "from tests.doubles import FakeEvaluator\n\nclass NoStart(FakeEvaluator):\n"
        "    async def start(self):\n        raise OSError('no workers')\n\n"
        "def make(ctx):\n    return NoStart()\n")
    argv = ["-m", "kforge", "resume", "1", "--proposer", PROPOSER, "--evaluator", "kf_starts:make",
            "--quiet", "--db", str(db)]
    env = {"PYTHONPATH": f"{REPO}{os.pathsep}{tmp_path}"}
    proc = kforge_process(*argv, env=env)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 1 and err == "kforge: OSError: no workers\n", err
    proc = kforge_process(*argv[:2], "--verbose", *argv[2:], env=env)
    out, err = proc.communicate(timeout=120)
    assert "Traceback" in err and "raise OSError('no workers')" in err


def test_ctrl_c_while_the_command_line_itself_is_imported_is_one_line(db: Path):
    """SIGINT while kforge.cli.main and what it needs (argparse, json, ...) are still loading,
    before its own error handling exists: still kforge's one line."""
    proc = kforge_process("-X", "importtime", "-m", "kforge", "stop", "1", "--db", str(db))
    said = []
    for line in proc.stderr:
        said.append(line)
        if re.search(r"\|\s+argparse$", line.rstrip()):
            proc.send_signal(signal.SIGINT)
            break
    rest, tail = proc.communicate(timeout=60)
    said += tail.splitlines(keepends=True)
    lines = [line for line in said if not line.startswith("import time:")]
    assert proc.returncode == 130 and lines == ["kforge: interrupted\n"], "".join(lines)


@pytest.mark.parametrize("argv", [["show", "1"], ["sessions"], ["show", "1", "--node", "1"]])
def test_a_reader_that_leaves_early_ends_the_command_quietly(db: Path, argv: list[str]):
    """`kforge show 1 | head -1`: once the reader has gone, nothing more is said, on either
    stream, and the exit code is 1."""
    proc = kforge_process("-m", "kforge", *argv, "--db", str(db))
    proc.stdout.close()
    err = proc.stderr.read()
    assert proc.wait(timeout=120) == 1 and err == ""


def test_a_terminal_that_cannot_write_every_character(db: Path):
    """Under an ASCII locale, the rules of a node's view (─) are written as escapes, not an
    error."""
    proc = kforge_process("-m", "kforge", "show", "1", "--node", "1", "--db", str(db),
                          env={"PYTHONIOENCODING": "ascii"})
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0 and err == "" and "\\u2500" in out


def test_ctrl_c_while_torch_is_imported_is_one_line(db: Path):
    """SIGINT in the seconds a command spends importing torch: kforge says it was interrupted.
    Python reports each import as it ends (-X importtime): the signal goes once torch's own
    modules are being imported."""
    proc = kforge_process("-X", "importtime", "-m", "kforge", "show", "1", "--node", "1", "--db",
                          str(db))
    said = []
    for line in proc.stderr:
        said.append(line)
        if re.search(r"\|\s+torch(\.|$)", line.rstrip()):
            proc.send_signal(signal.SIGINT)
            break
    rest, tail = proc.communicate(timeout=60)
    said += tail.splitlines(keepends=True)
    assert proc.returncode == 130
    lines = [line for line in said if not line.startswith("import time:")]
    assert lines == ["kforge: interrupted\n"], "".join(lines)
    assert rest == ""


@pytest.mark.parametrize("engine", ["killed here", "silent on another host"])
def test_sessions_shows_a_dead_engine_as_gone(db: Path, capsys, engine: str):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()

    async def claim() -> None:
        async with await Store.open(db) as store:
            if engine == "killed here":
                await store.claim_engine(1, pid=dead.pid)
            else:
                await store.claim_engine(1, pid=4242, host="another-host")
            await store.set_session_status(1, SessionStatus.RUNNING)

    asyncio.run(claim())
    with sqlite3.connect(db) as raw:  # its last heartbeat, a minute ago
        raw.execute("UPDATE sessions SET heartbeat_at = heartbeat_at - 60")
    code, out, _ = run(capsys, "sessions", "--db", str(db))
    assert code == 0 and "engine gone" in out and "running" not in out
    code, out, _ = run(capsys, "show", "1", "--db", str(db))
    assert code == 0 and "[engine gone]" in out


def test_the_model_list_answers_json_too(capsys):
    code, out, _ = run(capsys, "profile", "--list", "--json")
    assert code == 0 and json.loads(out)["models"]["gemma4-tiny"].startswith("tiny gemma4")
