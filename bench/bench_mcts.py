"""Search statistics: MCTS against best-of-N at equal budget.

Per op and seed, both strategies spend the same number of evaluations on the same world: MCTS
(``kforge.core.mcts.Tree`` with the session defaults) and best-of-N (the same tree with unbounded
widening at the root: every evaluation a new approach, nothing refined or repaired). A would-be
best is re-timed before it counts, as the engine confirms one. The table gives, per op, the mean
number of iterations each needs until its best kernel reaches 95% of the best speedup either found
within the budget (one that never does counts the whole budget), their ratio, and the mean ratio.

Worlds (what an evaluation returns):
- default: fake evaluators, one per op profile (18 ops from 2 us to 4 ms, with realistic failure
  rates, approaches of different potential, refinements that mostly climb toward their approach's
  potential but can regress, repairs that sometimes succeed, timing noise larger for short ops);
  every tree they grow is recorded (``--record DIR`` writes the recordings as JSON) and the table
  is computed by replaying the recordings;
- ``--trees DIR``: recorded trees, replayed;
- ``--db PATH``: the search trees of a kforge sessions database, one per op card, replayed.
A replay returns the recorded outcome of every node the recording has; a node it lacks is drawn
from the recording's own outcomes (new approaches from its new approaches, refinements as its
refinements' speedup ratios, repairs from its repairs), deterministically per node.
- ``--live``: library searches on the GPU (kforge's kernel library and the local evaluator) for
  the op cards of ``bench/bench_library.py``; with ``--record DIR`` their trees are kept for
  offline replay.

Run from the repository root:
    python3 bench/bench_mcts.py [--seeds 40] [--budget 40] [--record DIR] [--trees DIR] [--db PATH]
    python3 bench/bench_mcts.py --live [--budget 16] [--max-ops 12] [--record DIR]   # on a GPU
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import random
import sqlite3
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from kforge.core.candidate import EvalStatus
from kforge.core.mcts import ROOT, Action, Decision, MctsParams, Tree
from kforge.core.reward import reward_from_speedup

TARGET = 0.95  # share of the best speedup a strategy must reach
REPAIRABLE = {status.value for status in EvalStatus if status.repairable}
BEST_OF_N = MctsParams(widen_k=1e12)  # the root widens forever: independent new approaches


@dataclass(frozen=True)
class Outcome:
    """One evaluation: the true speedup over eager (None: the kernel failed)."""

    speedup: float | None
    repairable: bool = True


Path_ = tuple[int, ...]  # a node by the child index taken at each level from the root


# ----- worlds -----


def _rng(*key: object) -> random.Random:
    digest = hashlib.sha256(repr(key).encode()).digest()
    return random.Random(int.from_bytes(digest[:8], "little"))


@dataclass(frozen=True)
class OpProfile:
    """A fake evaluator's op: ``ceiling`` is the largest speedup the hardware allows (eager over
    the physical floor); an approach's potential is a share of it; a kernel's efficiency is a
    share of its approach's potential."""

    name: str
    eager_us: float
    ceiling: float
    fail_new: float = 0.3
    fail_refine: float = 0.2
    repair_ok: float = 0.5
    potential: tuple[float, float] = (3.0, 2.0)  # Beta parameters of an approach's potential
    start: tuple[float, float] = (2.0, 3.0)  # ...of a new kernel's share of its potential
    climb: tuple[float, float] = (0.15, 0.3)  # mean, sd of a refinement's step toward potential

    @property
    def noise(self) -> float:
        """Relative timing noise: short ops are noisier."""
        return 0.03 if self.eager_us < 10 else 0.015 if self.eager_us < 100 else 0.006


