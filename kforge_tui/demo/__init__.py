"""``kforge-tui --demo``: replay the recorded search of ``recording`` into a fresh database, so a
machine without a GPU (or any session of its own) can see what the TUI shows. The app opens the
database read-only."""

from __future__ import annotations

import asyncio
import stat
from pathlib import Path

from kforge.core.candidate import Baseline, Candidate, EvalOutcome, EvalStatus, LlmCall, Timing
from kforge.core.opcard import OpCard
from kforge.core.outcome import Correctness, HostCost, SetCheck
from kforge.store import SessionStatus, Store
from kforge_tui.demo import recording

DEMO_DB = "demo.db"
# What each recorded launch looks like (one kernel, one output shaped like the first input).
PLAN = {"outputs": [{"name": "out", "like": "self"}],
        "launches": [{"kernel": "k", "grid": [4096], "block": [256],
                      "params": [{"ptr": "self"}, {"ptr": "out"}]}]}


def build_demo(folder: Path) -> tuple[Path, int]:
    """Write the recording into ``folder``/demo.db, read-only on disk; the file and the id of its
    session."""
    db = folder / DEMO_DB
    session = asyncio.run(replay(db))
    db.chmod(stat.S_IRUSR | stat.S_IRGRP | stat.S_IROTH)
    return db, session


async def replay(db: Path) -> int:
    """The recorded session, written as the engine wrote it: cards, then each node's proposal and
    verdict, the cards' ends and the log."""
    async with await Store.open(db) as store:
        cards = [OpCard(op=c.op, args=c.args, calls=c.calls, share=c.share,
                        total_us=c.eager_us * c.calls, eager_us=c.eager_us, target=c.target,
                        library="native" if c.target else "view")
                 for c in recording.CARDS]
        session = await store.create_profiled_session(recording.MODEL, recording.SETTINGS,
                                                      recording.GPU, cards)
        rows = await store.list_cards(session)
        for row, card in zip(rows, recording.CARDS, strict=True):
            if card.target:  # the evaluator's baseline, as the engine stores it
                baseline = Baseline(eager=timing(card.eager_us),
                                    compiled=timing(card.compiled_us), floor_us=card.floor_us)
                await store.update_card(row.id, eager_us=card.eager_us,
                                        compiled_us=card.compiled_us, floor_us=card.floor_us,
                                        baseline=baseline.to_dict())
        nodes: list[int] = []
        best: dict[int, float] = {}  # per card, the fastest kernel confirmed so far
        for step in recording.STEPS:
            card = rows[step.card]
            parent = nodes[step.parent] if step.parent is not None else None
            node = await store.add_node(session, card.id, parent, step.action)
            nodes.append(node)
            await store.set_candidate(node, Candidate(step.kernel, PLAN,
                                                      {"approach": step.approach}),
                                      [exchange(step, card.card.short_op)])
            # as the engine does: a would-be best faster than eager is confirmed
            confirmed = (step.speedup is not None and step.speedup > 1.0
                         and step.speedup > best.get(step.card, 0.0))
            if confirmed:
                best[step.card] = step.speedup
            await store.finish_node(node, verdict(step, recording.CARDS[step.card]),
                                    reward=step.speedup, confirmed=confirmed)
            if step.pruned:
                await store.set_pruned(node, True)
        for index, status, reason in recording.CARD_ENDS:
            await store.update_card(rows[index].id, status=status, stop_reason=reason)
        for level, message in recording.LOG:
            await store.log(session, message, level)
        await store.heartbeat(session, recording.RUN_SECONDS)
        await store.set_session_status(session, SessionStatus.STOPPED)
    return session


def timing(us: float) -> Timing:
    return Timing(median_us=us, p10_us=us * 0.98, p90_us=us * 1.03, reps=120)


def verdict(step: recording.Step, card: recording.Card) -> EvalOutcome:
    if step.speedup is None:
        return EvalOutcome(EvalStatus(step.status), summary=step.log.splitlines()[0],
                           compile_log=step.log if step.status == "compile_error" else "",
                           wall_s=1.4)
    us = card.eager_us / step.speedup
    summary = f"{step.speedup:.2f}x eager (device {us:.1f} us vs {card.eager_us:.1f} us)"
    return EvalOutcome(EvalStatus.OK, summary=summary, timing=timing(us),
                       eager=timing(card.eager_us), speedup=step.speedup,
                       correctness=Correctness(tuple(SetCheck(inputs, max_abs=step.max_abs)
                                                     for inputs in ("sample 0", "seed 1"))),
                       floor_fraction=card.floor_us / us, wall_s=2.3, host=HostCost(6.1, 5.4))


def exchange(step: recording.Step, op: str) -> LlmCall:
    """The model exchange that produced the step's kernel."""
    prompt = (f"Write a CUDA kernel for {op} ({step.action}). Approach to try: "
              f"{step.approach}.")
    return LlmCall(recording.LLM_MODEL, input_tokens=2400 + 40 * len(step.kernel) // 10,
                   output_tokens=len(step.kernel) // 3, usd=0.012, seconds=7.5,
                   prompt=prompt, reply=f"```cuda\n{step.kernel}```")
