"""Syntax highlighting for the code views: CUDA through tree-sitter-cuda with kforge's own joined
C/C++/CUDA query (``cuda.scm``), Python through Textual's built-in query, both coloured by role."""

from __future__ import annotations

from functools import cache
from importlib.resources import files

from rich.style import Style
from textual.widgets import TextArea
from textual.widgets.text_area import TextAreaTheme

CUDA = "cuda"
TEXT_AREA_THEME = "kforge"

# Capture name -> syntax role. Covers every name in cuda.scm and in Textual's python query, since
# TextArea looks styles up by the exact capture name.
CAPTURE_ROLES: dict[str, str] = {
    "comment": "comment",
    "string": "string", "string.escape": "string", "string.documentation": "string",
    "number": "number", "float": "number",
    "boolean": "constant", "constant": "constant", "constant.builtin": "constant",
    "none": "constant",
    "keyword": "keyword", "keyword.function": "keyword", "keyword.return": "keyword",
    "keyword.operator": "keyword", "conditional": "keyword", "repeat": "keyword",
    "exception": "keyword", "include": "keyword",
    "preprocessor": "preprocessor", "preproc": "preprocessor",
    "keyword.cuda": "cuda", "function.cuda": "cuda",
    "type": "type", "type.builtin": "type", "type.class": "type", "type.definition": "type",
    "namespace": "type", "constructor": "type",
    "function": "function", "function.call": "function", "method": "function",
    "method.call": "function", "function.builtin": "builtin",
    "variable.builtin": "builtin", "attribute.builtin": "builtin",
    "property": "property", "field": "property", "attribute": "property", "label": "property",
    "operator": "operator",
    "punctuation.bracket": "punctuation", "punctuation.delimiter": "punctuation",
    "punctuation.special": "punctuation",
}


@cache
def cuda_query() -> str:
    return files("kforge_tui.highlight").joinpath("cuda.scm").read_text()


@cache
def cuda_language():  # -> tree_sitter.Language (imported lazily: only the code view needs it)
    import tree_sitter_cuda
    from tree_sitter import Language

    return Language(tree_sitter_cuda.language())


def register_cuda(area: TextArea) -> None:
    area.register_language(CUDA, cuda_language(), cuda_query())


def text_area_theme(roles: dict[str, str]) -> TextAreaTheme:
    """The code views' theme: each capture name styled by its role's Rich style string."""
    styles = {role: Style.parse(text) for role, text in roles.items()}
    return TextAreaTheme(name=TEXT_AREA_THEME,
                         syntax_styles={capture: styles[role]
                                        for capture, role in CAPTURE_ROLES.items()
                                        if role in styles})
