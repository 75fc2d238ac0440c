"""Live progress of a foreground search: a redrawn table on a terminal, plain lines otherwise."""

from __future__ import annotations

from rich.console import Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from kforge.cli.common import err, is_tty
from kforge.core.fmt import fmt_speedup
from kforge.core.text import one_line
from kforge.engine.engine import Snapshot


def render(snap: Snapshot, rows: int = 12) -> Group:
    head = Text(f"session {snap.session_id} [{snap.status}]  "
                f"{snap.iterations}/{snap.total} iterations  {snap.inflight} in flight  "
                + (f"{snap.confirming} confirming  " if snap.confirming else "")
                + f"${snap.usd:.2f}  {snap.elapsed_s / 60:.1f} min", style="bold")
    table = Table(box=None, header_style="bold", pad_edge=False)
    for name, justify in (("op", "left"), ("arguments", "left"), ("tries", "right"),
                          ("best", "right"), ("", "left")):
        table.add_column(name, justify=justify, no_wrap=True)
    for card in snap.cards[:rows]:
        table.add_row(card.op, one_line(card.signature, 48), str(card.spent),
                      fmt_speedup(card.best_speedup), card.phase)
    more = len(snap.cards) - rows
    parts = [head, table]
    if more > 0:
        parts.append(Text(f"  ... {more} more ops"))
    if snap.message:
        parts.append(Text(snap.message, style="dim"))
    return Group(*parts)


class Progress:
    """Feed it snapshots; it draws them. Use as a context manager around the search."""

    def __init__(self, quiet: bool = False) -> None:
        self.quiet = quiet
        self.live = Live(console=err, auto_refresh=False, transient=False) if is_tty() else None
        self._last_line = ""

    def __enter__(self) -> Progress:
        if self.live and not self.quiet:
            self.live.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.live and not self.quiet:
            self.live.__exit__(None, None, None)

    def __call__(self, snap: Snapshot) -> None:
        if self.quiet:
            return
        if self.live:
            self.live.update(render(snap), refresh=True)
            return
        line = (f"[{snap.status}] {snap.iterations}/{snap.total} iterations, best "
                + ", ".join(f"{card.op} {fmt_speedup(card.best_speedup)}"
                            for card in snap.cards[:4] if card.best_speedup))
        if line != self._last_line:
            self._last_line = line
            err.print(line)
