"""A node's kernel against its parent's, as a unified diff of the source and the launch plan."""

from __future__ import annotations

import difflib

from rich.cells import chop_cells

from kforge.core.candidate import Candidate
from kforge_tui.format import plan_text


def candidate_diff(parent: Candidate | None, child: Candidate, parent_name: str,
                   child_name: str) -> list[str]:
    """Unified diff lines (no trailing newlines); a root node is diffed against nothing."""
    lines: list[str] = []
    for part, old, new in (("kernel.cu", parent.source if parent else "", child.source),
                           ("plan.json", plan_text(parent), plan_text(child))):
        lines += difflib.unified_diff(old.splitlines(), new.splitlines(),
                                      fromfile=f"{parent_name}/{part}",
                                      tofile=f"{child_name}/{part}", lineterm="")
    return lines


def line_kind(line: str) -> str:
    """How a diff line is coloured: header, hunk, added, removed or context."""
    if line.startswith(("+++", "---")):
        return "header"
    if line.startswith("@@"):
        return "hunk"
    if line.startswith("+"):
        return "added"
    if line.startswith("-"):
        return "removed"
    return "context"


def wrapped(line: str, width: int) -> list[str]:
    """A diff line cut into rows of at most ``width`` cells. Each row of an added, removed or
    context line is led by the line's own mark (``+``, ``-`` or a space), so that a wrapped added
    line still reads as added; a header or hunk line continues under its text."""
    if width < 2 or len(line) <= width:
        return [line]
    kind = line_kind(line)
    mark = line[:1] if kind in ("added", "removed") else " "
    first, rest = line[:width], line[width:]
    return [first, *(mark + chunk for chunk in chop_cells(rest, width - 1))]