PROFILES = (
    OpProfile("softmax bf16 [8192,4096]", 115, 1.9),
    OpProfile("layer_norm bf16 [8192,1536]", 30, 2.4, fail_new=0.35),
    OpProfile("group_norm bf16 [1,128,1024,1024]", 3642, 4.5, fail_new=0.4, fail_refine=0.25),
    OpProfile("rms_norm chain f32 [2048,1536]", 9, 3.0),
    OpProfile("add bf16 [32,256,56,56]", 36, 1.15, fail_new=0.15, potential=(5.0, 1.5),
              climb=(0.05, 0.2)),
    OpProfile("gelu tanh bf16 [2048,12288]", 29, 1.3, fail_new=0.2),
    OpProfile("mul bcast bf16 [2,24,4096,64]", 68, 1.6),
    OpProfile("mean f32 [2,24,4096,64]", 60, 2.0, fail_new=0.3),
    OpProfile("mean f32 decode [1,1,1536]", 2, 1.5, fail_new=0.25),
    OpProfile("max_pool2d f16 [32,64,112,112]", 106, 1.8, fail_new=0.35),
    OpProfile("embedding bf16 [262144,1536]", 12, 1.4, fail_new=0.2),
    OpProfile("cat bf16 [2,24,4429,64]", 80, 1.3, fail_new=0.2, climb=(0.05, 0.2)),
    OpProfile("depthwise conv1d bf16 [1,8192,2048]", 298, 3.2, fail_new=0.45, repair_ok=0.4),
    OpProfile("topk f32 [1,256]", 10, 2.0, fail_new=0.4, repair_ok=0.4, potential=(1.5, 1.5)),
    OpProfile("sort i64 [16384]", 67, 1.5, fail_new=0.45, repair_ok=0.35, potential=(1.5, 1.5),
              climb=(0.08, 0.25)),
    OpProfile("masked_fill bf16 [16384,2048]", 123, 1.2, fail_new=0.15, climb=(0.05, 0.2)),
    OpProfile("_to_copy bf16->f32 [1,2048,1536]", 8, 1.25, fail_new=0.15),
    OpProfile("batch_norm f16 [32,256,56,56]", 70, 2.2, fail_new=0.3),
)


@dataclass
class World:
    """What an evaluation of a node returns. ``outcome`` is deterministic per node path, so two
    strategies asking for the same node get the same kernel; ``observe`` adds timing noise."""

    name: str
    eager_us: float
    noise: float
    seed: int

    def outcome(self, path: Path_, action: Action) -> Outcome:
        raise NotImplementedError

    def observe(self, speedup: float, path: Path_, timing: int) -> float:
        """One timing of the kernel at ``path`` (the ``timing``-th of it)."""
        noise = _rng(self.name, self.seed, path, "t", timing).gauss(0, self.noise)
        return speedup * math.exp(noise)


@dataclass
class FakeWorld(World):
    """A fake evaluator of one op profile; every outcome it gives is recorded."""

    profile: OpProfile = field(default_factory=lambda: PROFILES[0])
    latent: dict[Path_, tuple[float, float]] = field(default_factory=dict)  # potential, share
    record: dict[Path_, tuple[str, Outcome]] = field(default_factory=dict)

    def outcome(self, path: Path_, action: Action) -> Outcome:
        if path in self.record:
            return self.record[path][1]
        p, rng = self.profile, _rng(self.name, self.seed, path)
        parent = self.latent.get(path[:-1])
        if action is Action.NEW or parent is None:
            potential = rng.betavariate(*p.potential)
            share = potential * rng.betavariate(*p.start)
            fail = p.fail_new
        elif action is Action.REFINE:
            potential, share = parent
            mean, sd = p.climb
            share = min(potential, max(0.02, share + (potential - share) * rng.gauss(mean, sd)))
            fail = p.fail_refine
        else:  # a repair gives the failed kernel's intended result, or fails again
            potential, share = parent
            fail = 1.0 - p.repair_ok
        self.latent[path] = (potential, share)
        failed = rng.random() < fail
        result = Outcome(None if failed else max(1e-3, share * p.ceiling),
                         repairable=rng.random() < 0.85)
        self.record[path] = (action.value, result)
        return result

    @classmethod
    def of(cls, profile: OpProfile, seed: int) -> FakeWorld:
        return cls(profile.name, profile.eager_us, profile.noise, seed, profile)


@dataclass
class RecordedWorld(World):
    """A recorded tree replayed: recorded nodes as they were, the others drawn from the
    recording's own outcomes (deterministically per node)."""

    nodes: dict[Path_, tuple[str, Outcome]] = field(default_factory=dict)
    given: dict[Path_, Outcome] = field(default_factory=dict)

    def outcome(self, path: Path_, action: Action) -> Outcome:
        if path in self.given:
            return self.given[path]
        if path in self.nodes and self.nodes[path][0] == action.value:
            found = self.nodes[path][1]
        else:
            found = self._drawn(path, action)
        self.given[path] = found
        return found

    def _drawn(self, path: Path_, action: Action) -> Outcome:
        rng = _rng(self.name, self.seed, path, "drawn")
        same = [(p, o) for p, (a, o) in self.nodes.items() if a == action.value]
        if action is Action.REFINE:
            parent = self.given.get(path[:-1])
            ratios = [(o.speedup / self.nodes[p[:-1]][1].speedup if o.speedup else None,
                       o.repairable) for p, o in same
                      if p[:-1] in self.nodes and self.nodes[p[:-1]][1].speedup]
            if parent is None or parent.speedup is None or not ratios:
                return Outcome(None, False)
            ratio, repairable = rng.choice(ratios)
            best = max((o.speedup for _, o in self.nodes.values() if o.speedup), default=1.0)
            return Outcome(None if ratio is None else min(best, parent.speedup * ratio),
                           repairable)
        pool = [o for _, o in same] or ([o for a, o in self.nodes.values() if a == "new"]
                                        if action is Action.REPAIR else [])
        return rng.choice(pool) if pool else Outcome(None, False)


