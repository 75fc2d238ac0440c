"""Eager PyTorch's own kernels for the op, with their times, as a prompt section: what the
candidate competes with, from the card's baseline. (What a prompt says about a measured kernel,
its evidence and profile, comes from ``kforge.core.report``.)
"""

from __future__ import annotations

from kforge.core.candidate import Baseline
from kforge.core.text import one_line

EAGER_KERNELS_SHOWN = 8


def eager_section(baseline: Baseline | None) -> str | None:
    """Eager PyTorch's kernels for the op, longest first: what the candidate competes with."""
    if baseline is None or not baseline.eager_kernels:
        return None
    kernels = baseline.eager_kernels
    lines = ["# Eager PyTorch's kernels for this call (torch.profiler; the timed eager call "
             f"takes {baseline.eager.median_us:.3g} us)"]
    for k in kernels[:EAGER_KERNELS_SHOWN]:
        launches = k.get("calls", 1)
        times = f" x{launches:g}" if launches != 1 else ""
        lines.append(f"- {one_line(str(k.get('name', '?')), 200)}{times}: "
                     f"{k.get('us', 0.0):.3g} us")
    if len(kernels) > EAGER_KERNELS_SHOWN:
        lines.append(f"- ... {len(kernels) - EAGER_KERNELS_SHOWN} more")
    return "\n".join(lines)
