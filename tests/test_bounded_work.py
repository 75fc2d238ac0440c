"""Work on text someone else wrote grows no faster than the text, and every view of stored text is
bounded: checking a candidate's source (a 120 KB one took 86 s in `kforge export`), parsing an LLM
reply (547 KB took 27 s) and `kforge show` of 1 MB stored texts (5 MB made it print 30 MB), each
measured by bench/bench_untrusted.py in a process of its own. CPU seconds of that process are
compared, 64 KiB against 1 MiB, with room for three times the noise: work that grew with the
square of the length would take 256 times as long, linear work 16."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SMALL, LARGE = 64 << 10, 1 << 20


@pytest.fixture(scope="module")
def rows() -> list[dict]:
    result = subprocess.run([sys.executable, str(ROOT / "bench" / "bench_untrusted.py"),
                             "--json", "--sizes", str(SMALL), str(LARGE)],
                            capture_output=True, text=True, timeout=900, cwd=ROOT)
    assert result.returncode == 0, result.stderr[-2000:]
    return json.loads(result.stdout)


def by(rows: list[dict], what: str) -> dict[str, dict[int, dict]]:
    found: dict[str, dict[int, dict]] = {}
    for row in rows:
        if row["what"] == what:
            found.setdefault(row["shape"], {})[row["size"]] = row
    return found


@pytest.mark.parametrize("what", ["source", "reply"])
def test_checking_and_parsing_grow_linearly_and_stop_at_their_cap(rows, what):
    shapes = by(rows, what)
    assert len(shapes) == 4
    for shape, sizes in shapes.items():
        small, large = sizes[SMALL]["cpu_s"], sizes[LARGE]["cpu_s"]
        assert large < 120, (shape, large)
        assert large < 3 * 16 * max(small, 0.05), (shape, small, large)
        (over,) = [row for size, row in sizes.items() if size > LARGE]
        assert over["ended"].startswith("refused: the ") and over["cpu_s"] < 1, over


def test_a_view_of_stored_text_is_bounded(rows):
    for view, most in (("session", 20_000), ("node", 1_000_000)):
        sizes = by(rows, "show")[view]
        for row in sizes.values():
            printed = int(row["ended"].split("printed ")[1].split(" ")[0].replace(",", ""))
            assert row["ended"].startswith("exit 0") and printed < most, row
        assert sizes[LARGE]["cpu_s"] < 3 * 16 * max(sizes[SMALL]["cpu_s"], 0.1), sizes
