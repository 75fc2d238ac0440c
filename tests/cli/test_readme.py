"""The README's command lines: every `kforge` usage line is one the CLI accepts, and the lines it
gives for a machine without a GPU run here, on the CPU."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from kforge.cli.main import build_parser, chosen_command, main
from kforge_tui.app import parse_args as tui_args

README = Path(__file__).resolve().parents[2] / "README.md"


def shell_block(heading: str) -> list[str]:
    """The lines of the first ```sh block under the README's ``## heading``, comments cut."""
    text = README.read_text()
    section = text[text.index(f"## {heading}\n"):]
    block = re.search(r"```sh\n(.*?)```", section, re.S)
    assert block is not None, f"no sh block under {heading}"
    lines = [line.split("  #")[0].strip() for line in block.group(1).splitlines()]
    return [line for line in lines if line]


def kforge_words(line: str) -> list[list[str]]:
    """Each `kforge ...` command of a line (`a ; b` is two), without the program name."""
    commands = [shlex.split(part) for part in line.split(";")]
    return [words[1:] for words in commands
            if words and (words[0] == "kforge" or words[0].endswith("/kforge"))]


def test_every_usage_line_is_a_command_line_kforge_accepts():
    seen = 0
    for line in shell_block("Using it"):
        for words in kforge_words(line):
            build_parser(chosen_command(words)).parse_args(words)
            seen += 1
    assert seen >= 10


@pytest.mark.slow
def test_the_lines_for_a_machine_without_a_gpu_run_here(tmp_path: Path, capsys):
    lines = shell_block("Without a GPU")
    assert "cuda" not in lines[0] and lines[0].endswith("-e '.[models]'")
    commands = [words for line in lines[1:] for words in kforge_words(line)]
    assert [words[0] for words in commands] == ["profile", "show", "apply"]
    for words in commands:
        assert main([*words, "--db", str(tmp_path / "k.db")]) == 0, capsys.readouterr().err
    printed = capsys.readouterr().out
    assert "stored as session 1" in printed and "profiled without a GPU" in printed
    # the demo itself runs in tests/tui/test_defects.py; here: the line names its flag
    assert lines[-1] == ".venv/bin/kforge-tui --demo" and tui_args(["--demo"]).demo
