"""bench/bench_mcts.py without a GPU: a fake evaluator's tree replays exactly from its recording,
both strategies spend the same budget, and the table reports the ratio it is built for."""

from __future__ import annotations

from bench import bench_mcts as B
from kforge.core.mcts import Action, MctsParams


def test_a_recorded_tree_replays_as_it_was_grown(tmp_path):
    profile = B.PROFILES[0]
    grown = B.FakeWorld.of(profile, seed=3)
    row = B.compare(lambda seed: grown, 1, 24, MctsParams())
    B.save_record(grown, tmp_path)
    (path,) = tmp_path.glob("*.json")
    replayed = B.compare(lambda seed: B.load_record(path), 1, 24, MctsParams())
    assert (replayed.mcts, replayed.best_of_n) == (row.mcts, row.best_of_n)
    assert all(1 <= n <= 24 for n in row.mcts + row.best_of_n)


def test_best_of_n_only_ever_tries_new_approaches():
    world = B.FakeWorld.of(B.PROFILES[1], seed=0)

    def evaluate(path, decision, node_id):
        assert len(path) == 1 and decision.action.value == "new"
        return world.outcome(path, decision.action)

    assert len(B.search(B.BEST_OF_N, 30, 0, evaluate, world.observe)) == 30


def test_an_unrecorded_node_is_drawn_from_the_recordings_own_outcomes():
    nodes = {(0,): ("new", B.Outcome(1.2)), (1,): ("new", B.Outcome(None)),
             (0, 0): ("refine", B.Outcome(1.5))}
    world = B.RecordedWorld("op", 10.0, 0.0, 0, nodes)
    assert world.outcome((0,), Action.NEW).speedup == 1.2
    assert world.outcome((2,), Action.NEW) in (B.Outcome(1.2), B.Outcome(None))
    refined = world.outcome((0, 1), Action.REFINE)  # a refinement: the recorded ratio 1.25
    assert refined.speedup == 1.5  # capped at the best the recording saw


def test_the_table_reports_the_mean_ratio_and_the_goal():
    rows = [B.compare(lambda seed, p=p: B.FakeWorld.of(p, seed), 3, 20, MctsParams())
            for p in B.PROFILES[:3]]
    text = B.table(rows, 20, 3)
    assert text.startswith("| op | eager us | MCTS iters | best-of-N iters | ratio |")
    assert "3 ops, 3 seeds each, budget 20 evaluations: mean ratio" in text
    assert "Goal (mean ratio <= 0.7): " in text
