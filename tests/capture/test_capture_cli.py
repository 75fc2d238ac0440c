"""`kforge profile`: a stored session with cards and samples on success, nothing on failure."""

from __future__ import annotations

import asyncio
import io
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kforge.cli.cmd_profile import ProgressLine
from kforge.cli.main import main
from kforge.store import Store

TOY = Path(__file__).with_name("capture_toy.py")
REPO = TOY.parents[2]


def kforge(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-m", "kforge", *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=120)


def stored(db: Path):
    async def read():
        store = await Store.open(db)
        try:
            sessions = await store.list_sessions()
            cards = await store.list_cards(sessions[0].session.id) if sessions else []
            detail = await store.get_session(sessions[0].session.id) if sessions else None
            return sessions, cards, detail, store.samples_root
        finally:
            await store.close()

    return asyncio.run(read())


def test_list_names_every_built_in_model(capsys):
    assert main(["profile", "--list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in lines][:2] == ["resnet50", "resnet50-tiny"]
    assert any(line.startswith("qwen35 ") and "35B-A3B" in line for line in lines)


def test_profile_stores_a_session_with_cards_modules_and_samples(tmp_path, capsys):
    db = tmp_path / "kforge.db"
    code = main(["profile", f"{TOY}:build", "--device", "cpu", "--samples", "1", "--batch", "3",
                 "--db", str(db)])
    assert code == 0
    output = capsys.readouterr().out
    assert "_softmax" in output and "stored as session 1" in output
    sessions, cards, session, samples_root = stored(db)
    assert len(sessions) == 1 and session.model == f"{TOY}:build"
    # seq_len: the factory's own default, the length it ran at
    assert session.settings == {"dtype": "float32", "device": "cpu", "batch": 3, "seq_len": 8,
                                "mode": None, "layers": None, "samples": 1,
                                "regions": True}
    assert session.gpu["name"] == "no GPU"
    softmax = next(row for row in cards if row.card.op == "aten._softmax.default")
    assert softmax.modules == ["blocks.0", "blocks.1"] and softmax.card.calls == 2
    assert (samples_root / "1" / softmax.card.key / "0.pt").is_file()
    assert not list(samples_root.glob(".staging-*"))


def test_a_failing_model_stores_nothing(tmp_path, capsys):
    db = tmp_path / "kforge.db"
    assert main(["profile", f"{TOY}:failing_model", "--device", "cpu", "--db", str(db)]) == 1
    message = capsys.readouterr().err.strip().splitlines()[-1]
    assert message.startswith("kforge: ") and "failed to run on cpu" in message
    assert not db.exists()
    samples_root = tmp_path / "samples"
    assert not samples_root.exists() or not any(samples_root.iterdir())


def test_seq_lengths_vary_a_model_files_own_default_length(tmp_path, capsys):
    assert main(["profile", f"{TOY}:build", "--device", "cpu", "--seq-lengths", "4,12",
                 "--db", str(tmp_path / "k.db")]) == 0
    assert "profiled at 4, 8, 12" in capsys.readouterr().out


def test_seq_range_without_seq_lengths_is_refused_before_anything_runs(tmp_path, capsys):
    assert main(["profile", f"{TOY}:build", "--device", "cpu", "--seq-range", "1:16",
                 "--db", str(tmp_path / "k.db")]) == 1
    assert "give both" in capsys.readouterr().err and not any(tmp_path.iterdir())


def test_databases_in_one_folder_keep_their_samples_apart(tmp_path, capsys):
    """Each database's session 1 has its own samples: a profile into one, or a delete in it,
    leaves the other's alone."""
    first, second = tmp_path / "a.db", tmp_path / "b.db"
    for db in (first, second):
        assert main(["profile", f"{TOY}:build", "--device", "cpu", "--samples", "1",
                     "--db", str(db)]) == 0
    capsys.readouterr()
    first_samples = stored(first)[3] / "1"
    second_samples = stored(second)[3] / "1"
    assert first_samples != second_samples
    assert any(first_samples.rglob("*.pt")) and any(second_samples.rglob("*.pt"))
    assert main(["delete", "1", "--yes", "--db", str(second)]) == 0
    assert not second_samples.exists() and any(first_samples.rglob("*.pt"))


def test_samples_an_older_kforge_kept_in_the_shared_folder_are_still_read(tmp_path):
    db = tmp_path / "kforge.db"
    assert main(["profile", f"{TOY}:build", "--device", "cpu", "--samples", "1",
                 "--db", str(db)]) == 0
    own = stored(db)[3] / "1"
    legacy = tmp_path / "samples" / "1"
    own.replace(legacy)  # where an older kforge put them

    async def read() -> Path:
        async with await Store.open(db) as store:
            return store.samples_to_read(1)

    assert asyncio.run(read()) == legacy


@pytest.mark.filterwarnings("ignore::UserWarning")  # sparse invariant checks left off
def test_a_profile_with_a_sparse_input_is_stored_and_read_back(tmp_path, capsys):
    db = tmp_path / "kforge.db"
    unusual = Path(__file__).with_name("unusual_toy.py")
    assert main(["profile", f"{unusual}:sparse_model", "--device", "cpu", "--db", str(db)]) == 0
    capsys.readouterr()
    assert main(["show", "1", "--db", str(db)]) == 0
    assert "f32[4,16] sparse_coo" in capsys.readouterr().out
    assert main(["apply", "1", "--db", str(db)]) == 0


@pytest.mark.parametrize("factory, message", [
    ("idle_model", "ran no operator on cpu: its forward returned without calling any"),
    ("out_of_memory_model", "out of host memory running"),
])
def test_a_model_that_runs_no_op_or_runs_out_of_memory_stores_nothing(tmp_path, capsys,
                                                                      factory, message):
    """A model that runs no operator was stored as a session of 0 op cards with exit 0; a CPU
    out-of-memory error said "out of GPU memory"."""
    db = tmp_path / "kforge.db"
    assert main(["profile", f"{TOY}:{factory}", "--device", "cpu", "--db", str(db)]) == 1
    (line,) = capsys.readouterr().err.strip().splitlines()[-1:]
    assert line.startswith("kforge: ") and message in line and "GPU" not in line
    assert not db.exists()
    assert not (tmp_path / "samples").exists()  # no staging folder either


def test_a_model_option_that_does_not_apply_creates_no_database(tmp_path):
    db = tmp_path / "kforge.db"
    assert main(["profile", f"{TOY}:build", "--device", "cpu", "--dtype", "fp8",
                 "--db", str(db)]) == 1
    assert not db.exists()


def test_a_factory_that_calls_sys_exit_is_one_clear_line(tmp_path):
    db = tmp_path / "kforge.db"
    result = kforge("profile", f"{TOY}:exiting_model", "--device", "cpu", "--db", str(db))
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert lines[-1] == f"kforge: {TOY}:exiting_model called sys.exit(3)", result.stderr
    assert "Traceback" not in result.stderr
    assert not db.exists()


def test_profile_output_carries_no_profiler_trace_lines(tmp_path):
    result = kforge("profile", f"{TOY}:build", "--device", "cpu", "--samples", "1",
                    "--db", str(tmp_path / "kforge.db"))
    assert result.returncode == 0, result.stderr
    assert "USDT" not in result.stdout + result.stderr


def test_staging_folders_left_by_a_killed_profile_are_removed(tmp_path, capsys):
    db = tmp_path / "kforge.db"
    staging = tmp_path / "samples"
    abandoned, live = staging / ".staging-abandoned", staging / ".staging-live"
    for folder in (abandoned, live):
        (folder / "card").mkdir(parents=True)
        (folder / "card" / "0.pt").write_bytes(b"x")
    week_ago = time.time() - 7 * 24 * 3600
    for path in (abandoned / "card" / "0.pt", abandoned / "card", abandoned):
        os.utime(path, (week_ago, week_ago))
    assert main(["profile", f"{TOY}:build", "--device", "cpu", "--samples", "1",
                 "--db", str(db)]) == 0
    assert not abandoned.exists()
    assert live.exists()  # may belong to a profile running now


def test_a_killed_profile_leaves_no_folder_behind(tmp_path):
    """A profile killed while its model runs (most of its time) leaves no staging folder, nor a
    samples folder: the staging folder is made only when samples are written."""
    import signal

    running = tmp_path / "running"
    env = {**os.environ, "PYTHONPATH": str(REPO), "KFORGE_TOY_RUNNING": str(running)}
    proc = subprocess.Popen([sys.executable, "-m", "kforge", "profile", f"{TOY}:sleeping_model",
                             "--device", "cpu", "--db", str(tmp_path / "kforge.db")], cwd=REPO,
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        while not running.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert running.exists(), "the model never ran"
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["running"]


def test_a_staging_folder_whose_profile_is_gone_is_removed_by_the_next(tmp_path, capsys):
    """One killed while it wrote samples: named for its process, which no longer runs."""
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)
    left = tmp_path / "samples" / f".staging-{int(gone.stdout)}-0123456789ab"
    (left / "card").mkdir(parents=True)
    (left / "card" / "0.pt").write_bytes(b"x")
    assert main(["profile", f"{TOY}:build", "--device", "cpu", "--samples", "1",
                 "--db", str(tmp_path / "kforge.db")]) == 0
    assert not left.exists()
    assert not list((tmp_path / "samples").glob(".staging-*"))


def test_no_model_is_a_clear_error(capsys):
    assert main(["profile"]) == 1
    assert "name a model to profile" in capsys.readouterr().err


def test_progress_is_plain_lines_off_a_terminal():
    stream = io.StringIO()
    progress = ProgressLine(stream)
    for done in range(3):
        progress("profile", done, 2)
    for done in (0, 5, 10):
        progress("samples", done, 10)
    assert stream.getvalue().splitlines() == [
        "timed forwards: 0/2", "timed forwards: 2/2", "saving sample inputs (op calls): 0/10",
        "saving sample inputs (op calls): 10/10"]


def test_no_regions_profiles_op_cards_alone(tmp_path, capsys):
    db = tmp_path / "kforge.db"
    assert main(["profile", f"{TOY}:build", "--device", "cpu", "--samples", "0",
                 "--no-regions", "--db", str(db)]) == 0
    _, cards, session, _ = stored(db)
    assert session.settings["regions"] is False
    assert cards and all(row.card.region is None for row in cards)
