"""Compile candidate CUDA source to a cubin with NVRTC (through ``cuda.core``), with a cache.

Works without a GPU: compiling to cubin for a named architecture needs only the NVRTC library and
the CUDA headers (``nvidia-cuda-nvrtc`` and ``nvidia-cuda-runtime`` wheels, or a CUDA toolkit).
The compile log keeps NVRTC's errors and warnings and ptxas' register, stack and spill report.

Candidate source is untrusted text: it may include nothing from the host. Before NVRTC sees it,
``check_source`` reads its preprocessing directives as the preprocessor will (line splices,
comments, raw strings, digraphs) and refuses every ``#include`` but the prelude's headers (in
``<>``: a quoted name is looked for in the current folder first), every file probe
(``__has_include``), token pasting (which makes names, such as a probe, only as it runs), every
``#pragma`` outside a short list and every ``_Pragma`` that is not a string literal, as a compile
error naming it. Where NVRTC could read the text otherwise (a raw string literal it would not
take as one), the source is refused: what it would read is not known; and every line that could
start a directive, whatever the lexing says it is (in a comment, a literal), is checked as one.
"""

from __future__ import annotations

import bisect
import hashlib
import io
import os
import re
import threading
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kforge.errors import KforgeError
from kforge.runtime.cubin_elf import cubin_kernels

# NVRTC has no C standard library headers: what kernels commonly reach for, defined here.
PRELUDE = r"""
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#ifndef INFINITY
#define INFINITY __int_as_float(0x7f800000)
#endif
#ifndef NAN
#define NAN __int_as_float(0x7fffffff)
#endif
#ifndef FLT_MAX
#define FLT_MAX 3.402823466e+38f
#endif
#ifndef FLT_MIN
#define FLT_MIN 1.175494351e-38f
#endif
typedef signed char int8_t;
typedef unsigned char uint8_t;
typedef short int16_t;
typedef unsigned short uint16_t;
typedef int int32_t;
typedef unsigned int uint32_t;
typedef long long int64_t;
typedef unsigned long long uint64_t;
#line 1 "candidate.cu"
"""

# The headers a candidate may name: the prelude's own (CUDA's half types; they include only
# their siblings in CUDA's include folder). kforge's library ships no headers of its own.
HEADERS = ("cuda_fp16.h", "cuda_bf16.h")
_FILE_DIRECTIVES = frozenset({"include", "include_next", "import", "embed"})
# re.ASCII: NVRTC's names are ASCII, so "é__has_include" is two tokens there, the probe the second
_FILE_PROBES = re.compile(r"\b(__has_include|__has_include_next|__has_embed)\b", re.ASCII)
# Token pasting: a name it makes (__has_include, _Pragma) exists only while NVRTC preprocesses.
_PASTING = re.compile(r"##|%:%:")
_PRAGMA_OPERATOR = re.compile(r"\b_Pragma\b", re.ASCII)
_PRAGMAS = frozenset({"unroll", "nounroll", "once", "pack", "message"})
_PRAGMA_PREFIXES = ("nv_diag_", "diag_")
# NVRTC's identifiers and numbers are ASCII: any other character is a token of its own there
# (a letter such as "é" is an "unrecognized token"), so it is one here too.
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_PP_NUMBER = re.compile(r"\.?[0-9](?:[eEpP][+-]|['A-Za-z0-9_.])*")
_RAW_PREFIXES = frozenset({"R", "u8R", "uR", "UR", "LR"})
# A raw string's opening as NVRTC surely reads one: a delimiter of at most 16 characters, here
# only letters, digits and _, then "(". With any other delimiter NVRTC ignores the raw string
# indicator and reads the text after it as code.
_RAW_OPENING = re.compile(r'"([A-Za-z0-9_]{0,16})\(')


class SourceRefused(ValueError):
    """Candidate source that names a file on the host or a pragma kforge does not pass on."""


