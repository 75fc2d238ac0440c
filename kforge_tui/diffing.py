"""A node's kernel against its parent's, as a unified diff of the source and the launch plan."""

from __future__ import annotations

import difflib

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
