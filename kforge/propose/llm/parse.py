"""Turn a model's reply into candidate parts: the CUDA source, the launch plan, a name for the
approach and the model's notes.

Replies are messy: prose around the code, fences without a language, several drafts, reasoning in
``<think>`` sections, a fence cut off when the reply hit its token limit. The parser takes the last
JSON block that is a well-formed launch plan (``kforge.core.launch_plan.parse_plan``: data checked
against a closed grammar, never run) and the last CUDA block declaring the ``extern "C"
__global__`` kernels that plan launches. Whether the plan covers the card's variant is the
proposer's question; whether the code compiles or is correct is the evaluator's.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from kforge.core.launch_plan import LaunchPlan, PlanError, parse_plan
from kforge.propose.llm.text import one_line

SOURCE_TAGS = frozenset({"cuda", "cu", "cuh", "cpp", "c++", "cxx", "cc", "c", "h", "hpp"})
PLAN_TAGS = frozenset({"json", "jsonc", "json5"})
APPROACH_CHARS = 80
NOTES_CHARS = 600

_FENCE_OPEN = re.compile(r"^ {0,3}(?P<fence>`{3,}|~{3,})\s*(?P<info>[^`\s]*)")
_THINK = re.compile(r"<(think|thinking)>.*?</\1>", re.S | re.I)
_THINK_OPEN = re.compile(r"<(think|thinking)>", re.I)
_THINK_CLOSE = re.compile(r"</(think|thinking)>", re.I)
_COMMENT = re.compile(r"//[^\n]*|/\*.*?\*/", re.S)
_FUNCTION = re.compile(r"\bvoid\s+(?:__launch_bounds__\s*\([^()]*\)\s*)?([A-Za-z_]\w*)\s*\(")
_EXTERN_C = re.compile(r'extern\s+"C"')
_EXTERN_C_BLOCK = re.compile(r'extern\s+"C"\s*\{')
_APPROACH = re.compile(r"^[\s*_#>`-]*approach[\s*_`]*:[\s*_`]*(?P<name>.+?)[\s*_`]*$", re.I | re.M)


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
    visible = strip_reasoning(text)
    blocks, prose = split_blocks(visible)
    if not blocks:
        if _THINK_OPEN.search(text) and not _THINK_CLOSE.search(text):
            raise UnusableReply("the reply ended inside its <think> section, before any code")
        raise UnusableReply("the reply has no code block")
    plan = _pick_plan([b.code for b in blocks if _is_plan(b)])
    kernels = list(plan.kernel_names())
    source = _pick_source([b.code for b in blocks if _is_source(b)], kernels)
    approach_match = _APPROACH.search(prose)
    approach = approach_match.group("name").strip() if approach_match else ""
    notes = _APPROACH.sub("", prose) if approach_match else prose
    return ParsedReply(source=source, plan=plan.to_dict(), kernels=kernels,
                       approach=one_line(approach, APPROACH_CHARS),
                       notes=one_line(notes, NOTES_CHARS))


def plan_error_text(error: PlanError) -> str:
    """A plan error as one line starting ``launch plan:``, then the field at fault."""
    return f"launch plan: {error}" if error.path else str(error)


def strip_reasoning(text: str) -> str:
    """The reply without reasoning sections: closed ``<think>...</think>`` pairs, a leading section
    whose opening tag the chat template swallowed, and an unclosed section at the end."""
    text = _THINK.sub("", text)
    closes = list(_THINK_CLOSE.finditer(text))
    if closes:
        text = text[closes[-1].end():]
    if opened := _THINK_OPEN.search(text):
        text = text[: opened.start()]
    return text


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
    blocks = [(m.end(), _matching_brace(code, m.end() - 1)) for m in _EXTERN_C_BLOCK.finditer(code)]
    names = []
    for m in _FUNCTION.finditer(code):
        start = max(code.rfind(ch, 0, m.start()) for ch in ";{}") + 1
        prefix = code[start:m.start()]
        in_block = any(lo <= m.start() < hi for lo, hi in blocks)
        if "__global__" in prefix and (in_block or _EXTERN_C.search(prefix)):
            names.append(m.group(1))
    return names


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


def _matching_brace(code: str, open_at: int) -> int:
    depth = 0
    for i in range(open_at, len(code)):
        if code[i] == "{":
            depth += 1
        elif code[i] == "}":
            depth -= 1
            if depth == 0:
                return i
    return len(code)
