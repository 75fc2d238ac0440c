"""Candidate source includes nothing from the host: every way to name a file to the preprocessor
(includes, computed or spliced or hidden behind comments and digraphs, file probes, pragmas) is
a compile error naming it, before NVRTC runs; ordinary kernels pass."""

from __future__ import annotations

import pytest

from kforge.runtime.nvrtc import SourceRefused, check_source
from tests.eval import candidates as C

REFUSED = {
    "absolute": '#include "/home/u/.config/kforge/config.toml"\n',
    "angle": "#  include </etc/passwd>\n",
    "relative": '#include "../../secrets.h"\n',
    "macro": '#define F "/etc/passwd"\n#include F\n',
    "splice": '#inc\\\nlude "/etc/passwd"\n',
    "splice-with-space": '#include \\ \n"/etc/passwd"\n',
    "comment-between": '#/* a comment\n */include "/etc/passwd"\n',
    "digraph": '%:include "/etc/passwd"\n',
    "trigraph": '??=include "/etc/passwd"\n',
    "include-next": "#include_next <cuda_fp16.h>\n",
    "embed": '#embed "/etc/passwd"\n',
    "import": '#import "/etc/passwd"\n',
    "has-include": '#if __has_include("/etc/shadow")\n#endif\n',
    "pragma-dependency": '#pragma GCC dependency "/etc/passwd"\n',
    "pragma-operator": '_Pragma("GCC dependency \\"/etc/passwd\\"")\n',
    "after-raw-string": 'const char* s = R"x(a"/*)x";\n#include "/etc/passwd"\n// */\n',
    "after-char-quote": "char c = '\"';\n#include \"/etc/passwd\"\n",
    "after-digit-separator": "int a = 1'000; /* x */\n#include \"/etc/passwd\"\n",
    # a prelude header by a quoted name: NVRTC looks in the current folder first
    "quoted-prelude-header": '#include "cuda_fp16.h"\n',
    "quoted-prelude-header-spliced": '#include "cuda_\\\nbf16.h"\n',
    # a pragma a macro makes: what it says is not known before preprocessing
    "pragma-from-a-macro": '#define P(x) _Pragma(#x)\nP(GCC dependency "/etc/passwd")\n',
    "pragma-operator-second": '_Pragma("unroll") _Pragma("GCC dependency \\"/etc/passwd\\"")\n',
    # a raw string NVRTC does not take as one ("raw string indicator ignored": its delimiter is
    # too long, holds a space or has no "("): the lines after it are code there
    "after-raw-string-with-no-paren": '#if 0\nR"\n#endif\n#include "/etc/passwd"\n',
    "after-raw-string-with-a-long-delimiter":
        '#if 0\nu8R"abcdefghijklmnopq(\n#endif\n#include "/etc/passwd"\n// )abcdefghijklmnopq"\n',
    "after-raw-string-with-a-space": 'R"a b(\n#include "/etc/passwd"\n)a b";\n',
    "unterminated-raw-string": 'const char* s = R"x(\n#include "/etc/passwd"\n',
    # a probe or a pragma that token pasting makes, seen only as NVRTC preprocesses
    "pasted-probe": '#define P(a, b) a##b\n#if P(__has_, include)("/etc/passwd")\n#endif\n',
    "pasted-probe-digraph":
        '#define P(a, b) a%:%:b\n#if P(__has_, include)("/etc/passwd")\n#endif\n',
    "probe-after-non-ascii": '#define A \u00e9__has_include("/etc/passwd")\n',
    "pragma-after-non-ascii": 'int \u00e9_Pragma("GCC dependency \\"/etc/passwd\\"");\n',
    # a directive NVRTC reads where the check's lexing sees a comment or a literal: after a
    # comment spanning lines (NVRTC takes the # as a line's first), in a directive line where
    # NVRTC lexes 1' as a number and a character literal, in a raw string: read line by line too
    "after-a-comment-spanning-lines": 'x /* a\n b */ #include "/etc/passwd"\n',
    "after-a-comment-spanning-lines-and-through-one": 'x /*\n*/ # /*\n*/ include "/etc/passwd"\n',
    "comment-after-a-digit-in-a-directive": "%:1'0x1p'u8%:1'/*\n#include \"/etc/passwd\"\n",
    "in-a-raw-string": 'const char* s = R"x(\n#include "/etc/passwd"\n)x";\n',
    "pasted-pragma": '#define P(a, b) a##b\nP(_Pr, agma)("GCC dependency \\"/etc/passwd\\"")\n',
}


