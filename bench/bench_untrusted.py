"""How kforge's work on text someone else wrote grows with the text: checking a candidate's CUDA
source before NVRTC reads it (``kforge.runtime.nvrtc.check_source``), parsing an LLM reply
(``kforge.propose.llm.parse.parse_reply``) and showing stored text (`kforge show` of a session,
and of a node, whose every stored text is that long), each at 1 KB, 100 KB and 1 MB, and past
its cap (refused, or cut, at once).

Each text comes in shapes a well-meaning author writes (a kernel, a reply around one) and in
shapes that made the work grow with the square of the length before (a line of directives each
after a comment's end, a comment never closed after every ``#``, ``<think>`` never closed,
declarations with no ``;`` between them). The table gives the CPU seconds of this process (the
database's thread included), which other processes on the machine do not change, and for a view
the bytes it printed.

    python3 bench/bench_untrusted.py                  # the table (about a minute on 2 cores)
    python3 bench/bench_untrusted.py --sizes 1024 65536 --json
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import io
import json
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

if __package__ in (None, ""):  # run as a script: the repository's kforge
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kforge.propose.llm.parse import MAX_REPLY_CHARS, UnusableReply, parse_reply  # noqa: E402
from kforge.propose.llm.prompt import EXAMPLE_PLAN, EXAMPLE_SOURCE, plan_json  # noqa: E402
from kforge.runtime.nvrtc import MAX_SOURCE_CHARS, SourceRefused, check_source  # noqa: E402

SIZES = (1 << 10, 100 << 10, 1 << 20)
KERNEL = """#include <cuda_fp16.h>
// y = 2x + 1, one element per thread
extern "C" __global__ void scale(const float* x, float* y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;  /* the element */
    #pragma unroll
    for (int j = 0; j < 1; ++j) { if (i < n) y[i] = x[i] * 2.0f + 1.0f; }
}
"""


def _fill(unit: str, size: int) -> str:
    return (unit * (size // len(unit) + 1))[:size] if unit else ""


def _reply(size: int, prose: str = "", code: str = "") -> str:
    """A reply of ``size`` characters: one kernel and its launch plan, with ``prose`` before it
    or ``code`` before the kernel in its block repeated to fill it."""
    def made(room: int) -> str:
        return (f"{_fill(prose, room)}\nApproach: softmax by rows\n```cuda\n{_fill(code, room)}"
                f"{EXAMPLE_SOURCE}```\n```json\n{plan_json(EXAMPLE_PLAN)}\n```\n")

    return made(max(0, size - len(made(0))))


# name: (what it is, the text of a given size)
SOURCES: dict[str, tuple[str, Callable[[int], str]]] = {
    "kernel": ("a kernel, repeated", lambda n: _fill(KERNEL, n)),
    "directives": ("#a*/ repeated on one line", lambda n: _fill("#a*/", n)),
    "open-comments": ("#x/* on every line, never closed", lambda n: _fill("#x/*\n", n)),
    "hash-lines": ("# on every line", lambda n: _fill("#\n", n)),
}
REPLIES: dict[str, tuple[str, Callable[[int], str]]] = {
    "prose": ("prose around one kernel", lambda n: _reply(n, prose="Words about it.\n")),
    "open-think": ("<think> never closed", lambda n: _reply(n, prose="<think>")),
    "extern-blocks": ('extern "C" { repeated in the source',
                      lambda n: _reply(n, code='extern "C" {')),
    "declarations": ("void f( repeated, no ; between", lambda n: _reply(n, code="void f(")),
}


def check_time(check: Callable[[str], object], text: str) -> tuple[float, str]:
    """CPU seconds of one ``check(text)``, and how it ended."""
    started = time.process_time()
    try:
        check(text)
        ended = "passed"
    except (SourceRefused, UnusableReply) as exc:
        said = str(exc).split(": ", 1)[-1]
        ended = "refused: " + (said if len(said) <= 80 else said[:77] + "...")
    return time.process_time() - started, ended


def show_rows(sizes: list[int]) -> list[dict]:
    """`kforge show` of a session and of a node whose stored texts are each ``size`` long."""
    from kforge.cli.main import main

    rows = []
    for size in sizes:
        with tempfile.TemporaryDirectory() as folder:
            db = Path(folder) / "k.db"
            node = asyncio.run(_stored(db, size))
            for view, argv in (("session", ["show", "1"]),
                               ("node", ["show", "1", "--node", str(node)])):
                printed = io.StringIO()
                started = time.process_time()
                with contextlib.redirect_stdout(printed):
                    code = main([*argv, "--db", str(db)])
                rows.append({"what": "show", "shape": view, "size": size,
                             "cpu_s": time.process_time() - started,
                             "ended": f"exit {code}, printed {len(printed.getvalue()):,} B"})
    return rows


async def _stored(db: Path, size: int) -> int:
    """A session whose model name, error, op card stop reason, and a node whose source, summary,
    compile log, approach, prompt, reply and call error are each ``size`` characters."""
    from kforge.core.candidate import Candidate, EvalOutcome, EvalStatus, LlmCall
    from kforge.store import SessionStatus, Store
    from tests.doubles import sample_cards

    text = _fill("stored text, ", size)
    async with await Store.open(db) as store:
        sid = await store.create_profiled_session(text, {}, {"name": "g"}, sample_cards())
        await store.set_session_status(sid, SessionStatus.FAILED, text)
        card = (await store.list_cards(sid))[0].id
        await store.update_card(card, stop_reason=text)
        node = await store.add_node(sid, card, None, "new")
        call = LlmCall(model="m", input_tokens=1, output_tokens=1, usd=0.0, seconds=1.0,
                       prompt=text, reply=text, error=text)
        await store.set_candidate(node, Candidate(text, plan=None, meta={"approach": text}),
                                  [call])
        await store.finish_node(node, EvalOutcome(EvalStatus.COMPILE_ERROR, summary=text,
                                                  compile_log=text), None)
        return node


def measure(sizes: list[int]) -> list[dict]:
    rows = []
    for what, shapes, check, cap in (("source", SOURCES, check_source, MAX_SOURCE_CHARS),
                                     ("reply", REPLIES, parse_reply, MAX_REPLY_CHARS)):
        for shape, (_, make) in shapes.items():
            for size in [*sizes, 2 * cap]:
                cpu_s, ended = check_time(check, make(size))
                rows.append({"what": what, "shape": shape, "size": size, "cpu_s": cpu_s,
                             "ended": ended})
    return rows + show_rows(sizes)


def table(rows: list[dict]) -> str:
    lines = ["| input | shape | size | CPU s | how it ended |", "| --- | --- | ---: | ---: | --- |"]
    described = {**{k: v[0] for k, v in SOURCES.items()}, **{k: v[0] for k, v in REPLIES.items()},
                 "session": "`kforge show 1`", "node": "`kforge show 1 --node N`"}
    for row in rows:
        size = row["size"]
        shown = f"{size >> 20} MiB" if size >= 1 << 20 else f"{size >> 10} KiB"
        lines.append(f"| {row['what']} | {described[row['shape']]} | {shown} | "
                     f"{row['cpu_s']:.3f} | {row['ended']} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=list(SIZES),
                        help="text lengths in characters (default: 1 KiB, 100 KiB, 1 MiB)")
    parser.add_argument("--json", action="store_true", help="the rows as JSON")
    args = parser.parse_args(argv)
    rows = measure(args.sizes)
    print(json.dumps(rows) if args.json else table(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