# The longest source checked: no kernel comes near it, and a longer one is refused unread.
MAX_SOURCE_CHARS = 1 << 20
# How much of a directive (its name and operand) or of a _Pragma's operand is read, comments
# read as spaces, and across how many comments: an include, a pragma or a _Pragma reaching
# further is refused, as no kernel writes one.
_HEAD_CHARS, _PRAGMA_CHARS, _MOST_COMMENTS = 512, 256, 32
_PASTES = re.compile(r"(?=(##|%:%:))")  # every place a paste starts, overlapping ones too
_PRAGMA_OPERAND = re.compile(r"\s*\(\s*\"([^\"]*)\"\s*\)")
_PLAIN = re.compile(r"[^/\"'.A-Za-z0-9_]+")  # text no comment, literal, number or word starts in
_BLANKS = re.compile(r"[ \t\f\v]*")


def check_source(source: str) -> None:
    """Raise SourceRefused, naming the line and what it names, where ``source`` includes a
    header other than ``HEADERS``, probes for a file or uses a pragma kforge does not allow.
    Both ways a compiler may splice lines (a backslash right before the newline, or with
    spaces between) are checked, each read two ways: as the preprocessor reads it (comments and
    literals, ``_without_comments``), and directive by directive, blind to literals and to
    comments that span lines (``_BlindReading``), so that a directive NVRTC reads where this
    reading saw a comment or a literal (NVRTC lexes some text otherwise) is checked all the
    same. The work is linear in the source's length, which is at most ``MAX_SOURCE_CHARS``."""
    if len(source) > MAX_SOURCE_CHARS:
        raise SourceRefused(f"candidate.cu: the source is {len(source):,} characters, more than "
                            f"the {MAX_SOURCE_CHARS:,} a kernel may have")
    if "??=" in source or "??/" in source:
        raise SourceRefused("candidate.cu: trigraphs (??= ??/) are not allowed")
    text = source.replace("\r\n", "\n").replace("\r", "\n")
    for spliced in (text.replace("\\\n", ""), re.sub(r"\\[ \t]+\n", "", text).replace("\\\n", "")):
        for number, line in enumerate(_without_comments(spliced).split("\n"), 1):
            problem = _anywhere_problem(line) or _head_problem(line)
            if problem:
                raise SourceRefused(f"candidate.cu({number}): {problem}")
        if found := _BlindReading(spliced).first_problem():
            raise SourceRefused(f"candidate.cu({found[0]}): {found[1]}")


