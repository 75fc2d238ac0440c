"""Numbers as people read them: speedups, microseconds, ages, whole-model measurements. Shared
by the CLI and the TUI."""

from __future__ import annotations

import math

from kforge.core.candidate import KFORGE_SUFFIX, Headline, ModelMeasured


def fmt_speedup(value: float | None) -> str:
    """``1.42x``. A speedup that two decimals would show as ``1.00x`` but is not 1 keeps a third
    decimal, rounded away from 1 (``0.997x``, ``1.001x``): a kernel slower than its baseline never
    reads as 1.00x."""
    if value is None:
        return "-"
    text = f"{value:.2f}x"
    if text != "1.00x" or value == 1.0:
        return text
    thousandths = math.floor(value * 1000) if value < 1.0 else math.ceil(value * 1000)
    return f"{thousandths / 1000:.3f}x"


def fmt_best_over_eager(speedup: float | None) -> str:
    """A session's best op kernel's speedup over eager, ``-`` where none beats eager."""
    return fmt_speedup(speedup) if speedup is not None and speedup > 1.0 else "-"


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


def fmt_left_out(count: int, share: float, what: str = "op variant") -> str:
    """The last line of a table of the largest ops, on the ``count`` ``what``s it leaves out:
    ``... 209 more op variants (51.4% of the time)``."""
    return f"... {count} more {what}{'' if count == 1 else 's'} ({share:.1%} of the time)"


def fmt_projection(projected: float, gains: dict[str, float]) -> str:
    """The op cards' projection (Amdahl over their device time: the eagerly run model with
    every winner, over eager) and its error against what each measured mode gained:
    ``projected 1.56x over eager (device time; error +29% vs eager+kforge's 1.21x)``."""
    errors = [f"{projected / gain - 1:+.0%} vs {mode}'s {fmt_speedup(gain)}"
              for mode, gain in gains.items() if gain > 0]
    return (f"projected {fmt_speedup(projected)} over eager (device time"
            + ("; error " + ", ".join(errors) if errors else "") + ")")


def fmt_headline(headline: Headline, checked: bool = True) -> tuple[str, str]:
    """A whole-model headline (``ModelMeasured.headline``) as (full, short) text: both say it is
    the e2e measurement and what it is relative to. ``checked``: the measurement counted the
    kernels each mode ran (one stored before it did, holds neither those counts nor the modes'
    spreads: its figure is said to be unchecked)."""
    base, mode = headline.baseline, headline.mode
    if headline.verdict == "no kernels" or headline.ratio is None:
        return "e2e: no kforge kernel ran in any mode", "e2e: no kernels"
    ratio = f"{headline.ratio:.2f}x"
    if not checked:
        return (f"e2e {mode} {ratio} vs {base} (best without kforge), unchecked: kernels run "
                "and noise not recorded, run kforge e2e again",
                f"e2e {ratio} vs {base} (unchecked)")
    if headline.verdict == "noise":
        spread = f", p90/p10 {headline.spread:.2f}" if headline.spread is not None else ""
        return (f"e2e {mode} ≈ {base} (best without kforge): {ratio}, within noise{spread}",
                f"e2e ≈{ratio} vs {base} (noise)")
    if headline.verdict == "loss":
        return (f"e2e {mode} {ratio} vs {base}: best without kforge is faster",
                f"e2e {ratio} vs {base}")
    return (f"e2e {mode} {ratio} over {base} (best without kforge)", f"e2e {ratio} vs {base}")


def fmt_mode_gains(measured: ModelMeasured) -> str:
    """What kforge's kernels gained in each ``+kforge`` mode over the same mode without them:
    the gain, ``no kernels`` where none ran, ``within noise`` where both modes were timed and
    kernels ran but the modes' noise allows no verdict (a measurement stored before kernels
    were counted knows only its gains); empty where no mode says anything."""
    timed = measured.times_us
    said = []
    for mode in [m for m in timed if m.endswith(KFORGE_SUFFIX)] or list(measured.gains):
        if mode in measured.gains:
            said.append(f"{mode} {fmt_speedup(measured.gains[mode])}")
        elif measured.ran_kernels(mode) is False:
            said.append(f"{mode} no kernels")
        elif mode.removesuffix(KFORGE_SUFFIX) in timed and measured.kernels:
            said.append(f"{mode} within noise")
    return (f"per mode: {', '.join(said)} (each over the same mode without kforge)"
            if said else "")
