"""Text the screens show: table cells, tree labels and the node reports. Pure functions."""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from rich.text import Text

from kforge.core.argspec import decode, is_contiguous, tensor_specs
from kforge.core.candidate import Candidate, EvalOutcome
from kforge.core.fmt import fmt_age, fmt_best_over_eager, fmt_speedup, fmt_us
from kforge.core.inert import inert
from kforge.core.report import no_outcome, outcome_sections
from kforge.core.settings import SessionSettings
from kforge.integrate.winners import CardChoice, projected_speedup
from kforge.store import NodeStatus
from kforge.store.records import CardRow, NodeDetail, NodeRow, Session, SessionSummary

__all__ = ["fmt_age", "fmt_speedup", "fmt_us"]

def literal(text: str, **style: Any) -> Text:
    """``text`` shown exactly as it is: never read as markup, and ``inert`` (no control
    characters). How the screens show any text that is stored or typed (``style``: rich Text's
    own keywords)."""
    return Text(inert(text), **style)


# Status marks: one cell wide in every common terminal font.
ICON_OK = "✔"
ICON_FAILED = "✗"
ICON_PROPOSING = "…"
ICON_EVALUATING = "◷"
ICON_CONFIRMING = "◔"
ICON_PRUNED = "✂"
ICON_BEST = "★"
# Eight heights for a sparkline, and a bar's last cell filled by eighths (index = eighths).
SPARK_BLOCKS = "▁▂▃▄▅▆▇█"
BAR_EIGHTHS = " ▏▎▍▌▋▊▉"
BAR_FULL = "█"


@dataclass(frozen=True)
class NodeLabel:
    """A tree line in parts, so the widget can style each part from the theme."""

    icon: str
    tone: str  # ok | failed | flight | pruned
    text: str
    figures: str


def node_tone(row: NodeRow, pruned: bool) -> str:
    if pruned:
        return "pruned"
    if NodeStatus.in_flight(row.status) or row.confirming:
        return "flight"
    return "ok" if row.ok else "failed"


def node_label(row: NodeRow, visits: int, best: float | None, pruned: bool) -> NodeLabel:
    tone = node_tone(row, pruned)
    icon = (ICON_PRUNED if row.pruned else ICON_PROPOSING if row.status == NodeStatus.PROPOSING
            else ICON_EVALUATING if row.status == NodeStatus.EVALUATING
            else ICON_CONFIRMING if row.confirming
            else ICON_OK if row.ok else ICON_FAILED)
    result = (f"{fmt_speedup(row.speedup)} confirming" if row.confirming
              else fmt_speedup(row.speedup) if row.ok else row.status.replace("_", " "))
    figures = f" n={visits}"
    if best is not None and best != row.speedup:
        figures += f" ↳{fmt_speedup(best)}"
    return NodeLabel(icon, tone, inert(f"#{row.id} {row.action} {result}"), figures)


def node_name(row: NodeRow, card: CardRow) -> str:
    """A node as a question names it: its number, its result, ``★best`` where it is its op's
    best kernel, and its op (``node #1347, 3.14x ★best of convolution 1x64x56x56``)."""
    result = fmt_speedup(row.speedup) if row.ok else row.status.replace("_", " ")
    best = f" {ICON_BEST}best" if card.best_kernel == row.id else ""
    pruned = " (pruned)" if row.pruned else ""
    return inert(f"node #{row.id}, {result}{best}{pruned} of {card.card.label}")


def card_root_label(card: CardRow, nodes: int) -> str:
    """The search tree's root: the op (a range card with its whole range) as eager runs it."""
    c = card.card
    op = f"{c.short_op} {c.range_text}" if c.ranges is not None else c.short_op
    return inert(f"{op}  eager  ({nodes} node{'' if nodes == 1 else 's'})")


# dtypes as a narrow column shows them.
SHORT_DTYPES = {"bfloat16": "bf16", "float16": "f16", "float32": "f32", "float64": "f64",
                "int64": "i64", "int32": "i32", "int16": "i16", "int8": "i8", "uint8": "u8",
                "bool": "b", "complex64": "c64", "complex128": "c128",
                "float8_e4m3fn": "f8e4", "float8_e5m2": "f8e5"}


def dtype_of(card: CardRow) -> str:
    dtypes = {t["dtype"] for t in tensor_specs(card.card.args)}
    return ",".join(sorted(SHORT_DTYPES.get(d, d) for d in dtypes)) or "-"


def best_cell(card: CardRow) -> str:
    """The op table's ``×eager`` figure: the best kernel's speedup over eager, ``-`` without a
    best."""
    return fmt_speedup(card.best_over_eager)


def no_best_text(card: CardRow) -> str:
    """Why ``b`` has no node to go to: no kernel of the op beats its baselines yet."""
    timed = card.baseline is not None and card.card.compiled_us  # torch.compile, by the evaluator
    bases = "eager or torch.compile" if timed else "eager"
    text = f"this op has no kernel that beats {bases} yet"
    if card.best_node is not None and card.best_speedup is not None:
        text += (f" (the fastest so far, node #{card.best_node}: "
                 f"{fmt_speedup(card.best_speedup)} eager)")
    return text


