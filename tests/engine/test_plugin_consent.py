"""Code named by a database is not run without the user saying so: a plug-in spec a session
stores is refused until it is given again or `--trust-plugins` confirms it, and engines started
by kforge (the TUI's, a detached one) never import from the folder they were started in."""

from __future__ import annotations

import asyncio
import os
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest

from kforge.cli.main import main
from kforge.engine.command import kforge_command, kforge_env
from kforge.engine.plugins import PluginConsent
from kforge.store import Store
from tests.doubles import sample_cards

DOUBLES = {"proposer": "tests.doubles:make_proposer", "evaluator": "tests.doubles:make_evaluator"}


def make_db(path: Path, search: dict) -> int:
    async def go() -> int:
        async with await Store.open(path) as store:
            return await store.create_profiled_session(
                "toy", {"search": {"iterations_per_op": 1, **search}},
                {"name": "Fake GPU", "arch": "sm_90"}, sample_cards())

    return asyncio.run(go())


def test_a_stored_plug_in_is_refused_and_named_until_confirmed(tmp_path: Path, capsys):
    db = tmp_path / "k.db"
    sid = make_db(db, DOUBLES)
    assert main(["resume", str(sid), "--db", str(db), "--quiet"]) == 1
    error = capsys.readouterr().err
    assert "the session names the proposer 'tests.doubles:make_proposer'" in error
    assert "--trust-plugins" in error
    # the proposer given again confirms it; the evaluator is still the database's word
    assert main(["resume", str(sid), "--db", str(db), "--quiet",
                 "--proposer", DOUBLES["proposer"]]) == 1
    assert "the evaluator 'tests.doubles:make_evaluator'" in capsys.readouterr().err


@pytest.mark.parametrize("confirm", [["--trust-plugins"],
                                     ["--proposer", DOUBLES["proposer"],
                                      "--evaluator", DOUBLES["evaluator"]]])
def test_a_confirmed_plug_in_runs(tmp_path: Path, confirm):
    db = tmp_path / "k.db"
    sid = make_db(db, DOUBLES)
    assert main(["resume", str(sid), "--db", str(db), "--quiet", *confirm]) == 0


def test_a_plug_in_in_the_users_own_config_needs_no_confirmation(tmp_path: Path,
                                                                  _isolated_kforge_dirs: Path):
    (_isolated_kforge_dirs / "config.toml").write_text(
        f'[search]\nproposer = "{DOUBLES["proposer"]}"\nevaluator = "{DOUBLES["evaluator"]}"\n')
    db = tmp_path / "k.db"
    sid = make_db(db, DOUBLES)
    assert main(["resume", str(sid), "--db", str(db), "--quiet"]) == 0