class _BlindReading:
    """Every directive that may start in a text whatever the lexing: after a line's start or a
    ``*/`` (NVRTC reads a ``#`` that follows a comment spanning lines as a directive's), past
    spaces and comments, a ``#`` or ``%:``; the directive runs to the end of its line, every
    comment in it (one spanning lines too) a space, as the preprocessor reads it.

    A directive is read as a chain of segments of the text, the comments between them read as
    spaces. Where one comment ends, the reading goes on the same way whichever directive led
    there, so what lies ahead of that point (its first file probe, paste or bad _Pragma; the
    first characters of what it reads) is found once and kept: however the directives overlap
    (a line of ``#a*/#a*/...``, or ``#/*`` on every line of a comment never closed), the work
    is linear in the text's length."""

    def __init__(self, text: str) -> None:
        self.text = text
        # where a segment ends: a line's end or a comment's start (overlapping ones too)
        self.ends = [m.start() for m in re.finditer(r"\n|(?=/[*/])", text)]
        self.closes = [m.start() for m in re.finditer(r"\*/", text)]
        self.lines = [m.start() for m in re.finditer(r"\n", text)]
        self.probes = [(m.start(), m.end(), f"{m.group(1)} is not allowed: kernels see no files")
                       for m in _FILE_PROBES.finditer(text)]
        self.pastes = [(m.start(), m.start() + len(m.group(1)),
                        f"token pasting ({m.group(1)}) is not allowed: a name it makes is seen "
                        "only as NVRTC preprocesses (__has_include probes a file)")
                       for m in _PASTES.finditer(text)]
        self.pragmas = [(m.start(), m.end(), problem) for m in _PRAGMA_OPERATOR.finditer(text)
                        if (problem := self._pragma_operand_problem(m.end()))]
        self._firsts: dict[int, dict[int, str | None]] = {}  # per kind of match, per point
        self._blanks: dict[int, int] = {}

    def first_problem(self) -> tuple[int, str] | None:
        """``(line number, problem)`` of the first directive with a problem, or None."""
        text, blank = self.text, self._blank_end
        starts = [0, *sorted([p + 1 for p in self.lines] + [p + 2 for p in self.closes])]
        for start in starts:
            begin = blank(start)
            if not text.startswith(("#", "%:"), begin):
                continue
            end, resumes, space = self._segment(begin)
            if resumes is None and end - begin <= _PRAGMA_CHARS:  # most are: one short line
                line = text[begin:end] + " " * space
                problem = _anywhere_problem(line) or _head_problem(line)
            else:
                problem = (self._first(begin, self.probes) or self._first(begin, self.pastes)
                           or self._first(begin, self.pragmas)
                           or _head_problem(*self._read(begin, _HEAD_CHARS)))
            if problem:
                return bisect.bisect_left(self.lines, begin) + 1, problem
        return None

    def _segment(self, p: int) -> tuple[int, int | None, bool]:
        """The segment the reading from ``p`` starts with: ``(end, resumes, space)``, where
        ``resumes`` is where the reading goes on past the comment at ``end`` (None: it ends
        there) and ``space`` whether a comment there is read as a space."""
        i = bisect.bisect_left(self.ends, p)
        if i == len(self.ends):
            return len(self.text), None, False
        end = self.ends[i]
        if self.text[end] == "\n":
            return end, None, False
        if self.text[end + 1] == "/":  # a line comment runs to the line's end
            return end, None, True
        j = bisect.bisect_left(self.closes, end + 2)
        return end, (self.closes[j] + 2 if j < len(self.closes) else None), True

    def _blank_end(self, p: int) -> int:
        """Past the spaces and closed comments at ``p`` (kept for every point on the way: a run
        of comments is passed once, however many points in it a directive may start at)."""
        passed = []
        while p not in self._blanks:
            passed.append(p)
            p = _BLANKS.match(self.text, p).end()
            if not self.text.startswith("/*", p):
                break
            j = bisect.bisect_left(self.closes, p + 2)
            if j == len(self.closes):
                break
            p = self.closes[j] + 2
        else:
            p = self._blanks[p]
        for point in passed:
            self._blanks[point] = p
        return p

    def _first(self, p: int, matches: list[tuple[int, int, str]]) -> str | None:
        """The problem of the first of ``matches`` (start, end, problem; sorted) that lies
        whole in a segment of the reading from ``p``."""
        known = self._firsts.setdefault(id(matches), {})
        passed, found = [], None
        while p not in known:
            passed.append(p)
            end, resumes, _ = self._segment(p)
            i = bisect.bisect_left(matches, (p,))
            while i < len(matches) and matches[i][0] < end:
                if matches[i][1] <= end:
                    found = matches[i][2]
                    break
                i += 1
            if found or resumes is None:
                break
            p = resumes
        else:
            found = known[p]
        for point in passed:
            known[point] = found
        return found

    def _read(self, p: int, limit: int) -> tuple[str, bool]:
        """The first ``limit`` characters the reading from ``p`` reads (comments as spaces), and
        whether that is all of it; across at most ``_MOST_COMMENTS`` comments."""
        parts, length, complete = [], 0, False
        for _ in range(_MOST_COMMENTS):
            end, resumes, space = self._segment(p)
            part = self.text[p:min(end, p + limit - length)] + " " * space
            parts.append(part)
            length += len(part)
            if length >= limit:
                break
            if resumes is None:
                complete = True
                break
            p = resumes
        return "".join(parts)[:limit], complete

    def _pragma_operand_problem(self, p: int) -> str | None:
        """Why the _Pragma whose operand the reading from ``p`` reads is refused, or None."""
        operand, _ = self._read(p, _PRAGMA_CHARS)
        pragma = _PRAGMA_OPERAND.match(operand)
        if pragma is None:  # a pragma a macro makes (_Pragma(#x)): what it says is unknown
            return "_Pragma is allowed only with a string literal, as in _Pragma(\"unroll\")"
        return _pragma_problem(pragma.group(1))