def save_record(world: FakeWorld | RecordedWorld, folder: Path) -> None:
    nodes = world.record if isinstance(world, FakeWorld) else {**world.nodes, **{
        p: ("?", o) for p, o in world.given.items() if p not in world.nodes}}
    folder.mkdir(parents=True, exist_ok=True)
    name = hashlib.sha256(f"{world.name}/{world.seed}".encode()).hexdigest()[:12]
    (folder / f"{name}.json").write_text(json.dumps({
        "op": world.name, "eager_us": world.eager_us, "noise": world.noise, "seed": world.seed,
        "nodes": [{"path": list(p), "action": a, "speedup": o.speedup,
                   "repairable": o.repairable} for p, (a, o) in sorted(nodes.items())]}))


def load_record(path: Path) -> RecordedWorld:
    data = json.loads(path.read_text())
    nodes = {tuple(n["path"]): (n["action"], Outcome(n["speedup"], n["repairable"]))
             for n in data["nodes"]}
    return RecordedWorld(data["op"], data["eager_us"], data["noise"], data["seed"], nodes)


def db_worlds(db: Path) -> list[RecordedWorld]:
    """One recorded tree per op card with finished nodes in a kforge sessions database."""
    conn = sqlite3.connect(db)
    conn.row_factory = sqlite3.Row
    worlds = []
    for card in conn.execute("SELECT id, op, eager_us FROM op_cards"):
        rows = conn.execute("SELECT id, parent_id, action, status, speedup FROM nodes "
                            "WHERE card_id = ? ORDER BY id", (card["id"],)).fetchall()
        done = [r for r in rows if r["status"] not in ("proposing", "evaluating")]
        if len(done) < 4:
            continue
        paths: dict[int, Path_] = {}
        children: dict[int | None, int] = {}
        nodes = {}
        for r in done:
            parent = r["parent_id"]
            if parent is not None and parent not in paths:
                continue
            index = children.get(parent, 0)
            children[parent] = index + 1
            path = (paths[parent] if parent is not None else ()) + (index,)
            paths[r["id"]] = path
            ok = r["status"] == "ok" and r["speedup"]
            nodes[path] = (r["action"], Outcome(r["speedup"] if ok else None,
                                                r["status"] in REPAIRABLE))
        worlds.append(RecordedWorld(f"{card['op']} (card {card['id']})", card["eager_us"] or 0.0,
                                    0.01, 0, nodes))
    return worlds


# ----- one search -----

Evaluate = Callable[[Path_, Decision, int], Outcome]  # path, decision, node id -> outcome
Observe = Callable[[float, Path_, int], float]  # true speedup, path, timing index -> measured


def search(params: MctsParams, budget: int, seed: int, evaluate: Evaluate,
           observe: Observe) -> list[float]:
    """The true speedup of the tree's best kernel after each evaluation (0 before any works).
    A would-be best is timed again and its second timing is what counts."""
    tree = Tree(params, seed=seed)
    paths: dict[int, Path_] = {ROOT: ()}
    truth: dict[int, float] = {}
    curve = []
    for node_id in range(1, budget + 1):
        decision: Decision = tree.select()
        tree.add(node_id, decision.parent, decision.action)
        path = paths[decision.parent] + (len(tree.children(decision.parent)) - 1,)
        paths[node_id] = path
        outcome = evaluate(path, decision, node_id)
        reward = None
        if outcome.speedup is not None:
            truth[node_id] = outcome.speedup
            measured = observe(outcome.speedup, path, 0)
            best = tree.best_reward
            if best is None or reward_from_speedup(measured) > best:
                measured = observe(outcome.speedup, path, 1)  # the confirmation run
            reward = reward_from_speedup(measured)
        tree.complete(node_id, reward, repairable=outcome.repairable)
        best_node = tree.best()
        curve.append(truth[best_node] if best_node is not None else 0.0)
    return curve


