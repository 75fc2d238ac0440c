"""Code named by a database is not run without the user saying so: a plug-in spec a session
stores is refused until it is given again or `--trust-plugins` confirms it, and engines started
by kforge (the TUI's, a detached one) never import from the folder they were started in."""

from __future__ import annotations

import asyncio
import subprocess
from pathlib import Path

import pytest

from kforge.cli.main import main
from kforge.engine.command import kforge_command, kforge_env
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
