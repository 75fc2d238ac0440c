"""`kforge show SESSION --node N`: one search node in full, as text. Its op card and parent, who
made it and how (proposer, action), its outcome (the sections of ``kforge.core.report``), its
kernel source and launch plan, and every language-model call made for it with the whole prompt and
reply, so what the model was told and what it answered can be read back. Every stored text is
shown cut to a bound (``kforge.core.inert.capped``), whatever the database holds."""

from __future__ import annotations

import argparse
import datetime
from dataclasses import dataclass

from kforge.cli.common import CELL_CHARS, EAGER_SOURCES, LINE_CHARS, TEXT_CHARS, out, with_store
from kforge.core.candidate import EvalOutcome
from kforge.core.fmt import fmt_speedup, fmt_us
from kforge.core.gpu import NO_GPU, GpuInfo
from kforge.core.inert import capped
from kforge.core.report import TIMING, no_outcome, outcome_sections
from kforge.errors import KforgeError
from kforge.propose.llm.prompt import plan_json
from kforge.store import Store
from kforge.store.records import CardRow, NodeDetail, NodeRow, reading

SUMMARY_SHOWN = 10_000  # a summary is shown whole here; this only guards the terminal
CALLS_SHOWN = 20  # a node's last language-model calls shown (a search makes one to a few)


@dataclass(frozen=True)
class NodeFacts:
    """What the view of one node reads from the store."""

    detail: NodeDetail
    card: CardRow
    parent: NodeRow | None
    children: list[NodeRow]
    gpu: GpuInfo


async def load_node(store: Store, session_id: int, node_id: int) -> NodeFacts:
    """The node with its card, parent and children; KforgeError for a node not in the session."""
    session = await store.get_session(session_id)
    found = await store.get_nodes([node_id])
    if not found or found[0].session_id != session_id:
        raise KforgeError(f"no search node {node_id} in session {session_id} "
                          f"(`kforge show {session_id}` lists its op cards)")
    detail = await store.get_node(node_id)
    row = detail.row
    parent = None
    if row.parent_id is not None:
        found = await store.get_nodes([row.parent_id])
        with reading(f"search node {node_id}"):
            if not found:
                raise LookupError(f"its parent, node {row.parent_id}, is not in the database")
        parent = found[0]
    children = [n for n in await store.list_nodes(session_id, row.card_id)
                if n.parent_id == node_id]
    gpu = session.gpu_info if session.gpu else NO_GPU
    return NodeFacts(detail=detail, card=await store.get_card(row.card_id), parent=parent,
                     children=children, gpu=gpu)


def proposer_of(meta: dict) -> str:
    """Who wrote a node's candidate: its tag, else the LLM when it names a model, else the
    kernel library when it names a family."""
    if tag := meta.get("proposer"):
        return str(tag)
    if "model" in meta:
        return "llm"
    return "library" if "family" in meta else "-"


def node_text(facts: NodeFacts, with_prompts: bool = True) -> str:
    """The whole report on one node (pure)."""
    detail, row = facts.detail, facts.detail.row
    sections = [_head(facts), _made(row, facts.parent, facts.children),
                _outcome(row, detail.outcome, facts)]
    if detail.candidate is not None:
        sections.append(f"── kernel source ──\n{_text(detail.candidate.source.rstrip())}")
        plan = detail.candidate.plan
        sections.append("── launch plan ──\n" + (_text(plan_json(plan)) if plan is not None
                                                  else "(none)"))
    else:
        sections.append("── kernel source ──\n(no candidate: "
                        + ("the proposer is still at work)" if row.in_flight
                           else "the proposer returned none)"))
    sections.append(_calls(detail.llm_calls, with_prompts))
    return "\n\n".join(sections)


def _text(text: str) -> str:
    """A stored block (a source, a log, a prompt) as shown."""
    return capped(text, TEXT_CHARS)


def _line(text: object) -> str:
    """A stored text shown on a line of its own."""
    return capped(str(text), LINE_CHARS)


def _head(facts: NodeFacts) -> str:
    row, card = facts.detail.row, facts.card.card
    lines = [f"node {row.id}  session {row.session_id}  card {row.card_id}: "
             f"{capped(card.short_op, CELL_CHARS)}",
             f"  call      {_line(f'{card.op}({card.signature})')}"]
    if card.range_text:
        lines.append(f"  range     {_line(card.range_text)}")
    best = facts.card.best_kernel
    lines.append(f"  eager     {EAGER_SOURCES[facts.card.eager_source]} {fmt_us(card.eager_us)} "
                 f"per call, torch.compile device {fmt_us(card.compiled_us)}, physical floor "
                 f"{fmt_us(card.floor_us)}; the card's best "
                 + (f"{fmt_speedup(facts.card.best_over_eager)} over eager (node {best})"
                    if best is not None else "- (no kernel beats eager or torch.compile)"))
    if check := (facts.card.baseline or {}).get("profile_check"):
        lines.append(f"  profile   {_line(check)}")
    return "\n".join(lines)