def reached(curve: list[float], target: float) -> int:
    """Iterations until ``curve`` reaches ``target`` (the whole budget if it never does)."""
    return next((i + 1 for i, v in enumerate(curve) if v >= target), len(curve))


@dataclass
class Row:
    op: str
    eager_us: float
    mcts: list[int] = field(default_factory=list)
    best_of_n: list[int] = field(default_factory=list)
    mcts_best: list[float] = field(default_factory=list)
    bon_best: list[float] = field(default_factory=list)

    def add(self, mcts: list[float], bon: list[float]) -> None:
        top = max(max(mcts), max(bon))
        if top <= 0:
            return
        self.mcts.append(reached(mcts, TARGET * top))
        self.best_of_n.append(reached(bon, TARGET * top))
        self.mcts_best.append(mcts[-1])
        self.bon_best.append(bon[-1])

    @property
    def ratio(self) -> float:
        return statistics.mean(self.mcts) / statistics.mean(self.best_of_n)


def compare(world_of: Callable[[int], World], seeds: int, budget: int,
            params: MctsParams) -> Row:
    first = world_of(0)
    row = Row(first.name, first.eager_us)
    for seed in range(seeds):
        world = first if seed == 0 else world_of(seed)

        def evaluate(path: Path_, decision: Decision, node_id: int,
                     world: World = world) -> Outcome:
            return world.outcome(path, decision.action)

        curves = [search(p, budget, seed, evaluate, world.observe) for p in (params, BEST_OF_N)]
        row.add(*curves)
    return row


# ----- live library searches -----


def live_rows(budget: int, max_ops: int, only: str, params: MctsParams,
              record: Path | None) -> list[Row]:
    """MCTS and best-of-N over kforge's kernel library, evaluated on the GPU."""
    from bench_library import model_cards

    from kforge.core.candidate import Candidate, EvalOutcome
    from kforge.core.protocols import NodeView, ProposalRequest
    from kforge.errors import KforgeError
    from kforge.eval.process.local import baseline_local, device_context, evaluate_local
    from kforge.eval.verify.pipeline import EvalSettings
    from kforge.propose.library import LibraryProposer, supports

    gpu = device_context(0).gpu
    proposer = LibraryProposer(gpu)
    settings = EvalSettings(compile_baseline=False, sanitize=False, counters=False)
    rows = []
    for model, card in model_cards():
        if len(rows) >= max_ops:
            break
        if (only and only not in card.op and only not in model) or not supports(card):
            continue
        try:
            eager = baseline_local(card, settings=settings).eager.median_us
        except KforgeError as exc:
            print(f"skip {card.short_op}: {exc}", file=sys.stderr)
            continue
        name = f"{model} {card.short_op} {card.signature[:40]}"
        cache: dict[str, EvalOutcome] = {}

        def run(strategy: MctsParams, seed: int) -> tuple[list[float], RecordedWorld]:
            views: dict[int, NodeView] = {}
            parents: dict[int, int] = {}
            metas: list[dict] = []
            at: dict[Path_, Candidate] = {}
            world = RecordedWorld(name, eager, 0.0, seed)

            def observe(speedup: float, path: Path_, timing: int) -> float:
                """The first timing is the evaluation's; a would-be best is evaluated again."""
                if timing == 0:
                    return speedup
                again = evaluate_local(card, at[path], settings=settings)
                return again.speedup if again.ok and again.speedup else 1e-3

            def evaluate(path: Path_, decision: Decision, node_id: int) -> Outcome:
                parents[node_id] = decision.parent
                lineage, walk = [], decision.parent
                while walk in views:
                    lineage.insert(0, views[walk])
                    walk = parents[walk]
                request = ProposalRequest(card=card, action=decision.action, gpu=gpu,
                                          parent=views.get(decision.parent), lineage=lineage,
                                          tried=list(metas), seed=node_id)
                proposal = proposer.propose_now(request)
                if not proposal.candidates:
                    result = Outcome(None, False)
                    views[node_id] = NodeView(node_id, decision.action, None, None)
                else:
                    candidate: Candidate = proposal.candidates[0]
                    metas.append(candidate.meta)
                    at[path] = candidate
                    if candidate.digest not in cache:  # the other strategy may have run it
                        cache[candidate.digest] = evaluate_local(card, candidate,
                                                                 settings=settings)
                    outcome = cache[candidate.digest]
                    views[node_id] = NodeView(node_id, decision.action, candidate, outcome)
                    result = Outcome(outcome.speedup if outcome.ok else None,
                                     outcome.status.repairable)
                world.nodes[path] = (decision.action.value, result)
                return result

            return search(strategy, budget, seed, evaluate, observe), world

        row = Row(name, eager)
        started = time.perf_counter()
        (mcts, w1), (bon, w2) = run(params, 0), run(BEST_OF_N, 0)
        row.add(mcts, bon)
        if not row.mcts:
            print(f"{name}: no kernel worked in either search", file=sys.stderr)
            continue
        rows.append(row)
        if record is not None:
            save_record(replace(w1, name=f"{name} mcts"), record)
            save_record(replace(w2, name=f"{name} best-of-n"), record)
        print(f"{name}: MCTS {mcts[-1]:.2f}x after {row.mcts[-1]} iterations to 95%, "
              f"best-of-N {bon[-1]:.2f}x after {row.best_of_n[-1]} "
              f"[{time.perf_counter() - started:.0f} s]", file=sys.stderr)
    return rows


