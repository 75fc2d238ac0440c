"""Turn a model's reply into candidate parts: the CUDA source, the Python launcher, a name for the
approach and the model's notes.

Replies are messy: prose around the code, fences without a language, several drafts, reasoning in
``<think>`` sections, a fence cut off when the reply hit its token limit. The parser takes the last
launcher that defines ``launch`` (checked with ``ast``; nothing is executed) and the last CUDA block
declaring the ``extern "C" __global__`` kernels that launcher calls. Whether the code compiles or is
correct is the evaluator's question, not this module's.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass

from kforge.propose.llm.text import one_line

SOURCE_TAGS = frozenset({"cuda", "cu", "cuh", "cpp", "c++", "cxx", "cc", "c", "h", "hpp"})
LAUNCHER_TAGS = frozenset({"python", "py", "python3", "py3"})
LAUNCH = "launch"
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
_DEFINES_LAUNCH = re.compile(rf"^def\s+{LAUNCH}\s*\(", re.M)
_APPROACH = re.compile(r"^[\s*_#>`-]*approach[\s*_`]*:[\s*_`]*(?P<name>.+?)[\s*_`]*$", re.I | re.M)


class UnusableReply(ValueError):
    """The reply holds no usable candidate; the message says what is missing."""


@dataclass(frozen=True)
class CodeBlock:
    tag: str  # the fence's language, lower-cased ("" when none)
    code: str


@dataclass(frozen=True)
class ParsedReply:
    source: str
    launcher: str
    kernels: list[str]  # the extern "C" kernels the launcher calls
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
    launcher, calls = _pick_launcher([b.code for b in blocks if _is_launcher(b)])
    source = _pick_source([b.code for b in blocks if _is_source(b)], calls)
    approach_match = _APPROACH.search(prose)
    approach = approach_match.group("name").strip() if approach_match else ""
    notes = _APPROACH.sub("", prose) if approach_match else prose
    return ParsedReply(source=source, launcher=launcher, kernels=calls,
                       approach=one_line(approach, APPROACH_CHARS),
                       notes=one_line(notes, NOTES_CHARS))


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


def launcher_kernel_calls(launcher: str) -> list[str]:
    """Names the launcher reaches on its kernels object (``kernels.NAME`` or
    ``getattr(kernels, "NAME")``), in order; UnusableReply when it defines no ``launch``."""
    try:
        tree = ast.parse(launcher)
    except SyntaxError as exc:
        raise UnusableReply(f"the launcher is not valid Python (line {exc.lineno}: {exc.msg})") from None
    launch = next((node for node in tree.body
                   if isinstance(node, ast.FunctionDef) and node.name == LAUNCH), None)
    if launch is None:
        raise UnusableReply("the Python block does not define launch(kernels, *args, **kwargs)")
    params = launch.args.posonlyargs + launch.args.args
    if not params:
        raise UnusableReply("launch() must take the compiled kernels as its first parameter")
    kernels = params[0].arg
    names: list[str] = []
    for node in ast.walk(launch):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) \
                and node.value.id == kernels:
            names.append(node.attr)
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
              and node.func.id == "getattr" and len(node.args) >= 2
              and isinstance(node.args[0], ast.Name) and node.args[0].id == kernels
              and isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str)):
            names.append(node.args[1].value)
    if not names:
        raise UnusableReply(
            f"launch() never launches a kernel (expected {kernels}.NAME(grid, block, ...))")
    return list(dict.fromkeys(names))


def _pick_launcher(candidates: list[str]) -> tuple[str, list[str]]:
    """The last launcher block that is usable, with the kernels it calls; the last block's
    problem when none is."""
    if not candidates:
        raise UnusableReply("the reply has no Python launcher block defining launch()")
    problem: UnusableReply | None = None
    for code in reversed(candidates):
        try:
            return code, launcher_kernel_calls(code)
        except UnusableReply as exc:
            problem = problem or exc
    assert problem is not None
    raise problem


def _pick_source(candidates: list[str], calls: list[str]) -> str:
    """The last CUDA block declaring every kernel the launcher calls."""
    if not candidates:
        raise UnusableReply("the reply has no CUDA source block")
    declared_anywhere: list[str] = []
    for code in reversed(candidates):
        declared = extern_c_kernels(code)
        if set(calls) <= set(declared):
            return code
        declared_anywhere += declared
    if not declared_anywhere:
        raise UnusableReply('the CUDA source declares no extern "C" __global__ kernel')
    missing = [name for name in calls if name not in declared_anywhere]
    if not missing:
        raise UnusableReply(f"the kernels the launcher calls ({', '.join(calls)}) are spread over "
                            "several CUDA blocks: one block must hold the complete source")
    declared = ", ".join(dict.fromkeys(declared_anywhere))
    raise UnusableReply(f'the launcher calls {", ".join(missing)}, which no CUDA block declares '
                        f'extern "C" __global__ (declared: {declared})')


def _is_launcher(block: CodeBlock) -> bool:
    if block.tag in LAUNCHER_TAGS:
        return True
    return block.tag not in SOURCE_TAGS and _DEFINES_LAUNCH.search(block.code) is not None


def _is_source(block: CodeBlock) -> bool:
    if block.tag in SOURCE_TAGS:
        return True
    return block.tag not in LAUNCHER_TAGS and "__global__" in block.code


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

