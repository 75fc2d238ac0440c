"""Numbers as people read them: speedups, microseconds, ages. Shared by the CLI and the TUI."""

from __future__ import annotations


def fmt_speedup(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"


def fmt_us(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value / 1000:.2f} ms" if value >= 1000 else f"{value:.1f} us"


def fmt_age(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f}s ago"
    if seconds < 5400:
        return f"{seconds / 60:.0f}m ago"
    if seconds < 172800:
        return f"{seconds / 3600:.0f}h ago"
    return f"{seconds / 86400:.0f}d ago"


def fmt_projection(projected: float, gains: dict[str, float]) -> str:
    """The op cards' projection (Amdahl over their device time) and its error against what each
    measured mode gained: ``projected 1.56x (device time; +29% vs eager +kforge's 1.21x)``."""
    errors = [f"{projected / gain - 1:+.0%} vs {mode}'s {fmt_speedup(gain)}"
              for mode, gain in gains.items() if gain > 0]
    return (f"projected {fmt_speedup(projected)} (device time"
            + ("; error " + ", ".join(errors) if errors else "") + ")")
