"""How many bytes kforge-tui writes to its terminal while nobody presses a key.

Starts the real ``kforge-tui`` in a detached tmux session of the given size, lets it settle, then
records everything it writes to the terminal (``tmux pipe-pane``) for a while. Scenarios:

- ``quiet``: the sessions screen over a database nobody writes to;
- ``other-writer``: a finished session open while a search of another session (its own process,
  the test-double proposer and evaluator) writes to the same database;
- ``live``: that live search itself open at 120x40;
- ``help-quiet``, ``palette-quiet``: help or the command palette open over the finished session
  while the other search writes to the database;
- ``form-quiet``: the new-session form over the sessions list, nobody writing;
- ``form-live``: the same while the other search writes (the list under it follows);
- ``help-live``, ``palette-live``: a dialog open over the live search at 120x40;
- ``themes-quiet``: the theme picker over the finished session while the other search writes;
- ``confirm-live``: the delete confirmation over the sessions list while the search writes;
- ``diff-quiet``: a node's diff against its parent over the finished session while the other
  search writes;
- ``live-80``, ``help-live-80``, ``themes-live-80``: the live search at 80x24, alone, under help
  and under the theme picker;
- ``live-110``, ``live-160``: the live search at 110x30 and 160x48, where the four panes share
  the screen (with ``live-80`` and ``live``, the four widths a user tried);
- ``scroll-80``, ``scroll-110``, ``scroll-120``, ``scroll-160``: j pressed 60 times, 20 a second,
  in a kernel of 300 lines (the kernel pane focused), at 80x24, 110x30, 120x40 and 160x48; the
  budget is per line moved.

Prints one row per scenario: size, seconds recorded, the nodes the search added meanwhile, bytes,
KB/s (for a scroll: bytes per line moved), the budget and whether it was met. Needs tmux; runs on
a CPU machine (the searches use the test doubles of tests/doubles.py).

    python bench/bench_tui_output.py [--seconds 20] [--only quiet,live] [--term xterm-256color]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from kforge.core.candidate import Candidate
from kforge.store import Store
from tests.doubles import sample_cards
from tests.tui.fixtures import GPU, KERNEL, build_sync

SETTLE_S = 4.0  # after the screen shows what it waits for: startup output is not counted
# The live search: an evaluation takes this long (a quick GPU turnaround), two proposals in
# flight; it runs far longer than any recording.
EVAL_S = 0.3
LIVE_SETTINGS = {"search": {"iterations_per_op": 100_000, "patience": 100_000, "parallel": 2},
                 "fake": {"delay_s": EVAL_S}}


@dataclass(frozen=True)
class Scenario:
    name: str
    size: tuple[int, int]
    session: str | None  # which session kforge-tui opens: None (the list), "finished" or "live"
    engine: bool  # whether the live search runs meanwhile
    shows: str  # text on screen once the app has drawn what the scenario looks at
    budget: float  # KB/s; for a scroll, bytes per line moved
    keys: tuple[str, ...] = ()  # pressed (tmux key names) once it shows, to open a dialog
    dialog: str = ""  # text on screen once that dialog is open
    scroll: int = 0  # lines moved with j while recording (the budget is then bytes per line)

    @property
    def follows_the_search(self) -> bool:
        """Whether the screen must change while it is recorded (it shows the live search, and
        no dialog covers the lines that change)."""
        return self.session == "live" and not self.keys


# A kernel of this many lines is the finished session's best node's, for the scroll scenarios.
LONG_KERNEL_LINES = 300
SCROLL_KEYS_S = 0.05  # j twenty times a second, as a held key repeats


PALETTE = "Search for commands"
THEMES = "Search for themes"
SCENARIOS = (
    Scenario("quiet", (80, 24), None, False, "resnet50-tiny", 1.0),
    Scenario("other-writer", (80, 24), "finished", True, "#1 toy", 1.0),
    Scenario("live", (120, 40), "live", True, "engine live", 10.0),
    Scenario("help-quiet", (80, 24), "finished", True, "#1 toy", 1.0, ("?",), "Keys here"),
    Scenario("palette-quiet", (80, 24), "finished", True, "#1 toy", 1.0, ("C-p",), PALETTE),
    Scenario("form-quiet", (80, 24), None, False, "resnet50-tiny", 1.0, ("n",), "New session"),
    Scenario("form-live", (80, 24), None, True, "resnet50-tiny", 10.0, ("n",), "New session"),
    Scenario("help-live", (120, 40), "live", True, "engine live", 10.0, ("?",), "Keys here"),
    Scenario("palette-live", (120, 40), "live", True, "engine live", 10.0, ("C-p",), PALETTE),
    Scenario("themes-quiet", (80, 24), "finished", True, "#1 toy", 1.0, ("C-t",), THEMES),
    Scenario("confirm-live", (80, 24), None, True, "resnet50-tiny", 10.0, ("d",),
             "Delete session"),
    Scenario("diff-quiet", (80, 24), "finished", True, "#1 toy", 1.0, ("2", "d"),
             "against its parent"),
    Scenario("live-80", (80, 24), "live", True, "#3 live", 10.0),
    Scenario("help-live-80", (80, 24), "live", True, "#3 live", 10.0, ("?",), "Keys here"),
    Scenario("themes-live-80", (80, 24), "live", True, "#3 live", 10.0, ("C-t",), THEMES),
    Scenario("live-110", (110, 30), "live", True, "#3 live", 10.0),
    Scenario("live-160", (160, 48), "live", True, "engine live", 10.0),
    Scenario("scroll-80", (80, 24), "finished", False, "#1 toy", 2000, ("3",), "line 1",
             scroll=60),
    Scenario("scroll-110", (110, 30), "finished", False, "#1 toy", 20000, ("3",), "line 1",
             scroll=60),
    Scenario("scroll-120", (120, 40), "finished", False, "#1 toy", 20000, ("3",), "line 1",
             scroll=60),
    Scenario("scroll-160", (160, 48), "finished", False, "#1 toy", 20000, ("3",), "line 1",
             scroll=60),
)


@dataclass(frozen=True)
class Result:
    scenario: Scenario
    seconds: float
    written: int
    nodes: int  # nodes the search added while the output was recorded

    @property
    def kbs(self) -> float:
        return self.written / 1000 / self.seconds

    @property
    def rate(self) -> float:
        """KB/s, or for a scroll, bytes per line moved."""
        return self.written / self.scenario.scroll if self.scenario.scroll else self.kbs

    @property
    def passed(self) -> bool:
        return self.rate < self.scenario.budget


def tmux(*args: str) -> str:
    return subprocess.run(["tmux", *args], capture_output=True, text=True, check=False).stdout


def wait_for(name: str, text: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    screen = ""
    while time.monotonic() < deadline:
        screen = tmux("capture-pane", "-p", "-t", name)
        if text in screen:
            return
        time.sleep(0.2)
    raise SystemExit(f"{text!r} never appeared on the screen:\n{screen}")


async def add_live_session(db: Path) -> int:
    async with await Store.open(db) as store:
        return await store.create_profiled_session("live", LIVE_SETTINGS, GPU, sample_cards())


async def lengthen_kernel(db: Path, node: int) -> None:
    """Give a node a kernel of LONG_KERNEL_LINES lines, each numbered, to scroll through."""
    lines = KERNEL.splitlines()
    source = "\n".join(f"{lines[i % len(lines)]} // line {i}" for i in range(LONG_KERNEL_LINES))
    async with await Store.open(db) as store:
        await store.set_candidate(node, Candidate(source, "launch()"), [])


async def count_nodes(db: Path, session: int) -> int:
    async with await Store.open(db, create=False) as store:
        return len(await store.list_nodes(session))


def start_engine(db: Path, session: int, env: dict[str, str], log: Path) -> subprocess.Popen:
    """A search of the live session, run by `kforge resume` in a process of its own (not
    through ``kforge.app`` here): it must write the database while the TUI, recorded in its
    terminal, follows it."""
    argv = [sys.executable, "-m", "kforge", "resume", str(session), "--db", str(db), "--quiet",
            "--proposer", "tests.doubles:make_proposer",
            "--evaluator", "tests.doubles:make_evaluator"]
    with log.open("ab") as out:
        return subprocess.Popen(argv, cwd=REPO, env={**os.environ, **env}, stdout=out,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)


def record(scenario: Scenario, work: Path, seconds: float, term: str) -> Result:
    db = work / "k.db"
    if db.exists():
        db.unlink()
    ids = build_sync(db)
    live = asyncio.run(add_live_session(db))
    if scenario.scroll:
        asyncio.run(lengthen_kernel(db, ids["a1"]))  # the node the session opens on
    env = {"PYTHONPATH": str(REPO), "KFORGE_CONFIG": str(work / "config.toml"), "TERM": term}
    engine = start_engine(db, live, env, work / "engine.log") if scenario.engine else None
    session = {"finished": ids["session"], "live": live}.get(scenario.session or "")
    argv = [sys.executable, "-m", "kforge_tui", "--db", str(db), "--no-mouse"]
    if session is not None:
        argv += ["--session", str(session)]
    # env -u: the terminal's colour depth comes from TERM alone, as over SSH.
    command = " ".join(["env", "-u", "COLORTERM", *(f"{k}={shlex.quote(v)}" for k, v in
                                                    env.items()),
                        *map(shlex.quote, argv)])
    name = f"kforge-bench-{os.getpid()}-{scenario.name}"
    output = work / f"{scenario.name}.out"
    output.unlink(missing_ok=True)
    width, height = scenario.size
    tmux("new-session", "-d", "-s", name, "-x", str(width), "-y", str(height), "-c", str(REPO),
         command)
    try:
        wait_for(name, scenario.shows)
        if scenario.keys:
            tmux("send-keys", "-t", name, *scenario.keys)
            wait_for(name, scenario.dialog)
        time.sleep(SETTLE_S)
        before = tmux("capture-pane", "-p", "-t", name)
        nodes = asyncio.run(count_nodes(db, live))
        tmux("pipe-pane", "-o", "-t", name, f"cat >> {shlex.quote(str(output))}")
        start = time.monotonic()
        if scenario.scroll:
            for _ in range(scenario.scroll):
                tmux("send-keys", "-t", name, "j")
                time.sleep(SCROLL_KEYS_S)
            time.sleep(1.0)  # the last lines drawn
            if f"│{scenario.scroll + 1:>3}  " not in tmux("capture-pane", "-p", "-t", name):
                raise SystemExit(f"{scenario.name}: the kernel did not scroll to its line "
                                 f"{scenario.scroll + 1}")
        else:
            time.sleep(seconds)
        tmux("pipe-pane", "-t", name)  # stop recording
        elapsed = time.monotonic() - start
        nodes = asyncio.run(count_nodes(db, live)) - nodes
        if scenario.follows_the_search and tmux("capture-pane", "-p", "-t", name) == before:
            raise SystemExit(f"{scenario.name}: the screen did not follow the search "
                             f"(see {work / 'engine.log'})")
    finally:
        tmux("kill-session", "-t", name)
        if engine is not None:
            engine.terminate()
            engine.wait(timeout=30)
    time.sleep(0.2)  # the pipe's cat flushes on close
    return Result(scenario, elapsed, output.stat().st_size if output.exists() else 0, nodes)


def table(results: list[Result], term: str) -> str:
    header = (f"{'scenario':<14} {'size':>7} {'seconds':>8} {'nodes':>6} {'bytes':>9} "
              f"{'KB/s':>7} {'budget':>7}  pass")
    lines = [f"TERM={term}, no COLORTERM", header]
    for r in results:
        width, height = r.scenario.size
        rate = f"{r.rate:>5.0f} B/line" if r.scenario.scroll else f"{r.rate:>7.2f}"
        lines.append(f"{r.scenario.name:<14} {f'{width}x{height}':>7} {r.seconds:>8.1f} "
                     f"{r.nodes:>6} {r.written:>9} {rate} "
                     f"{f'<{r.scenario.budget:g}':>7}  {'yes' if r.passed else 'NO'}")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=20.0, help="recording per scenario")
    parser.add_argument("--only", help="comma-separated scenario names "
                                       f"({', '.join(s.name for s in SCENARIOS)})")
    parser.add_argument("--term", default="xterm-256color",
                        help="TERM the app sees (its colour depth follows it)")
    args = parser.parse_args()
    if shutil.which("tmux") is None:
        raise SystemExit("tmux is not installed")
    wanted = set(args.only.split(",")) if args.only else {s.name for s in SCENARIOS}
    unknown = wanted - {s.name for s in SCENARIOS}
    if unknown:
        raise SystemExit(f"no scenario named {', '.join(sorted(unknown))}")
    results = []
    with tempfile.TemporaryDirectory(prefix="kforge-bench-") as folder:
        for scenario in SCENARIOS:
            if scenario.name in wanted:
                results.append(record(scenario, Path(folder), args.seconds, args.term))
    print(table(results, args.term))
    return 0 if all(r.passed for r in results) else 1


if __name__ == "__main__":
    raise SystemExit(main())
