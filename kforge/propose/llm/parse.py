"""Turn a model's reply into candidate parts: the CUDA source, the launch plan, a name for the
approach and the model's notes.

Replies are messy: prose around the code, fences without a language, several drafts, reasoning in
``<think>`` sections, a fence cut off when the reply hit its token limit. The parser takes the last
JSON block that is a well-formed launch plan (``kforge.core.launch_plan.parse_plan``: data checked
against a closed grammar, never run) and the last CUDA block declaring the ``extern "C"
__global__`` kernels that plan launches. Whether the plan covers the card's variant is the
proposer's question; whether the code compiles or is correct is the evaluator's.

A reply is text the endpoint chose: the parser reads at most ``MAX_REPLY_CHARS`` of it, and its
work is linear in the reply's length (what it searches for is found in one pass, never by
scanning the rest of the reply again from each place a search could start).
"""

from __future__ import annotations

import bisect
import itertools
import re
from dataclasses import dataclass

from kforge.core.launch_plan import LaunchPlan, PlanError, parse_plan
from kforge.core.text import one_line

SOURCE_TAGS = frozenset({"cuda", "cu", "cuh", "cpp", "c++", "cxx", "cc", "c", "h", "hpp"})
PLAN_TAGS = frozenset({"json", "jsonc", "json5"})
APPROACH_CHARS = 80
NOTES_CHARS = 600
MAX_REPLY_CHARS = 1 << 20  # no kernel with its plan comes near it; a longer reply is refused

_FENCE_OPEN = re.compile(r"^ {0,3}(?P<fence>`{3,}|~{3,})\s*(?P<info>[^`\s]*)")
_THINK_OPEN = re.compile(r"<(think|thinking)>", re.I)
_THINK_CLOSE = re.compile(r"</(think|thinking)>", re.I)
# a comment; one never closed runs to the end (as a compiler reads it)
_COMMENT = re.compile(r"//[^\n]*|/\*.*?(?:\*/|\Z)", re.S)
_SEPARATOR = re.compile(r"[;{}]")
_BRACE = re.compile(r"[{}]")
_FUNCTION = re.compile(r"\bvoid\s+(?:__launch_bounds__\s*\([^()]*\)\s*)?([A-Za-z_]\w*)\s*\(")
_EXTERN_C = re.compile(r'extern\s+"C"')
_GLOBAL = re.compile(r"(?=__global__)")  # each, overlapping ones too
_EXTERN_C_BLOCK = re.compile(r'extern\s+"C"\s*\{')
_APPROACH = re.compile(r"[\s*_#>`-]*approach[\s*_`]*:", re.I)
_MARKUP = " \t\r\f\v*_`"  # what is around an approach's name: spaces and emphasis


class UnusableReply(ValueError):
    """The reply holds no usable candidate; the message says what is missing or wrong."""


@dataclass(frozen=True)
class CodeBlock:
    tag: str  # the fence's language, lower-cased ("" when none)
    code: str


@dataclass(frozen=True)
class ParsedReply:
    source: str
    plan: dict  # the launch plan in canonical form (``LaunchPlan.to_dict``)
    kernels: list[str]  # the extern "C" kernels the plan launches
    approach: str
    notes: str


def parse_reply(text: str) -> ParsedReply:
    """The candidate in a reply, or UnusableReply saying why there is none."""
    if not text.strip():
        raise UnusableReply("the reply is empty")
    if len(text) > MAX_REPLY_CHARS:
        raise UnusableReply(f"the reply is {len(text):,} characters, more than the "
                            f"{MAX_REPLY_CHARS:,} kforge reads")
    visible = strip_reasoning(text)
    blocks, prose = split_blocks(visible)
    if not blocks:
        if _THINK_OPEN.search(text) and not _THINK_CLOSE.search(text):
            raise UnusableReply("the reply ended inside its <think> section, before any code")
        raise UnusableReply("the reply has no code block")
    plan = _pick_plan([b.code for b in blocks if _is_plan(b)])
    kernels = list(plan.kernel_names())
    source = _pick_source([b.code for b in blocks if _is_source(b)], kernels)
    approach, notes = _approach(prose)
    return ParsedReply(source=source, plan=plan.to_dict(), kernels=kernels,
                       approach=one_line(approach, APPROACH_CHARS),
                       notes=one_line(notes, NOTES_CHARS))


def _approach(prose: str) -> tuple[str, str]:
    """The name the reply gives its approach (its first ``Approach: name`` line), and the
    prose without such lines."""
    names, notes = [], []
    for line in prose.split("\n"):
        named = _APPROACH.match(line)
        name = line[named.end():].strip(_MARKUP) if named else ""
        if name:
            names.append(name)
        else:
            notes.append(line)
    return (names[0] if names else ""), "\n".join(notes)


def plan_error_text(error: PlanError) -> str:
    """A plan error as one line starting ``launch plan:``, then the field at fault."""
    return f"launch plan: {error}" if error.path else str(error)


def strip_reasoning(text: str) -> str:
    """The reply without reasoning sections: closed ``<think>...</think>`` pairs, a leading section
    whose opening tag the chat template swallowed, and an unclosed section at the end."""
    text = _without_closed_reasoning(text)
    closes = list(_THINK_CLOSE.finditer(text))
    if closes:
        text = text[closes[-1].end():]
    if opened := _THINK_OPEN.search(text):
        text = text[: opened.start()]
    return text