CONFIRMING = "confirming"  # an op card's status word while one of its kernels is confirming

# What a status means where the card stores no reason of its own.
STATUS_MEANS = {
    "pending": "not searched yet",
    "searching": "being searched",
    "done": "its search ended by its own stop rule",
    "stopped": "the session's search ended before this op's did; r resumes it",
    "skipped": "never searched",
    CONFIRMING: "a would-be best kernel is under confirmation (compute-sanitizer, and re-timed "
                "on new inputs in a fresh worker); it counts once confirmed",
}
LIBRARIES = {"native": "PyTorch's own kernel", "view": "a view or copy"}


def card_reason(card: CardRow, confirming: bool = False) -> str:
    """Why an op has its status, in words: its stop reason, else what the status means (a view
    or copy is never a target, whatever its status)."""
    if not card.card.target and not card.stop_reason:
        return ("a view or copy: it moves no data a kernel could speed up, so it is never a "
                "target" if card.card.library == "view" else "not a target op")
    if confirming:
        return STATUS_MEANS[CONFIRMING]
    return card.stop_reason or STATUS_MEANS.get(card.status, card.status)


def argument_lines(card: CardRow) -> list[str]:
    """Each argument of the op's call on a line of its own: a tensor in full (dtype, shape,
    strides, storage offset, and whether it is contiguous), a scalar or list as it is."""

    def tensor(spec: dict) -> str:
        dims = "x".join(map(str, spec["shape"])) or "()"
        strides = "x".join(map(str, spec["stride"])) or "()"
        layout = "contiguous" if is_contiguous(spec["shape"], spec["stride"]) else \
            "not contiguous"
        offset = f", offset {spec['offset']}" if spec.get("offset") else ""
        return f"tensor {spec['dtype']} shape {dims} strides {strides} ({layout}{offset})"

    def one(spec: Any) -> str:
        return decode(spec, tensor, make_list=lambda items: "[" + "; ".join(items) + "]",
                      make_named=lambda kind, name: f"{kind} {name}", make_scalar=repr)

    c = card.card
    lines = [f"{i}  {one(spec)}" for i, spec in enumerate(c.args)]
    lines += [f"{name}={one(spec)}" for name, spec in sorted(c.kwargs.items())]
    return lines or ["(none)"]


def op_facts(card: CardRow, focused: bool, confirming: bool) -> list[tuple[str, str]]:
    """Everything the op list says of an op, in full and with its basis, as (label, text)
    rows: its status and why, its share, each figure with what it is relative to and who timed
    it, and its call's arguments (shapes, dtypes, strides)."""
    c = card.card
    kind = LIBRARIES.get(c.library, "a vendor library's kernel" if c.vendor else "")
    rows = [("op", f"{c.label} ({c.op})"),
            ("status", f"{CONFIRMING if confirming else card.status}: "
                       f"{card_reason(card, confirming)}")]
    if focused:
        rows.append(("focus", "the search is focused on this op"))
    rows += [("share", f"{percent_text(c.share)} of the profiled model's time ({fmt_us(c.total_us)}"
                       f" of GPU time in {c.calls} call{'s' if c.calls != 1 else ''} over one "
                       "model run)"),
             ("kind", c.library + (f": {kind}" if kind else ""))]
    if card.best_kernel is not None:
        over_compile = card.best_over_compiled
        rows.append(("×eager", f"{best_cell(card)}: the best kernel (node #{card.best_kernel}) "
                               "over eager, both the evaluator's device time per call"
                     + (f"; {fmt_speedup(over_compile)} over torch.compile" if over_compile
                        else "")))
    else:
        rows.append(("×eager", f"-: {no_best_text(card)}"))
    if c.eager_us is not None:
        rows.append(("eager", f"{fmt_us(c.eager_us)} per call: " + (
            "the evaluator's device time, the op alone (eval)" if card.baseline is not None
            else "the profile's GPU time inside the model run (prof), until the evaluator "
                 "times the op alone")))
    if c.compiled_us is not None:
        rows.append(("compile", f"{fmt_us(c.compiled_us)} per call: torch.compile of the op "
                                "alone, the evaluator's device time"))
    if c.floor_us is not None:
        rows.append(("floor", f"{fmt_us(c.floor_us)} per call: the physical floor (its bytes at "
                              "the copy bandwidth, or its FLOPs at the peak rate)"))
    if check := (card.baseline or {}).get("profile_check"):
        rows.append(("note", "no speedup shown: the evaluator's eager time disagrees with the "
                             f"profile ({check})"))
    rows.append(("searched", f"{card.spent} iteration{'s' if card.spent != 1 else ''}"))
    rows.append(("arguments", "\n".join(argument_lines(card))))
    if card.modules:
        rows.append(("called from", "\n".join(card.modules)))
    return [(label, inert(text)) for label, text in rows]