def _anywhere_problem(line: str) -> str | None:
    """A file probe, token pasting or a _Pragma kforge does not pass on anywhere in ``line``."""
    if probe := _FILE_PROBES.search(line):
        return f"{probe.group(1)} is not allowed: kernels see no files"
    if paste := _PASTING.search(line):
        return (f"token pasting ({paste.group(0)}) is not allowed: a name it makes is seen only "
                "as NVRTC preprocesses (__has_include probes a file)")
    for operator in _PRAGMA_OPERATOR.finditer(line):
        pragma = _PRAGMA_OPERAND.match(line, operator.end())
        if pragma is None:  # a pragma a macro makes (_Pragma(#x)): what it says is unknown
            return "_Pragma is allowed only with a string literal, as in _Pragma(\"unroll\")"
        if problem := _pragma_problem(pragma.group(1)):
            return problem
    return None


def _head_problem(line: str, complete: bool = True) -> str | None:
    """What a directive at the start of ``line`` names that kforge does not pass on: a file, or
    a pragma outside the short list. ``complete``: ``line`` is the whole directive, not only its
    start (then an include, which only a header named whole passes, is refused)."""
    stripped = line.lstrip()
    for hash_sign in ("#", "%:"):
        if stripped.startswith(hash_sign):
            rest = stripped[len(hash_sign):].lstrip()
            break
    else:
        return None
    name = _IDENTIFIER.match(rest)
    directive = name.group(0) if name else ""
    operand = rest[len(directive):].strip()
    if not complete and (directive in _FILE_DIRECTIVES or len(directive) == len(rest)):
        return (f"#{directive or '?'} {operand[:60]}... reaches further than a directive a "
                f"kernel writes ({_HEAD_CHARS} characters or {_MOST_COMMENTS} comments)")
    if directive in _FILE_DIRECTIVES:
        header = re.fullmatch(r"<([^<>]+)>|\"([^\"]+)\"", operand)
        named = (header.group(1) or header.group(2)) if header else None
        if directive == "include" and named in HEADERS:
            if operand.startswith("<"):
                return None
            # NVRTC looks for a quoted header in the folder it runs in first: a cuda_fp16.h
            # lying there (a link to any file) would be read
            return (f"#include {operand} is looked for in the folder kforge runs in: write "
                    f"#include <{named}>, or nothing (the prelude includes it already)")
        return (f"#{directive} {operand[:200]} is not available to kernels: they see only "
                f"{' and '.join(HEADERS)}, which the prelude includes already")
    if directive == "pragma":
        return _pragma_problem(operand)
    return None


def _pragma_problem(text: str) -> str | None:
    word = _IDENTIFIER.match(text.strip())
    name = word.group(0) if word else text.strip()
    if name in _PRAGMAS or name.startswith(_PRAGMA_PREFIXES):
        return None
    return f"#pragma {text.strip()[:60]} is not allowed in a kernel"


def _without_comments(text: str) -> str:
    """``text`` with every comment replaced by a space, as the preprocessor does before it reads
    directives (so a comment spanning lines joins them); string, character and raw string
    literals and numbers (``1'000``) are kept whole, so nothing in them starts a comment.
    SourceRefused for a raw string literal NVRTC may read otherwise (see ``_RAW_OPENING``) or
    that does not end: text hidden in it here could be code there."""
    out: list[str] = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if plain := _PLAIN.match(text, i):
            out.append(plain.group(0))
            i = plain.end()
        elif text.startswith("//", i):
            end = text.find("\n", i)
            i = n if end < 0 else end
            out.append(" ")
        elif text.startswith("/*", i):
            end = text.find("*/", i + 2)
            i = n if end < 0 else end + 2
            out.append(" ")
        elif number := _PP_NUMBER.match(text, i):
            out.append(number.group(0))
            i = number.end()
        elif word := _IDENTIFIER.match(text, i):
            out.append(word.group(0))
            i = word.end()
            if word.group(0) in _RAW_PREFIXES and text.startswith('"', i):
                stop = _raw_string_end(text, i)
                out.append(re.sub(r"[^\n]", " ", text[i:stop]))  # its lines still count
                i = stop
        elif c in "\"'":
            j = i + 1
            while j < n and text[j] != c and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            out.append(text[i:j + 1])
            i = j + 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