def _without_closed_reasoning(text: str) -> str:
    """``text`` without each opening tag and the first closing tag of its name after it, and
    all between (an opening tag with no such closing tag stays), found in one pass."""
    closes: dict[str, list[tuple[int, int]]] = {}
    for close in _THINK_CLOSE.finditer(text):
        closes.setdefault(close.group(1).lower(), []).append((close.start(), close.end()))
    kept, at = [], 0
    for opening in _THINK_OPEN.finditer(text):
        if opening.start() < at:  # inside a section already left out
            continue
        ends = closes.get(opening.group(1).lower(), [])
        i = bisect.bisect_left(ends, (opening.end(),))
        if i < len(ends):
            kept.append(text[at:opening.start()])
            at = ends[i][1]
    return "".join(kept) + text[at:]


def split_blocks(text: str) -> tuple[list[CodeBlock], str]:
    """Fenced code blocks in order, and the prose around them. A fence left open runs to the end."""
    blocks: list[CodeBlock] = []
    prose: list[str] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        opened = _FENCE_OPEN.match(lines[i])
        if not opened:
            prose.append(lines[i])
            i += 1
            continue
        fence = opened.group("fence")
        close = re.compile(rf"^ {{0,3}}{re.escape(fence[0])}{{{len(fence)},}}\s*$")
        body: list[str] = []
        i += 1
        while i < len(lines) and not close.match(lines[i]):
            body.append(lines[i])
            i += 1
        i += 1  # past the closing fence
        code = "\n".join(body).strip("\n")
        if code.strip():
            blocks.append(CodeBlock(opened.group("info").lower(), code + "\n"))
    return blocks, "\n".join(prose)


def extern_c_kernels(source: str) -> list[str]:
    """Names of the ``extern "C" __global__`` functions in CUDA source, in order."""
    code = _COMMENT.sub("", source)
    closing = _matching_braces(code)
    opens = [0] * (len(code) + 1)  # +1 where an extern "C" block opens, -1 where it ends
    for m in _EXTERN_C_BLOCK.finditer(code):
        opens[m.end()] += 1
        opens[closing.get(m.end() - 1, len(code))] -= 1
    blocks = list(itertools.accumulate(opens))  # at each place, the blocks around it
    separators = [m.start() for m in _SEPARATOR.finditer(code)]
    globals_ = [(m.start(), m.start() + len("__global__")) for m in _GLOBAL.finditer(code)]
    externs = [(m.start(), m.end()) for m in _EXTERN_C.finditer(code)]
    names = []
    for m in _FUNCTION.finditer(code):
        # what declares it: the text since the statement or block before it
        start = separators[i - 1] + 1 if (i := bisect.bisect_left(separators, m.start())) else 0
        if _within(globals_, start, m.start()) and (blocks[m.start()] > 0
                                                     or _within(externs, start, m.start())):
            names.append(m.group(1))
    return names


def _within(found: list[tuple[int, int]], start: int, end: int) -> bool:
    """Whether one of ``found`` (sorted ``(start, end)`` spans) lies whole in ``[start, end)``."""
    i = bisect.bisect_left(found, (start,))
    return i < len(found) and found[i][1] <= end


def _pick_plan(candidates: list[str]) -> LaunchPlan:
    """The last block that is a well-formed launch plan; the last block's problem when none is."""
    if not candidates:
        raise UnusableReply("the reply has no ```json block with the launch plan")
    problem: PlanError | None = None
    for code in reversed(candidates):
        try:
            return parse_plan(code)
        except PlanError as exc:
            problem = problem or exc
    assert problem is not None
    raise UnusableReply(plan_error_text(problem))


def _pick_source(candidates: list[str], kernels: list[str]) -> str:
    """The last CUDA block declaring every kernel the plan launches."""
    if not candidates:
        raise UnusableReply("the reply has no CUDA source block")
    declared_anywhere: list[str] = []
    for code in reversed(candidates):
        declared = extern_c_kernels(code)
        if set(kernels) <= set(declared):
            return code
        declared_anywhere += declared
    if not declared_anywhere:
        raise UnusableReply('the CUDA source declares no extern "C" __global__ kernel')
    missing = [name for name in kernels if name not in declared_anywhere]
    if not missing:
        raise UnusableReply(f"the kernels the plan launches ({', '.join(kernels)}) are spread "
                            "over several CUDA blocks: one block must hold the complete source")
    declared = ", ".join(dict.fromkeys(declared_anywhere))
    raise UnusableReply(f'the plan launches {", ".join(missing)}, which no CUDA block declares '
                        f'extern "C" __global__ (declared: {declared})')


def _is_plan(block: CodeBlock) -> bool:
    if block.tag in PLAN_TAGS:
        return True
    return block.tag not in SOURCE_TAGS and block.code.lstrip().startswith("{")


def _is_source(block: CodeBlock) -> bool:
    if block.tag in SOURCE_TAGS:
        return True
    return block.tag not in PLAN_TAGS and "__global__" in block.code


def _matching_braces(code: str) -> dict[int, int]:
    """Where each ``{`` in ``code`` that is closed is closed, in one pass."""
    opened: list[int] = []
    closing: dict[int, int] = {}
    for brace in _BRACE.finditer(code):
        if brace.group(0) == "{":
            opened.append(brace.start())
        elif opened:
            closing[opened.pop()] = brace.start()
    return closing
