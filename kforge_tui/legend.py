"""What each symbol and label on the screens means, area by area: help lists the areas of the
screen it opens over, below the keys."""

from __future__ import annotations

from kforge_tui.format import (
    ICON_BEST,
    ICON_CONFIRMING,
    ICON_EVALUATING,
    ICON_FAILED,
    ICON_OK,
    ICON_PROPOSING,
    ICON_PRUNED,
)

Legend = tuple[tuple[str, str], ...]  # (symbol or label, what it means)

SESSIONS: Legend = (
    ("●", "an engine is searching the session now"),
    ("ops", "the ops the search works on (targets)"),
    ("×eager", "the session's best op kernel: its speedup over eager (- where none beats "
               "eager)"),
    ("cost", "money spent on language models"),
)
HEADER: Legend = (
    ("(engine live) ●", "an engine is searching the session now"),
    ("starting", "an engine was started and has not taken the session yet"),
    ("engine stopped", "the session's engine died mid-search: r resumes it"),
    ("12/32 it", "iterations done, out of the session's budget"),
    ("e2e", "the whole model as kforge e2e timed it: kforge's fastest mode against the fastest "
            "mode without kforge; ≈ and (noise): inside the modes' spread"),
    ("proj", "projected: Amdahl's law over the profiled shares, were every op's best kernel "
             "used (≤: kforge apply may keep some ops on eager)"),
    ("$0.14/$2.00", "money spent, and allowed"),
    ("13m/60m", "time searched, and allowed"),
    ("demo, read-only", "a recording, or a database this process may not write: nothing "
                        "can be changed"),
)
OPS: Legend = (
    ("share", "the op's share of the profiled model's time: a bar, and a percentage"),
    ("×eager", "the op's best kernel over eager: both the evaluator's device time per call. "
               "- where no kernel beats eager or torch.compile; below 1x: a kernel faster than "
               "torch.compile only"),
    ("trend", "the op's best speedup after each iteration, oldest left (▁ lowest, █ highest)"),
    ("eager prof", "eager time per call from the profile: GPU time inside the model run, "
                   "before the evaluator timed the op"),
    ("eager eval", "eager time per call as the evaluator timed the op alone: device time"),
    ("eager us", "eager time in microseconds, each cell saying prof or eval"),
    ("calls", "calls of the op in one model run"),
    ("dtype", "its tensors' dtypes: bf16 bfloat16, f16 float16, f32 float32, i64 int64, "
              "b bool, ..."),
    ("shapes", "its tensors' shapes (i shows them whole, with dtypes and strides)"),
    ("todo run conf", "not searched yet; being searched; a would-be best under confirmation"),
    ("done stop skip", "ended by its own stop rule; the search ended first (r resumes it); "
                       "never searched. i says why"),
    ("◎", "the search is focused on this op"),
    ("└", "an op called inside the fusion region above it (in italics)"),
)
TREE: Legend = (
    (ICON_OK, "a kernel that worked; its speedup over eager (device time)"),
    (ICON_FAILED, "a kernel that failed: compile error, mismatch, crash, ..."),
    (ICON_PROPOSING, "proposing: waiting for the proposer"),
    (ICON_EVALUATING, "evaluating: waiting for the evaluator"),
    (ICON_CONFIRMING, "confirming: a would-be best, under compute-sanitizer and re-timed on new "
                      "inputs in a fresh worker; no best until it passes"),
    (ICON_PRUNED, "pruned: out of the search, with its subtree"),
    (f"{ICON_BEST}best", "the op's best kernel (: 1.80x over compile where it beats "
                         "torch.compile alone)"),
    ("#12", "the node's number"),
    ("new refine repair", "how the node was made: a fresh kernel, a faster one from its "
                          "parent, a fix of its parent's failure"),
    ("n=", "visits: the nodes evaluated in its subtree"),
    ("↳", "the best speedup below the node"),
    ("▶ ▼", "a node with children: folded, unfolded"),
)