def _raw_string_end(text: str, quote: int) -> int:
    """Where the raw string literal whose opening quote is at ``quote`` ends (past its closing
    quote); SourceRefused where NVRTC may not read it as one, or it has no end."""
    opening = _RAW_OPENING.match(text, quote)
    if opening is None:
        raise SourceRefused(f"candidate.cu({text.count(chr(10), 0, quote) + 1}): a raw string "
                            "literal's delimiter may be at most 16 letters, digits or _ before "
                            "its (")
    closing = f"){opening.group(1)}\""
    end = text.find(closing, opening.end())
    if end < 0:
        raise SourceRefused(f"candidate.cu({text.count(chr(10), 0, quote) + 1}): a raw string "
                            f"literal that does not end (no {closing})")
    return end + len(closing)


# Options a candidate may ask for in meta["nvrtc_options"], as cuda.core ProgramOptions fields;
# anything else is refused.
_FLAG_OPTIONS = {"--use_fast_math": "use_fast_math",
                 "--extra-device-vectorization": "extra_device_vectorization",
                 "-lineinfo": "lineinfo"}
_MAX_REGISTERS = re.compile(r"^-maxrregcount=(\d{1,3})$")
# Compile for the architecture-specific target (sm_90 -> sm_90a): features only that exact GPU
# generation has (wgmma, setmaxnreg). The cubin runs on that architecture alone, as any does.
ARCH_SPECIFIC = "--arch-specific"

_PTXAS_FUNC = re.compile(r"Function properties for (\w+)")
_PTXAS_SPILL = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_PTXAS_REGS = re.compile(r"Used (\d+) registers")


@dataclass(frozen=True)
class KernelResources:
    registers: int = 0
    stack_bytes: int = 0
    spill_stores: int = 0
    spill_loads: int = 0
    spills_known: bool = True  # False where only the cubin spoke (spills are ptxas' word)


@dataclass(frozen=True)
class CompileResult:
    ok: bool
    arch: str
    log: str
    cubin: bytes = b""
    seconds: float = 0.0
    resources: dict[str, KernelResources] = field(default_factory=dict)
    cached: bool = False

    @property
    def spills(self) -> bool | None:
        """Whether a kernel spills registers to local memory; None where none that ptxas
        reported on does and its report misses some kernel."""
        if any(r.spill_stores or r.spill_loads for r in self.resources.values()):
            return True
        return None if any(not r.spills_known for r in self.resources.values()) else False


def parse_ptxas_report(log: str) -> dict[str, KernelResources]:
    """Per-kernel registers, stack and spills from ptxas' verbose report."""
    out: dict[str, KernelResources] = {}
    current: str | None = None
    spill: tuple[int, int, int] = (0, 0, 0)
    for line in log.splitlines():
        if m := _PTXAS_FUNC.search(line):
            current, spill = m.group(1), (0, 0, 0)
        elif (m := _PTXAS_SPILL.search(line)) and current:
            spill = (int(m.group(1)), int(m.group(2)), int(m.group(3)))
        elif (m := _PTXAS_REGS.search(line)) and current:
            out[current] = KernelResources(int(m.group(1)), *spill)
            current = None
    return out


def kernel_resources(log: str, cubin: bytes) -> dict[str, KernelResources]:
    """Every kernel of ``cubin`` with its resources: ptxas' report where the log holds one for
    it (the log may be empty, as a repeated compile's can be), else what the cubin itself says
    (registers and stack frame; spills unknown)."""
    out = parse_ptxas_report(log)
    for name, kernel in cubin_kernels(cubin).items():
        if name not in out:
            out[name] = KernelResources(kernel.registers, kernel.frame_bytes, spills_known=False)
    return out