def percent_text(share: float) -> str:
    """A share as a percentage, five cells at most: ``30.0%``, ``100%``."""
    return "100%" if share >= 0.9995 else f"{100 * share:.1f}%"


def card_status(card: CardRow, focused: bool, confirming: bool = False) -> str:
    """A card's status and stop reason, after the focus mark where the search is focused on it;
    while one of its kernels is confirming (a would-be best, not yet its best), that alone."""
    text = CONFIRMING if confirming else card.status
    if card.stop_reason and not confirming:
        text += f": {card.stop_reason}"
    return f"◎ {text}" if focused else text


def session_cells(summary: SessionSummary, now: float, alive: bool) -> tuple[str, ...]:
    s = summary.session
    status = f"{s.status} ●" if alive else s.status
    return (str(s.id), s.model, s.gpu.get("name", "?"), status, f"{summary.targets}",
            f"{summary.nodes}", fmt_best_over_eager(summary.best_speedup), f"${s.usd_spent:.2f}",
            fmt_age(max(0.0, now - summary.last_activity)))


def focus_of(session: Session) -> int | None:
    """The card the search is focused on, if any."""
    return SessionSettings.from_stored(session.settings).search.focus


def sparkline(values: Sequence[float], width: int) -> str:
    """A series drawn in at most ``width`` cells, oldest left: the series is cut into that many
    consecutive runs, each drawn at its largest value, from the series' smallest value (▁) to its
    largest (█). A flat series is a flat low line; an empty one, or no width, is ``""``."""
    if not values or width <= 0:
        return ""
    cells = min(width, len(values))
    runs = [max(values[i * len(values) // cells:(i + 1) * len(values) // cells])
            for i in range(cells)]
    low, high = min(values), max(values)
    if high <= low:
        return SPARK_BLOCKS[0] * cells
    top = len(SPARK_BLOCKS) - 1
    return "".join(SPARK_BLOCKS[round((value - low) / (high - low) * top)] for value in runs)


def share_bar(share: float, width: int) -> str:
    """A fraction (clamped to 0..1) as a bar of exactly ``width`` cells, to an eighth of a
    cell: ``share_bar(0.4375, 8) == "███▌    "``."""
    eighths = round(min(max(share, 0.0), 1.0) * width * 8)
    full, part = divmod(eighths, 8)
    return (BAR_FULL * full + (BAR_EIGHTHS[part] if part else "")).ljust(width)


def model_projection(cards: Iterable[CardRow]) -> float | None:
    """The whole model's speedup if every op ran its best kernel so far: Amdahl's law over the
    profiled time shares, ops without a kernel faster than eager staying on eager. None until
    some op has one. ``kforge apply`` projects at most this: it also keeps kernels whose win
    lies inside the timing noise on eager."""
    winners = [CardChoice(row.card, True, "faster than eager", speedup=row.best_speedup)
               for row in cards if row.card.target and (row.best_speedup or 0.0) > 1.0]
    return projected_speedup(winners) if winners else None


# ----- node reports -----

def eval_report(detail: NodeDetail) -> str:
    """One node's outcome, as plain text: its sections (``kforge.core.report``)."""
    row = detail.row
    lines = [f"node #{row.id}  {row.action}  status: {row.status}",
             f"approach: {row.meta.get('approach', '-')}"]
    if row.summary:
        lines.append(f"summary: {row.summary}")
    outcome: EvalOutcome | None = detail.outcome
    if outcome is None:
        lines.append(no_outcome(row.in_flight))
        return "\n".join(lines)
    source = detail.candidate.source if detail.candidate is not None else ""
    for part in outcome_sections(outcome, source=source, used=row.confirmed):
        lines += ["", f"── {part.title} ──", *part.lines]
    return "\n".join(lines)


def llm_report(detail: NodeDetail) -> str:
    """The model exchanges that produced a node: each prompt and reply, with its cost."""
    if not detail.llm_calls:
        return "no language-model calls for this node (built-in library or test proposer)"
    parts = []
    for i, call in enumerate(detail.llm_calls, 1):
        head = (f"── call {i}: {call['model']}  {call['input_tokens']} in / "
                f"{call['output_tokens']} out tokens  ${call['usd']:.4f}  "
                f"{call['seconds']:.1f} s ──")
        body = [head, "", "» prompt", call["prompt"] or "(not recorded)", "", "» reply",
                call["reply"] or "(empty)"]
        if call["error"]:
            body += ["", f"» error: {call['error']}"]
        parts.append("\n".join(body))
    return "\n\n".join(parts)


def plan_text(candidate: Candidate | None) -> str:
    """A candidate's launch plan as indented JSON ("" for none)."""
    if candidate is None or candidate.plan is None:
        return ""
    return json.dumps(candidate.plan, indent=1) + "\n"
