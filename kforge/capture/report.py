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
        rest = sum(c.share for c in cards) - sum(c.share for c in shown)
        lines.append(fmt_left_out(len(cards) - len(shown), rest))
    return "\n".join(lines)


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