def _result(node: NodeRow) -> str:
    """What a node's evaluation came to, as a neighbour's line names it."""
    return f"{fmt_speedup(node.speedup)} over eager" if node.ok else capped(node.status, CELL_CHARS)


def _made(row: NodeRow, parent: NodeRow | None, children: list[NodeRow]) -> str:
    meta = row.meta
    lines = ["── how it was made ──",
             f"proposer  {_line(proposer_of(meta))}" + (f" ({_line(meta['model'])})"
                                                        if "model" in meta else ""),
             f"action    {row.action}" + _action_meaning(row.action)]
    if parent is None:
        lines.append("parent    none: a new approach under eager PyTorch")
    else:
        lines.append(f"parent    node {parent.id} ({parent.action}, {_result(parent)}): "
                     f"{_line(parent.meta.get('approach', '-'))}")
    lines.append(f"approach  {_line(meta.get('approach', '-'))}")
    if meta.get("family"):
        params = " ".join(f"{k}={v}" for k, v in sorted((meta.get("params") or {}).items()))
        lines.append(_line(f"family    {meta['family']}" + (f" {params}" if params else "")))
    if notes := meta.get("notes"):
        lines.append(f"notes     {_line(notes)}")
    if children:
        lines.append(_line("children  " + ", ".join(f"{c.id} ({c.action}, {_result(c)})"
                                                    for c in children)))
    if row.pruned:
        lines.append("pruned    yes: out of the search")
    return "\n".join(lines)


def _action_meaning(action: str) -> str:
    return {"new": ": a new approach", "refine": ": a rewrite of a working parent",
            "repair": ": a fix of a failed parent"}.get(action, "")


def _outcome(row: NodeRow, outcome: EvalOutcome | None, facts: NodeFacts) -> str:
    lines = ["── outcome ──", f"status    {capped(row.status, CELL_CHARS)}" + (
        ": a would-be best waiting for or under its confirmation (compute-sanitizer beside a "
        "fresh worker's re-timing); never used before it passes" if row.confirming else "")]
    if row.summary:
        lines.append(f"summary   {row.summary[:SUMMARY_SHOWN]}")
    lines.append(f"made      {_clock(row.created_at)}"
                 + (f", finished {_clock(row.finished_at)} "
                    f"({row.finished_at - row.created_at:.1f} s later)"
                    if row.finished_at is not None else ", not finished"))
    lines.append(f"cost      ${row.usd:.4f}")
    if outcome is None:
        lines.append(no_outcome(row.in_flight))
        return "\n".join(lines)
    source = facts.detail.candidate.source if facts.detail.candidate is not None else ""
    for part in outcome_sections(outcome, gpu=facts.gpu, source=source,
                                 summary_shown=SUMMARY_SHOWN, used=row.confirmed):
        if part.title == TIMING:  # the figures continue the outcome's lines
            lines += map(_line, part.lines)
        else:
            lines += ["", f"{part.title}:", *map(_text, part.lines)]
    return "\n".join(lines)


def _calls(calls: list[dict], with_prompts: bool) -> str:
    if not calls:
        return "── language-model calls ──\nnone (the kernel library, a user's kernel or a test " \
               "proposer made this node)"
    parts = [f"── language-model calls: {len(calls)}, "
             f"${sum(c['usd'] for c in calls):.4f} ──"]
    if len(calls) > CALLS_SHOWN:
        parts.append(f"(the first {len(calls) - CALLS_SHOWN} not shown)")
    for i, call in list(enumerate(calls, 1))[-CALLS_SHOWN:]:
        head = (f"call {i}: {capped(call['model'], CELL_CHARS)}  {call['input_tokens']} prompt + "
                f"{call['output_tokens']} reply tokens  ${call['usd']:.4f}  "
                f"{call['seconds']:.1f} s  at {_clock(call['created_at'])}")
        body = [head]
        if call["error"]:
            body.append(f"error: {_line(call['error'])}")
        if with_prompts:
            body += ["", f"»» prompt (call {i})", _text(call["prompt"]) or "(not recorded)", "",
                     f"»» reply (call {i})", _text(call["reply"]) or "(empty)"]
        parts.append("\n".join(body))
    return "\n\n".join(parts)


def _clock(moment: float | None) -> str:
    if moment is None:
        return "-"
    return datetime.datetime.fromtimestamp(moment).strftime("%Y-%m-%d %H:%M:%S")


def cmd_show_node(args: argparse.Namespace) -> int:
    facts = with_store(args, lambda store: load_node(store, args.session, args.node),
                       reads_only=True)
    with reading(f"search node {args.node}"):  # its stored outcome, as text: any damage in it
        text = node_text(facts, with_prompts=not args.no_prompt)
    out.print(text)
    return 0