# ----- the table -----


def table(rows: list[Row], budget: int, seeds: int) -> str:
    if not rows:
        return "no op had a working kernel in either search"
    lines = ["| op | eager us | MCTS iters | best-of-N iters | ratio | MCTS best "
             "| best-of-N best |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r.op} | {r.eager_us:.0f} | {statistics.mean(r.mcts):.1f} | "
                     f"{statistics.mean(r.best_of_n):.1f} | {r.ratio:.2f} | "
                     f"{statistics.mean(r.mcts_best):.2f}x | {statistics.mean(r.bon_best):.2f}x |")
    ratios = [r.ratio for r in rows]
    first = sum(r.ratio < 0.95 for r in rows)
    behind = sum(r.ratio > 1.05 for r in rows)
    mean = statistics.mean(ratios)
    lines.append("")
    lines.append(f"{len(rows)} ops, {seeds} seeds each, budget {budget} evaluations: mean ratio "
                 f"{mean:.2f} (geometric {math.exp(statistics.mean(map(math.log, ratios))):.2f}); "
                 f"MCTS reached {TARGET:.0%} of the best first on {first} ops, best-of-N on "
                 f"{behind}, {len(rows) - first - behind} within 5%. Goal (mean ratio <= 0.7): "
                 + ("met" if mean <= 0.7 else "NOT met"))
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=40)
    parser.add_argument("--budget", type=int, default=40, help="evaluations per search")
    parser.add_argument("--record", type=Path, help="write the searched trees here as JSON")
    parser.add_argument("--trees", type=Path, help="replay the recorded trees in this folder")
    parser.add_argument("--db", type=Path, help="replay the search trees of a sessions database")
    parser.add_argument("--live", action="store_true", help="library searches on the GPU")
    parser.add_argument("--max-ops", type=int, default=12, help="op cards of a live run")
    parser.add_argument("--only", default="", help="live: only cards whose op contains this")
    parser.add_argument("--mcts", action="append", default=[], metavar="KEY=VALUE",
                        help="an MCTS parameter other than the default (explore=0.3, ...)")
    args = parser.parse_args()
    params = replace(MctsParams(), **{k: float(v) for k, v in
                                      (item.split("=", 1) for item in args.mcts)})
    started = time.perf_counter()
    if args.live:
        rows = live_rows(args.budget, args.max_ops, args.only, params, args.record)
        print(table(rows, args.budget, 1))
        return 0
    rows: list[Row] = []
    if args.trees or args.db:
        worlds = ([load_record(p) for p in sorted(args.trees.glob("*.json"))] if args.trees
                  else []) + (db_worlds(args.db) if args.db else [])
        for world in worlds:
            rows.append(compare(lambda seed, w=world: replace(w, seed=seed, given={}),
                                args.seeds, args.budget, params))
    else:
        for profile in PROFILES:
            recorded: dict[int, FakeWorld] = {}

            def world_of(seed: int, profile: OpProfile = profile) -> World:
                recorded[seed] = FakeWorld.of(profile, seed)
                return recorded[seed]

            compare(world_of, args.seeds, args.budget, params)  # records the trees
            replayed = {seed: RecordedWorld(w.name, w.eager_us, w.noise, seed, dict(w.record))
                        for seed, w in recorded.items()}
            if args.record:
                for world in recorded.values():
                    save_record(world, args.record)
            rows.append(compare(lambda seed, r=replayed: r[seed], args.seeds, args.budget,
                                params))
    print(table([r for r in rows if r.mcts], args.budget, args.seeds))
    print(f"\n{time.perf_counter() - started:.0f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