def check_options(options: list[str]) -> list[str]:
    bad = [o for o in options
           if o not in _FLAG_OPTIONS and o != ARCH_SPECIFIC and not _MAX_REGISTERS.match(o)]
    if bad:
        raise ValueError(f"NVRTC options not allowed: {', '.join(bad)}")
    return list(options)


def nvrtc_options(arch: str, options: Iterable[str], include_dirs: list[str],
                  ptxas_verbose: bool = False) -> Any:
    """cuda.core ProgramOptions for a kernel: C++17 for ``arch``, with the allow-listed options
    (``--use_fast_math``, ``--extra-device-vectorization``, ``-lineinfo``, ``-maxrregcount=N``,
    ``--arch-specific``); ``ptxas_verbose`` adds ptxas' register and spill report to the log."""
    from cuda.core import ProgramOptions

    values: dict[str, Any] = {"ptxas_options": ["-v"]} if ptxas_verbose else {}
    for option in check_options(list(options)):
        if option in _FLAG_OPTIONS:
            values[_FLAG_OPTIONS[option]] = True
        elif option == ARCH_SPECIFIC:
            arch = arch if arch.endswith(("a", "f")) else arch + "a"
        else:
            values["max_register_count"] = int(_MAX_REGISTERS.match(option).group(1))
    return ProgramOptions(arch=arch, std="c++17", include_path=include_dirs, **values)


def cuda_include_dirs() -> list[str]:
    """Where cuda_fp16.h is: the nvidia-cuda-runtime wheel's headers, else $CUDA_HOME/include."""
    import os

    try:
        from cuda import pathfinder

        found = pathfinder.find_nvidia_header_directory("cudart")
    except Exception:  # pathfinder missing, or its own lookup error
        found = None
    if found:
        return [found]
    home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    if home and os.path.exists(os.path.join(home, "include", "cuda_fp16.h")):
        return [os.path.join(home, "include")]
    raise RuntimeError("CUDA headers (cuda_fp16.h) not found: pip install nvidia-cuda-runtime, "
                       "or set CUDA_HOME to a CUDA toolkit")


def compile_cubin(source: str, arch: str, prelude: str, options: Iterable[str] = ()) -> bytes:
    """Compile a kernel's source (after ``prelude``) to a cubin for ``arch`` with NVRTC.
    RuntimeError with NVRTC's log when it does not compile."""
    from cuda.core import Program

    try:
        check_source(source)
    except SourceRefused as exc:
        raise RuntimeError(f"NVRTC could not compile it for {arch}: {exc}") from None
    program = Program(prelude + source, code_type="c++",
                      options=nvrtc_options(arch, options, cuda_include_dirs()))
    try:
        return bytes(program.compile("cubin").code)
    except Exception as exc:  # NVRTCError carries the compile log
        raise RuntimeError(f"NVRTC could not compile it for {arch}: {exc}") from None



def _include_dirs() -> list[str]:
    try:
        return cuda_include_dirs()
    except RuntimeError as exc:
        raise KforgeError(f"{exc} (pip install 'kforge[cuda]')") from None