def test_an_engine_started_by_kforge_does_not_import_from_its_folder(tmp_path: Path):
    """A .py file next to a shared database is not a module to the engine, even trusted."""
    marker = tmp_path / "ran"
    (tmp_path / "evil.py").write_text(f"open({str(marker)!r}, 'w').close()\n"
                                      "def make(ctx): raise SystemExit('imported')\n")
    db = tmp_path / "k.db"
    sid = make_db(db, {"proposer": "evil:make", "evaluator": DOUBLES["evaluator"]})
    result = subprocess.run([*kforge_command(), "resume", str(sid), "--db", str(db), "--quiet",
                             "--trust-plugins"], cwd=tmp_path, env=kforge_env(),
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 1
    assert "cannot import 'evil'" in result.stderr
    assert not marker.exists()


def test_no_child_kforge_starts_imports_from_its_folder(tmp_path: Path, monkeypatch):
    """The GPU workers and the sanitizer's children are started as engines are: a module lying
    in the folder they start in is not imported, even where PYTHONPATH has an empty entry."""
    import sys

    from kforge.core.child import child_env, python_command
    from kforge.eval.process.pool import worker_command
    from kforge.eval.process.sanitize import tool_command

    prefix = [sys.executable, "-P", "-m"]
    assert worker_command(0)[:3] == prefix
    sanitized = tool_command("compute-sanitizer", "memcheck", ["k"], tmp_path / "job.json")
    assert sanitized[sanitized.index(sys.executable):][:3] == prefix
    marker = tmp_path / "ran"
    (tmp_path / "shadow.py").write_text(f"open({str(marker)!r}, 'w').close()\n")
    monkeypatch.setenv("PYTHONPATH", f"{os.pathsep}{tmp_path / 'elsewhere'}{os.pathsep}")
    assert "" not in child_env()["PYTHONPATH"].split(os.pathsep)
    result = subprocess.run(python_command("shadow"), cwd=tmp_path, env=child_env(),
                            capture_output=True, text=True, timeout=60)
    assert "No module named shadow" in result.stderr and not marker.exists()


def test_a_stored_ray_cluster_is_refused_until_confirmed(tmp_path: Path, capsys):
    """A Ray cluster's answers are unpickled here: an address only the database names is as
    much code as a plug-in."""
    from kforge.core.settings import SearchSettings

    db = tmp_path / "k.db"
    sid = make_db(db, {"cluster": "192.0.2.1:6379"})
    assert main(["resume", str(sid), "--db", str(db), "--quiet"]) == 1
    error = capsys.readouterr().err
    assert "the session names the cluster '192.0.2.1:6379'" in error and "--cluster" in error
    search, stored = SearchSettings(cluster="192.0.2.1:6379"), {"cluster": "192.0.2.1:6379"}
    PluginConsent(frozenset({("cluster", "192.0.2.1:6379")})).check(search, stored,
                                                                     SearchSettings())
    PluginConsent(every=True).check(search, stored, SearchSettings())
    PluginConsent().check(search, stored, SearchSettings(cluster="192.0.2.1:6379"))
    PluginConsent().check(search, {}, SearchSettings())  # given now, not stored


def test_a_detached_engine_trusts_only_what_the_user_confirmed(tmp_path: Path, monkeypatch):
    """The detached engine reads the database again: a plug-in it names by then (written by
    whoever else writes the shared file) is refused there, not imported on a blanket
    --trust-plugins that the user's own confirmation of other specs became."""
    import sqlite3

    marker = tmp_path / "imported"
    modules = tmp_path / "installed"
    modules.mkdir()
    (modules / "swapped_in.py").write_text(f"open({str(marker)!r}, 'w').close()\n"
                                           "def make(ctx): raise SystemExit('ran')\n")
    monkeypatch.setenv("PYTHONPATH", str(modules))  # a module the engine can import
    db = tmp_path / "k.db"
    sid = make_db(db, {"evaluator": DOUBLES["evaluator"]})  # and the built-in proposer
    started = []
    with monkeypatch.context() as patched:  # the engine's command, not started
        patched.setattr("kforge.engine.runner.subprocess", SimpleNamespace(
            Popen=lambda argv, **kwargs: started.append(argv) or SimpleNamespace(pid=1),
            DEVNULL=subprocess.DEVNULL, STDOUT=subprocess.STDOUT))
        assert main(["resume", str(sid), "--db", str(db), "--quiet", "--detach",
                     "--evaluator", DOUBLES["evaluator"]]) == 0
    (argv,) = started
    assert "--trust-plugins" not in argv
    with sqlite3.connect(db) as conn:  # the database changes before the engine reads it
        conn.execute("UPDATE sessions SET settings = json_set(settings, '$.search.proposer', "
                     "'swapped_in:make')")
    result = subprocess.run(argv, env=kforge_env(), capture_output=True, text=True, timeout=120)
    assert "the session names the proposer 'swapped_in:make'" in result.stdout + result.stderr
    assert not marker.exists()


def test_consent_passes_on_as_it_was_given():
    consent = PluginConsent(frozenset({("proposer", "a:f"), ("cluster", "head:6379")}))
    assert consent.options() == ["--cluster", "head:6379", "--proposer", "a:f"]
    assert PluginConsent(consent.given, every=True).options() == ["--trust-plugins"]
    assert PluginConsent().options() == []
