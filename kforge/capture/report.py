"""Plain-text op tables of a profile, for the command line and the benchmark scripts."""

from __future__ import annotations

from kforge.capture.profiler import Profile
from kforge.core.fmt import fmt_left_out
from kforge.core.opcard import OpCard

# "profile us": the profile's time per call in the model run (GPU time, or CPU time on the CPU),
# not the evaluator's device time of the op alone that `kforge show` heads "eager device".
HEADER = ("share", "calls", "profile us", "library", "op", "arguments", "issued by")
SIGNATURE_WIDTH = 56


def module_summary(paths: list[str]) -> str:
    """``model.layers.0.mlp`` or ``model.layers.0.mlp (+39)`` for a card issued from many places."""
    if not paths:
        return "-"
    first = paths[0] or "(model)"
    return first if len(paths) == 1 else f"{first} (+{len(paths) - 1})"


def card_row(card: OpCard, modules: list[str]) -> tuple[str, ...]:
    signature = card.signature
    if len(signature) > SIGNATURE_WIDTH:
        signature = signature[: SIGNATURE_WIDTH - 3] + "..."
    return (f"{card.share:.1%}", str(card.calls),
            "-" if card.eager_us is None else f"{card.eager_us:.1f}", card.library,
            card.short_op, signature, module_summary(modules))


def format_table(result: Profile, top: int = 15, targets_only: bool = False) -> str:
    """The ``top`` cards by time share as aligned text, with a line on what is left out."""
    cards = [c for c in result.cards if c.target or not targets_only]
    shown = sorted(cards, key=lambda c: -c.share)[:top]
    rows = [HEADER] + [card_row(c, result.modules.get(c.key, [])) for c in shown]
    widths = [max(len(row[i]) for row in rows) for i in range(len(HEADER))]
    right = {0, 1, 2}
    lines = ["  ".join(cell.rjust(w) if i in right else cell.ljust(w)
                       for i, (cell, w) in enumerate(zip(row, widths, strict=True))).rstrip()
             for row in rows]
    if len(cards) > len(shown):
        lines.append(fmt_left_out(len(cards) - len(shown), left_out_share(cards, shown)))
    return "\n".join(lines)


def left_out_share(cards: list[OpCard], shown: list[OpCard]) -> float:
    """The share of the time in ``cards`` that the rows of ``shown`` leave out. A region card's
    share is time its op cards' shares hold too, so the op cards' time is the whole, and a shown
    region covers the op cards it calls (their calls elsewhere, if any, are taken as covered)."""
    inside: dict[str, list[str]] = {}  # op card key -> the keys of the regions that call it
    for card in cards:
        for member in (card.region or {}).get("members", ()):
            inside.setdefault(member, []).append(card.key)
    shown_keys = {c.key for c in shown}
    covered = sum(c.share for c in shown
                  if c.region is not None or not shown_keys.intersection(inside.get(c.key, ())))
    return max(0.0, sum(c.share for c in cards if c.region is None) - covered)


def library_shares(result: Profile) -> dict[str, float]:
    """Share of operator time per library (``native``, ``cublas``, ..., ``view``), largest first."""
    shares: dict[str, float] = {}
    for card in result.cards:
        shares[card.library] = shares.get(card.library, 0.0) + card.share
    return dict(sorted(shares.items(), key=lambda item: -item[1]))


def summary_line(name: str, settings: dict, result: Profile) -> str:
    """One line: model, settings, card counts and the total operator time."""
    targets = sum(1 for c in result.cards if c.target)
    shown = " ".join(f"{k}={settings[k]}" for k in ("dtype", "device", "batch", "seq_len", "mode",
                                                       "layers") if settings.get(k) is not None)
    unit = "GPU" if result.timing == "cuda" else "CPU"
    return (f"{name} ({shown}): {len(result.cards)} op variants, {targets} targets, "
            f"{result.total_us / 1000:.2f} ms of {unit} operator time per forward")
