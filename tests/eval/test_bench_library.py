"""bench/bench_library.py without a GPU: children that stand in for the measuring processes
crash, die and hang on some cards, and the table still holds every card, naming what failed."""

from __future__ import annotations

import argparse
import sys

from bench import bench_library as B

# A child measuring the cards given on its command line: card 1's second kernel faults (the
# evaluation says so and the child exits 3), card 2's first kills its process outright, card 3's
# never answers; the others measure two kernels, card 4's second rejected by a check.
CHILD = r"""
import json, os, sys, time
EVENT = sys.argv[1]
def emit(**event):
    print(EVENT + json.dumps(event), flush=True)
emit(kind="gpu", label="stand-in", sm_count=1, bandwidth_gbs=1.0)
for card in map(int, sys.argv[2].split(",")):
    emit(kind="card", card=card)
    emit(kind="baseline", eager_us=10.0, compiled_us=None, floor_us=5.0)
    for n, approach in enumerate(("fast", "slow")):
        point = {"block": 256}
        emit(kind="evaluating", approach=approach, params=point)
        if card == 1 and n == 1:
            emit(kind="tried", approach=approach, params=point, status="crash", eager_us=None,
                 median_us=None, summary="a kernel crashed during timing (3 wall-time calls)")
            emit(kind="done")
            sys.exit(3)
        if card == 2:
            os._exit(-9 % 256)
        if card == 3:
            time.sleep(60)
        cheat = card == 4 and n == 1
        emit(kind="tried", approach=approach, params=point, status="cheat" if cheat else "ok",
             summary="mismatch at placement +4 B" if cheat else "ok",
             median_us=None if cheat else 5.0 * (n + 1), eager_us=10.0)
    emit(kind="done")
"""


def test_every_card_gets_its_row_whatever_its_children_do(capsys):
    args = argparse.Namespace(refine=0, no_compile=True, timeout=5.0)
    table = B.Table(show_tried=False)
    B.run_isolated([0, 1, 2, 3, 4], args, table,
                   lambda left, _: [sys.executable, "-c", CHILD, B.EVENT, ",".join(map(str, left))])
    assert table.finished == {0, 1, 2, 3, 4}
    assert [row[6] for row in table.rows] == [5.0, 5.0, None, None, 5.0]  # best of each card
    assert [row[11] for row in table.rows] == [2, 2, 1, 1, 2]  # kernels tried
    err = capsys.readouterr().err
    assert "crash: slow {'block': 256}: a kernel crashed during timing (3 wall-time calls)" in err
    assert "crash: fast {'block': 256}: the process died with code 247" in err
    assert "timeout: fast {'block': 256}: no answer within 5 s" in err
    assert "cheat: slow {'block': 256}: mismatch at placement +4 B" in err  # why, not just what
