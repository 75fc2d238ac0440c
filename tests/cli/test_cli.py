"""The `kforge` command line: listings, a search through test doubles, detach/stop, the --json
answers programs read, bad input."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from kforge.cli.main import main
from kforge.store import SessionStatus, Store
from tests.doubles import sample_cards

REPO = Path(__file__).resolve().parents[2]
DOUBLES = ["--proposer", "tests.doubles:make_proposer",
           "--evaluator", "tests.doubles:make_evaluator"]


def make_db(path: Path, settings: dict | None = None) -> int:
    async def go() -> int:
        store = await Store.open(path)
        try:
            return await store.create_profiled_session(
                "toy", settings or {}, {"name": "Fake GPU", "arch": "sm_90"}, sample_cards())
        finally:
            await store.close()

    return asyncio.run(go())


def kforge(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-m", "kforge", *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=120)


def one_error_line(result) -> str:
    assert result.returncode != 0
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("kforge: ")
    return lines[0]


def test_sessions_without_a_database_creates_nothing(tmp_path: Path, capsys):
    db = tmp_path / "k.db"
    assert main(["sessions", "--db", str(db)]) == 0
    assert "no sessions yet" in capsys.readouterr().out
    assert not db.exists()


def test_search_through_doubles_then_show_and_sessions(tmp_path: Path, capsys):
    db = tmp_path / "k.db"
    sid = make_db(db)
    assert main(["search", "--session", str(sid), "--db", str(db), "--iterations", "3",
                 "--quiet", *DOUBLES]) == 0
    assert main(["show", str(sid), "--db", str(db)]) == 0
    shown = capsys.readouterr().out
    assert "_softmax" in shown and "f16[8,1024], -1, False" in shown
    assert "view" in shown  # views are listed, not searched
    assert "6.0 us vs 5.5 us" in shown  # the best kernel's host cost beside eager's
    assert main(["sessions", "--db", str(db)]) == 0
    listed = capsys.readouterr().out
    assert "toy" in listed and "done" in listed and "Fake GPU (sm_90)" in listed


def test_show_says_which_would_be_best_is_still_confirming(tmp_path: Path, capsys):
    from kforge.core.candidate import Candidate, EvalOutcome, EvalStatus
    from kforge.core.mcts import Action
    from tests.doubles import FAKE_PLAN, timing

    db = tmp_path / "k.db"
    sid = make_db(db)

    async def go() -> tuple[int, int]:
        async with await Store.open(db) as store:
            card = (await store.list_cards(sid))[0]
            node = await store.add_node(sid, card.id, None, Action.NEW)
            await store.set_candidate(node, Candidate("// k", plan=FAKE_PLAN))
            await store.finish_node(node, EvalOutcome(EvalStatus.OK, timing=timing(50.0),
                                                      eager=timing(100.0), speedup=2.0),
                                    0.69, confirming=True)
            return card.id, node

    card_id, node = asyncio.run(go())
    assert main(["show", str(sid), "--db", str(db)]) == 0
    shown = capsys.readouterr().out
    assert f"confirming node {node} (2.00x over eager)" in shown
    assert main(["show", str(sid), "--node", str(node), "--db", str(db)]) == 0
    assert "confirming: a would-be best" in capsys.readouterr().out


def make_region_db(path: Path) -> int:
    """A session of the sample cards under a fusion region of add then softmax (90% of the
    time), which the table lists first with their op cards under it."""
    from kforge.core.opcard import OpCard

    softmax, add, relu, view = sample_cards()
    ref = {"t": "ref", "v": "x0"}
    region = OpCard(op="kforge_region.r_0123456789ab.default", args=[add.args[0], add.args[1]],
                    calls=30, total_us=900.0, share=0.9,
                    region={"nodes": [{"op": "aten.add.Tensor", "args": [ref, {"t": "ref",
                                                                               "v": "x1"}],
                                       "kwargs": {}},
                                      {"op": "aten._softmax.default",
                                       "args": [{"t": "ref", "v": "n0"}, -1, False],
                                       "kwargs": {}}],
                            "inputs": add.args, "outputs": ["n1"],
                            "members": sorted([softmax.key, add.key])})

    async def go() -> int:
        async with await Store.open(path) as store:
            return await store.create_profiled_session(
                "toy", {}, {"name": "Fake GPU", "arch": "sm_90"},
                [region, softmax, add, relu, view])

    return asyncio.run(go())


def test_show_folds_the_op_cards_of_a_region_under_it(tmp_path: Path, capsys):
    db = tmp_path / "k.db"
    sid = make_region_db(db)
    assert main(["show", str(sid), "--db", str(db)]) == 0
    lines = capsys.readouterr().out.splitlines()
    rows = [line for line in lines if "region(add,_softmax)" in line or "_softmax" in line
            or " add " in line or "relu" in line]
    assert "region(add,_softmax)" in rows[0]
    assert sum("└ _softmax" in r for r in rows) == 1 and sum("└ add" in r for r in rows) == 1
    assert not any("_softmax" in r and "└" not in r and "region" not in r for r in rows)
    assert "inside the fusion region above it" in "\n".join(lines)


@pytest.mark.parametrize("make, options, ops, rest", [
    (make_db, ["--top", "2"], ["_softmax", "add"], "2 more op cards (10.0% of the time)"),
    (make_region_db, ["--top", "1"], ["region(add,_softmax)", "└ add", "└ _softmax"],
     "2 more op cards (10.0% of the time)"),
    (make_region_db, ["--top", "2", "--targets"],
     ["region(add,_softmax)", "└ add", "└ _softmax", "relu"], None),
    (make_db, ["--top", "2", "--targets"], ["_softmax", "add"], "1 more op card (5.0% of the "
                                                                "time)"),
], ids=["cards", "a region with its op cards", "all there is", "targets"])
def test_show_top_lists_the_first_cards_and_a_line_on_the_rest(tmp_path: Path, capsys, make,
                                                                options, ops, rest):
    db = tmp_path / "k.db"
    sid = make(db)
    assert main(["show", str(sid), "--db", str(db), *options]) == 0
    lines = capsys.readouterr().out.splitlines()
    head = next(i for i, line in enumerate(lines) if line.lstrip().startswith("card "))
    rows = lines[head + 1:head + 1 + len(ops)]
    assert all(f" {op} " in row for op, row in zip(ops, rows, strict=True))
    assert [line for line in lines if "..." in line] == ([f"  ... {rest}"] if rest else [])
    assert not rest or lines[head + 1 + len(ops)] == f"  ... {rest}"  # right under the table


def test_search_settings_persist_for_resume(tmp_path: Path):
    db = tmp_path / "k.db"
    sid = make_db(db)
    assert main(["search", "--session", str(sid), "--db", str(db), "--iterations", "1",
                 "--usd", "2.5", "--quiet", *DOUBLES]) == 0
    assert main(["resume", str(sid), "--db", str(db), "--quiet", "--iterations", "2",
                 "--trust-plugins"]) == 0

    async def check():
        store = await Store.open(db)
        try:
            session = await store.get_session(sid)
            return session.settings["search"], len(await store.list_nodes(sid))
        finally:
            await store.close()

    search, nodes = asyncio.run(check())
    assert search["usd"] == 2.5 and search["proposer"] == "tests.doubles:make_proposer"
    assert search["iterations_per_op"] == 2 and nodes == 6


@pytest.mark.parametrize("args, message", [
    (["show", "42"], "no session 42"),
    (["resume", "42"], "no session 42"),
    (["stop", "1"], "no search is running for session 1"),
    (["search", "--session", "1", "--time", "soon"], "cannot read 'soon' as a duration"),
    (["search", "--session", "1", "--proposer", "nosuch.module:f"], "cannot import"),
    (["search", "--session", "1", "--iterations", "0"], "from 1 to 1,000,000"),
    (["search", "--session", "1", "--usd", "nan"],
     "argument --usd: must be a number from 0 to 1,000,000, not 'nan'"),
    (["resume", "1", "--patience", "0"],
     "argument --patience: must be a whole number from 1 to 1,000,000, not '0'"),
    (["resume", "1", "--focus", "99", *DOUBLES], "session 1 has no op card 99 to focus on"),
    (["resume", "1", "--proposer", "llm", "--evaluator", "tests.doubles:make_evaluator"],
     "no LLM endpoint is configured"),
    (["resume", "1", "--top", "2", "--proposer", "library", "--evaluator", "gpu"],
     "no CUDA GPU"),
])
def test_bad_input_gives_one_clear_line_and_changes_nothing(tmp_path: Path, args, message):
    db = tmp_path / "k.db"
    make_db(db)
    digest = hashlib.sha256(db.read_bytes()).hexdigest()
    result = kforge(*args, "--db", str(db))
    assert message in one_error_line(result)
    assert hashlib.sha256(db.read_bytes()).hexdigest() == digest


def test_a_config_file_with_an_unknown_key_is_one_clear_line(tmp_path: Path,
                                                             _isolated_kforge_dirs: Path):
    db = tmp_path / "k.db"
    make_db(db)
    config = _isolated_kforge_dirs / "config.toml"
    config.write_text("[search]\npatiense = 3\n")
    assert one_error_line(kforge("resume", "1", "--db", str(db))) == (
        f"kforge: unknown setting [search] patiense in {config} (did you mean patience?)")


def test_config_values_fill_only_what_the_session_and_command_line_leave_out(
        tmp_path: Path, _isolated_kforge_dirs: Path):
    db = tmp_path / "k.db"
    sid = make_db(db, {"search": {"patience": 7}})
    (_isolated_kforge_dirs / "config.toml").write_text(
        "[search]\npatience = 3\nseed = 5\nusd = 1.0\n\n[eval]\ntimeout_s = 20\n")
    assert main(["search", "--session", str(sid), "--db", str(db), "--iterations", "1",
                 "--usd", "2", "--quiet", *DOUBLES]) == 0

    async def stored() -> dict:
        async with await Store.open(db) as store:
            return (await store.get_session(sid)).settings

    settings = asyncio.run(stored())
    assert (settings["search"]["patience"], settings["search"]["seed"],
            settings["search"]["usd"]) == (7, 5, 2.0)
    assert settings["eval"]["timeout_s"] == 20.0


def test_an_older_sessions_stored_settings_still_resume_with_a_warning(tmp_path: Path):
    db = tmp_path / "k.db"
    sid = make_db(db, {"search": {"proposer": "tests.doubles:make_proposer",
                                  "evaluator": "tests.doubles:make_evaluator",
                                  "iterations_per_op": 1, "retired_knob": True, "patience": 0}})
    assert main(["resume", str(sid), "--db", str(db), "--quiet", "--trust-plugins"]) == 0

    async def check() -> tuple[dict, list[str]]:
        async with await Store.open(db) as store:
            search = (await store.get_session(sid)).settings["search"]
            return search, [e.record.message for e in await store.recent_logs(sid)]

    search, logs = asyncio.run(check())
    assert "retired_knob" not in search and search["patience"] == 12
    assert ("ignored unknown setting [search] retired_knob in the stored settings of "
            f"session {sid}") in logs
    assert any(line.startswith("ignored [search] patience") for line in logs)


def test_corrupt_database_file_is_reported_and_untouched(tmp_path: Path):
    db = tmp_path / "k.db"
    db.write_bytes(b"\x00garbage" * 512)
    before = db.read_bytes()
    assert "corrupt" in one_error_line(kforge("show", "1", "--db", str(db)))
    assert "corrupt" in one_error_line(kforge("sessions", "--db", str(db)))
    assert db.read_bytes() == before


def test_database_path_that_is_a_folder(tmp_path: Path):
    assert "is a folder" in one_error_line(kforge("sessions", "--db", str(tmp_path)))


def test_detached_search_survives_and_stops_on_command(tmp_path: Path):
    db = tmp_path / "k.db"
    sid = make_db(db, {"fake": {"delay_s": 0.05}})
    # A patience no search of 500 iterations reaches: the engine must still be running when
    # `stop` arrives, however quickly the fake kernels stop improving.
    started = kforge("search", "--session", str(sid), "--db", str(db), "--iterations", "500",
                     "--patience", "1000", "--detach", "--json", *DOUBLES)
    assert started.returncode == 0, started.stderr
    answer = json.loads(started.stdout)  # the one JSON object, nothing else
    log = db.parent / "logs" / f"session-{sid}.log"
    assert answer["session"] == sid and answer["model"] == "toy" and answer["detached"]
    assert answer["log"] == str(log) and answer["engine_pid"] > 0
    assert "searching in the background" in started.stderr  # the human report

    async def status() -> tuple[str, int, int | None]:
        store = await Store.open(db, create=False)
        try:
            s = await store.get_session(sid)
            return s.status, len(await store.list_nodes(sid)), s.engine_pid
        finally:
            await store.close()

    deadline = time.monotonic() + 60
    while asyncio.run(status())[1] < 3:
        assert time.monotonic() < deadline, (db.parent / "logs").glob("*")
        time.sleep(0.1)
    stop = kforge("stop", str(sid), "--db", str(db))
    assert stop.returncode == 0 and "asked the engine" in stop.stderr
    while asyncio.run(status())[0] != SessionStatus.STOPPED:
        assert time.monotonic() < deadline
        time.sleep(0.1)
    assert asyncio.run(status())[2] is None
    assert log.exists()


def test_search_json_is_one_object_on_stdout(tmp_path: Path, capsys):
    db = tmp_path / "k.db"
    sid = make_db(db)
    assert main(["search", "--session", str(sid), "--db", str(db), "--iterations", "2",
                 "--json", *DOUBLES]) == 0
    captured = capsys.readouterr()
    answer = json.loads(captured.out)
    assert answer.keys() == {"session", "model", "status", "error", "cards", "targets",
                             "best_speedup", "speedup_of", "usd_spent", "confirming",
                             "detached"}
    assert answer["confirming"] == []  # the search ended with every winner confirmed
    assert (answer["session"], answer["model"], answer["status"]) == (sid, "toy", "done")
    assert (answer["cards"], answer["targets"], answer["error"]) == (4, 3, None)
    assert answer["detached"] is False
    assert f"session {sid}: done" in captured.err  # the human line, moved off stdout


def test_profile_json_names_the_new_session_and_its_cards(tmp_path: Path, capsys):
    db = tmp_path / "k.db"
    toy = REPO / "tests" / "capture" / "capture_toy.py"
    assert main(["profile", f"{toy}:build", "--device", "cpu", "--samples", "1",
                 "--db", str(db), "--json"]) == 0
    captured = capsys.readouterr()
    answer = json.loads(captured.out)
    assert (answer["session"], answer["status"]) == (1, "ready")
    assert answer["model"].endswith("capture_toy.py:build")
    assert answer["cards"] >= answer["targets"] >= 1 and answer["samples"] >= 1
    assert "stored as session 1" in captured.err
    # the table's times are the profile's, not the evaluator's eager device time
    assert "profile us" in captured.err and "eager us" not in captured.err


def test_a_failing_json_command_prints_one_object_naming_the_error(tmp_path: Path):
    db = tmp_path / "k.db"
    make_db(db)
    result = kforge("search", "--session", "9", "--db", str(db), "--json")
    line = one_error_line(result)
    assert "no session 9" in line
    assert json.loads(result.stdout) == {"error": line.removeprefix("kforge: ")}


def test_delete_session(tmp_path: Path, capsys):
    db = tmp_path / "k.db"
    sid = make_db(db)
    assert main(["delete", str(sid), "--yes", "--db", str(db)]) == 0
    assert main(["sessions", "--db", str(db)]) == 0
    assert "no sessions yet" in capsys.readouterr().out


def test_doctor_reports_each_piece(tmp_path: Path, capsys):
    assert main(["doctor", "--db", str(tmp_path / "k.db")]) == 0
    report = capsys.readouterr().out
    for piece in ("Python", "torch", "GPU", "NVRTC", "database", "config", "TUI"):
        assert piece in report


def test_search_a_model_file_profiles_then_searches(tmp_path: Path):
    db = tmp_path / "k.db"
    toy = REPO / "tests" / "capture" / "capture_toy.py"
    result = kforge("search", f"{toy}:build", "--device", "cpu", "--db", str(db),
                    "--iterations", "2", "--top", "2", "--quiet", *DOUBLES)
    assert result.returncode == 0, result.stderr
    assert "stored as session 1" in result.stdout

    async def nodes() -> int:
        store = await Store.open(db, create=False)
        try:
            return len(await store.list_nodes(1))
        finally:
            await store.close()

    assert asyncio.run(nodes()) == 4


def test_search_a_model_without_a_gpu_stops_before_profiling(tmp_path: Path):
    result = kforge("search", "gemma4", "--db", str(tmp_path / "k.db"))
    assert "no CUDA GPU" in one_error_line(result)
    assert not (tmp_path / "k.db").exists()


TOY = REPO / "tests" / "capture" / "capture_toy.py"


@pytest.mark.parametrize("args, message", [
    (["--patience", "-5", *DOUBLES],
     "argument --patience: must be a whole number from 1 to 1,000,000, not '-5'"),
    (["--usd", "nan", *DOUBLES], "must be a number from 0 to 1,000,000, not 'nan'"),
    (["--focus", "3", *DOUBLES], "--focus names an op card of a profiled session"),
    (["--proposer", "llm", "--evaluator", "tests.doubles:make_evaluator"],
     "no LLM endpoint is configured"),
    (["--proposer", "nosuch.module:f", "--evaluator", "tests.doubles:make_evaluator"],
     "cannot import"),
])
def test_search_a_model_with_a_bad_setting_profiles_and_stores_nothing(tmp_path: Path, args,
                                                                       message):
    db = tmp_path / "k.db"
    result = kforge("search", f"{TOY}:build", "--device", "cpu", "--db", str(db), *args)
    assert message in one_error_line(result)
    assert result.stdout == ""  # nothing was profiled
    assert not db.exists() and not (tmp_path / "samples").exists()


def test_a_config_typo_stops_search_before_profiling(tmp_path: Path, _isolated_kforge_dirs: Path):
    db = tmp_path / "k.db"
    (_isolated_kforge_dirs / "config.toml").write_text('[search]\niteration_per_op = 3\n')
    result = kforge("search", f"{TOY}:build", "--device", "cpu", "--db", str(db), *DOUBLES)
    assert "did you mean iterations_per_op?" in one_error_line(result)
    assert not db.exists()


@pytest.mark.parametrize("config, message", [
    ("[search]\niteration_per_op = 3\n", "did you mean iterations_per_op?"),
    ('[search]\nparallel = "two"\n', "[search] parallel in"),
])
def test_doctor_fails_on_a_bad_config(tmp_path: Path, _isolated_kforge_dirs: Path, capsys,
                                      config, message):
    (_isolated_kforge_dirs / "config.toml").write_text(config)
    assert main(["doctor", "--db", str(tmp_path / "k.db")]) == 1
    report = capsys.readouterr().out
    assert any(line.startswith("FAIL") and "config" in line and message in line
               for line in report.splitlines())


def test_delete_without_a_terminal_asks_for_yes(tmp_path: Path):
    db = tmp_path / "k.db"
    sid = make_db(db)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    result = subprocess.run([sys.executable, "-m", "kforge", "delete", str(sid), "--db", str(db)],
                            cwd=REPO, env=env, capture_output=True, text=True, timeout=120,
                            stdin=subprocess.DEVNULL)
    assert "--yes" in one_error_line(result)
    assert main(["show", str(sid), "--db", str(db)]) == 0


def _as_a_reader_without_write_access(tmp_path: Path) -> tuple[Path, list[str]]:
    """A folder this test's kforge may read but not write, and the command prefix that runs it
    so: as root (who writes anywhere), as nobody in a world-readable folder; otherwise in a
    folder made read-only."""
    if os.geteuid() != 0:
        folder = tmp_path / "ro"
        folder.mkdir()
        return folder, []
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        pytest.skip("running as root without setpriv: cannot take write access away")
    folder = Path(tempfile.mkdtemp(prefix="kforge-ro-"))
    folder.chmod(0o755)
    return folder, [setpriv, "--reuid=65534", "--regid=65534", "--clear-groups"]


def test_a_database_in_a_read_only_place_can_be_browsed(tmp_path: Path):
    folder, as_reader = _as_a_reader_without_write_access(tmp_path)
    try:
        db = folder / "k.db"
        sid = make_db(db)
        before = sorted(p.name for p in folder.iterdir())
        for path in (db, folder):
            path.chmod(0o555 if path.is_dir() else 0o444)
        env = {**os.environ, "PYTHONPATH": str(REPO), "HOME": str(folder),
               "KFORGE_CONFIG": str(folder / "config.toml"),
               "KFORGE_CACHE_DIR": str(folder / "cache")}

        def run(*args: str) -> subprocess.CompletedProcess:
            return subprocess.run([*as_reader, sys.executable, "-m", "kforge", *args,
                                   "--db", str(db)],
                                  cwd=REPO, env=env, capture_output=True, text=True, timeout=120)

        listed, shown = run("sessions"), run("show", str(sid))
        assert listed.returncode == 0 and "toy" in listed.stdout, listed.stderr
        assert shown.returncode == 0 and "_softmax" in shown.stdout, shown.stderr
        assert "Traceback" not in one_error_line(run("resume", str(sid), *DOUBLES))
        assert "Traceback" not in one_error_line(
            run("profile", f"{TOY}:build", "--device", "cpu"))
        assert sorted(p.name for p in folder.iterdir()) == before
    finally:
        folder.chmod(0o755)
        shutil.rmtree(folder, ignore_errors=True)


def test_show_gives_no_speedup_from_a_baseline_that_disagrees_with_the_profile(tmp_path: Path,
                                                                                capsys):
    from kforge.core.candidate import Baseline, Timing, profile_disagreement

    db = tmp_path / "k.db"
    softmax, add, relu, view = sample_cards()
    check = profile_disagreement(254.9, 24.6)

    async def go() -> int:
        async with await Store.open(db) as store:
            sid = await store.create_profiled_session(
                "toy", {}, {"name": "Fake GPU", "arch": "sm_90"}, [softmax, add, relu, view])
            card = (await store.list_cards(sid))[0]
            base = Baseline(eager=Timing(254.9, 250.0, 260.0, 50), profile_us=24.6,
                            profile_check=check)
            await store.update_card(card.id, baseline=base.to_dict(), eager_us=254.9,
                                    best_speedup=36.7)
            return sid

    sid = asyncio.run(go())
    assert main(["show", str(sid), "--db", str(db)]) == 0
    shown = capsys.readouterr().out
    assert "36.70x" not in shown and "- (profile)" in shown
    assert "no speedup shown for card" in shown and "10.36x the profile's 24.6 us" in shown