class Compiler:
    """NVRTC with an in-memory LRU cache and an optional on-disk cache of cubins.

    The cache key covers the source, architecture, options and the NVRTC version, so a cache
    directory may be shared between sessions and GPUs.
    """

    def __init__(self, cache_dir: Path | None = None, memory_entries: int = 256) -> None:
        self.cache_dir = cache_dir
        self._memory: OrderedDict[str, CompileResult] = OrderedDict()
        self._memory_entries = memory_entries
        self._lock = threading.Lock()
        self._includes: list[str] | None = None
        self._version: str | None = None

    def version(self) -> str:
        if self._version is None:
            from cuda.core import system

            try:
                self._version = ".".join(str(v) for v in system.get_nvrtc_version())  # type: ignore[attr-defined]
            except Exception:  # older cuda.core: fall back to the bindings
                from cuda.bindings import nvrtc

                _, major, minor = nvrtc.nvrtcVersion()
                self._version = f"{major}.{minor}"
        return self._version

    def key(self, source: str, arch: str, options: list[str]) -> str:
        text = "\0".join([self.version(), arch, *options, source])
        return hashlib.sha256(text.encode()).hexdigest()[:32]

    def compile(self, source: str, arch: str, options: list[str] | None = None) -> CompileResult:
        """Compile ``source`` (the prelude is added) for ``arch`` such as ``sm_90``."""
        import time

        options = check_options(options or [])
        try:
            check_source(source)
        except SourceRefused as exc:
            return CompileResult(ok=False, arch=arch, log=f"error: {exc}")
        key = self.key(source, arch, options)
        with self._lock:
            hit = self._memory.get(key)
            if hit is not None:
                self._memory.move_to_end(key)
                return CompileResult(**{**hit.__dict__, "cached": True})
        disk = self._load(key, arch)
        if disk is not None:
            self._remember(key, disk)
            return disk
        start = time.perf_counter()
        result = self._nvrtc(source, arch, options)
        result = CompileResult(**{**result.__dict__, "seconds": time.perf_counter() - start})
        self._remember(key, result)
        self._save(key, result)
        return result

    def _nvrtc(self, source: str, arch: str, options: list[str]) -> CompileResult:
        from cuda.core import Program

        if self._includes is None:
            self._includes = _include_dirs()
        opts = nvrtc_options(arch, options, self._includes, ptxas_verbose=True)
        log = io.StringIO()
        try:
            code = Program(PRELUDE + source, code_type="c++", options=opts).compile("cubin", logs=log)
        except Exception as exc:  # NVRTCError carries the compile log in its message
            text = str(exc)
            marker = "compilation log:"
            text = text.split(marker, 1)[1].strip() if marker in text else text
            return CompileResult(ok=False, arch=arch, log=_tidy(text))
        text = _tidy(log.getvalue())
        cubin = bytes(code.code)
        return CompileResult(ok=True, arch=arch, log=text, cubin=cubin,
                             resources=kernel_resources(text, cubin))

    def _remember(self, key: str, result: CompileResult) -> None:
        with self._lock:
            self._memory[key] = result
            self._memory.move_to_end(key)
            while len(self._memory) > self._memory_entries:
                self._memory.popitem(last=False)

    def _load(self, key: str, arch: str) -> CompileResult | None:
        if self.cache_dir is None:
            return None
        cubin, log = self.cache_dir / f"{key}.cubin", self.cache_dir / f"{key}.log"
        if not log.exists():
            return None
        text = log.read_text()
        data = cubin.read_bytes() if cubin.exists() else b""
        return CompileResult(ok=bool(data), arch=arch, log=text, cubin=data,
                             resources=kernel_resources(text, data), cached=True)

    def _save(self, key: str, result: CompileResult) -> None:
        if self.cache_dir is None:
            return
        self.cache_dir.mkdir(parents=True, exist_ok=True)
        # The log marks an entry complete (``_load`` looks for it), so it is written last.
        if result.ok:
            _write_whole(self.cache_dir / f"{key}.cubin", result.cubin)
        _write_whole(self.cache_dir / f"{key}.log", result.log.encode())


def _write_whole(path: Path, data: bytes) -> None:
    """Write ``path`` so that a reader in another process sees all of it or none: under a
    temporary name of this writer's own (two workers may compile one kernel at once), then
    renamed. A log read half-written once listed no kernels and no registers."""
    tmp = path.with_name(f"{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    tmp.write_bytes(data)
    tmp.replace(path)


def _tidy(log: str) -> str:
    """Drop NVRTC's own banner lines; keep errors, warnings and the ptxas report."""
    lines = [ln.rstrip() for ln in log.splitlines()]
    return "\n".join(ln for ln in lines if ln.strip()).strip()
