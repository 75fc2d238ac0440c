"""Key press to repaint on the search tree at 10,000 nodes (goal: under 50 ms).

Runs the real SearchTree in a headless Textual app. Each sample is the time from handing the key to
the app until its last screen update that followed (the compositor has rendered the changed lines;
only the terminal write is skipped, as the app is headless). Pilot's own idle waits are not counted.
Scenarios: the default lazy view, the whole tree expanded, a live tick that changes 100 nodes'
figures, and a new node landing in a fully expanded tree (the one change that re-lays the lines).
Prints a table in milliseconds.

    python bench/bench_tui_tree.py [--nodes 10000] [--presses 40]
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import time
from dataclasses import replace

from textual.app import App, ComposeResult

from kforge.core.opcard import OpCard
from kforge.store.records import CardRow, NodeRow
from kforge_tui.search_model import SearchModel
from kforge_tui.widgets.search_tree import SearchTree

SIZE = (160, 48)


def search_rows(count: int, seed: int = 0) -> list[NodeRow]:
    """An MCTS-like tree: a few hundred approaches, refined mostly from recent good nodes."""
    rng = random.Random(seed)
    rows: list[NodeRow] = []
    for node_id in range(1, count + 1):
        parent = None if not rows or rng.random() < 0.02 else rows[
            max(0, len(rows) - 1 - int(rng.expovariate(1 / 40)))].id
        ok = rng.random() < 0.6
        rows.append(NodeRow(id=node_id, session_id=1, card_id=1, parent_id=parent,
                            action="refine" if parent else "new",
                            status="ok" if ok else "compile_error", meta={}, reward=None,
                            speedup=round(rng.uniform(0.5, 2.0), 3) if ok else None,
                            median_us=None, repairable=False, pruned=False, summary="",
                            usd=0.0, created_at=0.0, finished_at=0.0))
    return rows


def card_row() -> CardRow:
    tensor = {"t": "tensor", "shape": [8, 1024], "stride": [1024, 1], "dtype": "float16",
              "offset": 0}
    card = OpCard(op="aten._softmax.default", args=[tensor, -1, False], share=0.6, id=1)
    return CardRow(card=card, status="searching", stop_reason="", spent=0, best_node=None,
                   best_speedup=None, modules=[], baseline=None)


class TreeBench(App):
    def __init__(self, model: SearchModel) -> None:
        super().__init__()
        self.model = model

    def compose(self) -> ComposeResult:
        yield SearchTree(self.model)

    def on_mount(self) -> None:
        tree = self.query_one(SearchTree)
        tree.show_card(card_row())
        tree.focus()


def watch_repaints(app: App) -> list[float]:
    """Record when each screen update is handed to the output."""
    painted: list[float] = []
    display = app._display

    def recorded(screen, renderable) -> None:
        if renderable is not None:
            painted.append(time.perf_counter())
        display(screen, renderable)

    app._display = recorded
    return painted


async def timed(pilot, painted: list[float], action, repeats: int, before=None) -> list[float]:
    samples = []
    for i in range(repeats):
        if before is not None:
            await before(i)
        await pilot.pause()
        painted.clear()
        start = time.perf_counter()
        await action(i)
        await pilot.pause()
        if painted:
            samples.append((painted[-1] - start) * 1000)
    return samples


async def run(nodes: int, presses: int) -> list[tuple[str, list[float]]]:
    model = SearchModel()
    rows = search_rows(nodes)
    model.load(rows)
    app = TreeBench(model)
    results = []
    async with app.run_test(size=SIZE) as pilot:
        tree = app.query_one(SearchTree)
        painted = watch_repaints(app)
        await pilot.pause()

        async def measure(name: str, action, before=None) -> None:
            results.append((name, await timed(pilot, painted, action, presses, before)))

        def press(*keys: str):
            return lambda _i: pilot.press(*keys)

        await measure("lazy view: j (cursor down)", press("j"))
        await measure("lazy view: l (expand a node)", press("l"), before=press("j", "h", "j"))
        tree.open_all()  # every node loaded and shown: the worst case
        await pilot.pause()
        shown = tree.last_line + 1
        await measure(f"all {shown} lines shown: j", press("j"))
        await measure(f"all {shown} lines shown: G or g",
                      lambda i: pilot.press("G" if i % 2 == 0 else "g"))

        async def live_tick(i: int) -> None:
            for row in rows[i * 100:(i + 1) * 100]:
                model.upsert(replace(row, speedup=(row.speedup or 1.0) + 0.01, status="ok"))
            tree.nodes_changed([], [])
            tree.repaint_if_dirty()

        await measure("live tick: 100 nodes change (timer repaint)", live_tick)

        async def new_node(i: int) -> None:
            row = replace(rows[-1], id=nodes + 1 + i, parent_id=rows[-1 - i].id,
                          status="proposing", speedup=None)
            model.upsert(row)
            tree.nodes_changed([model.nodes[row.id]], [])

        await measure(f"new node lands among {shown}+ open lines", new_node)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=10_000)
    parser.add_argument("--presses", type=int, default=40)
    args = parser.parse_args()
    results = asyncio.run(run(args.nodes, args.presses))
    print(f"search tree, {args.nodes} nodes, {SIZE[0]}x{SIZE[1]} terminal, "
          f"{args.presses} presses each (ms, key to repaint)")
    print(f"{'scenario':<46} {'median':>8} {'p90':>8} {'max':>8}")
    for name, samples in results:
        ordered = sorted(samples)
        p90 = ordered[int(0.9 * (len(ordered) - 1))]
        print(f"{name:<46} {statistics.median(samples):8.1f} {p90:8.1f} {max(samples):8.1f}")


if __name__ == "__main__":
    main()
