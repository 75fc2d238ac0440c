"""Text trimming shared by the prompt builder, the reply parser and error reports."""

from __future__ import annotations


def one_line(text: str, limit: int) -> str:
    """``text`` with its whitespace collapsed, cut to ``limit`` characters with an ellipsis."""
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def head_and_tail(text: str, limit: int) -> str:
    """``text`` cut to about ``limit`` characters, keeping the start (a compiler's first errors)
    and the end (its summary), with a marker saying how much was left out."""
    text = text.strip()
    if len(text) <= limit:
        return text
    head, tail = text[: limit * 3 // 4], text[-(limit // 4):]
    return f"{head}\n[... {len(text) - len(head) - len(tail)} characters left out ...]\n{tail}"