@pytest.mark.parametrize("source", REFUSED.values(), ids=REFUSED.keys())
def test_every_way_to_name_a_host_file_is_refused(source):
    with pytest.raises(SourceRefused, match=r"candidate\.cu"):
        check_source("__global__ void k() {}\n" + source)


def test_the_message_names_what_was_included():
    with pytest.raises(SourceRefused, match="/etc/passwd.*cuda_fp16.h and cuda_bf16.h"):
        check_source('#include "/etc/passwd"\n')


ALLOWED = {
    "prelude-headers": "#include <cuda_fp16.h>\n# include <cuda_bf16.h>\n",
    "pragma-operator": '_Pragma("unroll") for (;;) {}\n',
    "in-comments": '// #include "/etc/passwd"\n/* #include </etc/passwd> */\n',
    "in-string": 'const char* s = "#include \\"/etc/passwd\\"";\n',
    "pragmas": "#pragma unroll\n#pragma unroll 4\n#pragma nv_diag_suppress 177\n",
    "digit-separators": "int a = 1'000'000;\nfloat b = 1e-5f + .5f;\n",
    "raw-string-of-16": 'const char* s = R"abcdefghijklmnop(\n"/*\n)abcdefghijklmnop";\n',
    "directive-like-text-in-a-comment": "/* a note:\n * #include <stdio.h> is not needed\n */\n",
    # characters NVRTC reads as tokens of their own (and then refuses): no file either
    "non-ascii": 'int \u00e9 = 0; float x = \u00b2; // \u00e9\n',
}


@pytest.mark.parametrize("source", ALLOWED.values(), ids=ALLOWED.keys())
def test_what_names_no_file_passes(source):
    check_source(source)


def test_every_test_candidate_passes():
    builds = [*C.REFERENCE.values(), *(build for _n, _c, build, _s in C.CHEATS)]
    for build in builds:
        check_source(build().source)


def test_a_header_beside_the_compile_is_never_read(tmp_path, monkeypatch):
    """A link named like a prelude header in the folder kforge compiles in (the one a shared
    database lies in) is not read, whatever the candidate includes."""
    pytest.importorskip("cuda.core")
    from kforge.runtime.nvrtc import Compiler

    secret = tmp_path / "config.toml"
    secret.write_text('api_key = "sk-kforge-test-secret"\n')
    folder = tmp_path / "shared"
    folder.mkdir()
    for name in ("cuda_fp16.h", "cuda_bf16.h"):
        (folder / name).symlink_to(secret)
    monkeypatch.chdir(folder)
    for include in ('"cuda_fp16.h"', '"cuda_bf16.h"', "<cuda_fp16.h>"):
        result = Compiler().compile(f"#include {include}\n"
                                    'extern "C" __global__ void k(float* x) { x[0] = 1.f; }\n',
                                    "sm_90")
        assert "sk-kforge-test-secret" not in result.log
        assert result.ok == include.startswith("<"), result.log


@pytest.mark.parametrize("including", [
    '#if 0\nR"\n#endif\n#include ',  # after a raw string NVRTC ignores
    "x /* a\n b */ #include ",  # after a comment spanning lines, NVRTC takes # as a line's first
    "x /*\n*/ # /*\n*/ include ",  # and the directive goes on past a comment spanning lines
    "%:1'0x1p'u8%:1'/*\n#include ",  # in a directive, NVRTC lexes 1' then a character literal
], ids=["raw-string-ignored", "after-a-comment-spanning-lines", "and-through-one",
        "digit-separator-in-a-directive"])
def test_what_nvrtc_reads_otherwise_hides_no_include(tmp_path, including):
    """An include the check's lexing hid was read, and the file's lines quoted in the compile
    log (stored, and sent back in repair prompts)."""
    pytest.importorskip("cuda.core")
    from kforge.runtime.nvrtc import Compiler

    secret = tmp_path / "secret.h"
    secret.write_text("#error sk-kforge-test-secret\n")
    result = Compiler().compile(f'{including}"{secret}"\n'
                                'extern "C" __global__ void k(float* x) { x[0] = 1.f; }\n',
                                "sm_90")
    assert not result.ok and "sk-kforge-test-secret" not in result.log
