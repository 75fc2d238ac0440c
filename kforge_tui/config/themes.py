"""Theme files: the shipped ones (top-level ``themes/``, packaged as ``kforge_tui/themes``) and the
user's (``<config dir>/themes/*.toml``), turned into Textual themes plus syntax colours by role.

A terminal shows 16 million colours, 256 or 16 (``colour_depth``); Rich turns the colours it cannot
show into the nearest it can, and nearest is not always right (a near-black blue-grey becomes
navy, three warm colours one red). A theme file may give colours for the smaller palettes in its
``[fallback-256]`` and ``[fallback-16]`` tables; on 256 or 16 colours only the themes made for
that palette are offered (``ThemeSpec.offered_at``: Textual's own themes are not, their text falls
to 1.2:1 there), and on 16 colours the ANSI theme, which uses the terminal's own palette, is the
default (``starting_theme``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from rich.color import ColorSystem
from rich.console import Console
from textual.color import ColorParseError
from textual.theme import Theme

from kforge.core.settings import DEFAULT_THEME
from kforge.errors import KforgeError
from kforge.store.config import config_dir, read_toml

# What the syntax colours are given for; capture names map onto these in kforge_tui.highlight.
SYNTAX_ROLES = ("comment", "string", "number", "constant", "keyword", "preprocessor", "cuda",
                "type", "function", "builtin", "property", "operator", "punctuation")
_COLOURS = ("primary", "secondary", "warning", "error", "success", "accent", "foreground",
            "background", "surface", "panel", "boost")
# The tables of colours for a terminal with fewer colours, and the depth each is for.
FALLBACKS = {"fallback-256": ColorSystem.EIGHT_BIT, "fallback-16": ColorSystem.STANDARD}
ANSI_THEME = "kforge-ansi"
_NOT_SMALLER = {ColorSystem.STANDARD: (ColorSystem.STANDARD, ColorSystem.EIGHT_BIT),
                ColorSystem.EIGHT_BIT: (ColorSystem.EIGHT_BIT,)}


@dataclass(frozen=True)
class ThemeSpec:
    """One theme file: the Textual theme and its syntax styles (Rich style strings by role),
    and the theme as changed for terminals of fewer colours."""

    theme: Theme
    syntax: dict[str, str]
    path: Path | None = None
    fallbacks: dict[ColorSystem, Theme] = field(default_factory=dict)

    def offered_at(self, depth: ColorSystem) -> bool:
        """Whether the theme is offered on a terminal of this colour depth: on fewer than 16
        million colours only a theme made for that palette (one of the terminal's own colours,
        or with a fallback table for it) keeps its text readable."""
        return depth is ColorSystem.TRUECOLOR or self.theme.ansi or depth in self.fallbacks

    def at(self, depth: ColorSystem) -> Theme:
        """The theme for a terminal of this colour depth: the fallback for its palette, else the
        one for the next larger palette, else the theme itself."""
        for palette in _NOT_SMALLER.get(depth, ()):
            if palette in self.fallbacks:
                return self.fallbacks[palette]
        return self.theme


def colour_depth(console: Console) -> ColorSystem:
    """How many colours the terminal shows, as Rich detected it from COLORTERM and TERM (Windows'
    legacy console and a terminal without colours count as 16)."""
    return {"truecolor": ColorSystem.TRUECOLOR,
            "256": ColorSystem.EIGHT_BIT}.get(console.color_system or "", ColorSystem.STANDARD)


def starting_theme(wanted: str | None, configured: str, depth: ColorSystem) -> str:
    """The theme to start with: the one asked for on the command line, else the config's; the
    config's default gives way to the ANSI theme on a 16-colour terminal."""
    if wanted:
        return wanted
    if depth is ColorSystem.STANDARD and configured == DEFAULT_THEME:
        return ANSI_THEME
    return configured


def shipped_dir() -> Path:
    """Shipped themes: inside the installed package, else the source checkout's ``themes/``."""
    package = Path(__file__).resolve().parents[1]  # kforge_tui/
    installed = package / "themes"
    return installed if installed.is_dir() else package.parent / "themes"


def user_dir() -> Path:
    return config_dir() / "themes"


def parse_theme(data: dict, path: Path | None = None) -> ThemeSpec:
    """Check one theme file's contents and build its spec; any problem is a KforgeError."""
    where = f"theme file {path}" if path else "theme"
    name = data.get("name") or (path.stem if path else "")
    if not isinstance(name, str) or not name:
        raise KforgeError(f"{where} has no name")
    if not isinstance(data.get("primary"), str):
        raise KforgeError(f"{where} needs a primary colour (primary = \"#4a9fe0\")")
    unknown = set(data) - {"name", "dark", "ansi", "variables", "syntax", *_COLOURS, *FALLBACKS}
    if unknown:
        raise KforgeError(f"{where}: unknown keys {sorted(unknown)}")
    syntax = data.get("syntax", {})
    bad_roles = set(syntax) - set(SYNTAX_ROLES)
    if bad_roles:
        raise KforgeError(f"{where}: unknown syntax roles {sorted(bad_roles)}; "
                          f"known: {', '.join(SYNTAX_ROLES)}")
    theme = build_theme(name, data, where)
    fallbacks = {}
    for table, depth in FALLBACKS.items():
        if table in data:
            fallback = data[table]
            unknown = set(fallback) - {"variables", *_COLOURS}
            if unknown:
                raise KforgeError(f"{where}: unknown keys in [{table}] {sorted(unknown)}")
            variables = {**data.get("variables", {}), **fallback.get("variables", {})}
            fallbacks[depth] = build_theme(name, {**data, **fallback, "variables": variables},
                                           f"{where} [{table}]")
    return ThemeSpec(theme=theme, syntax={k: str(v) for k, v in syntax.items()}, path=path,
                     fallbacks=fallbacks)


def build_theme(name: str, data: dict, where: str) -> Theme:
    theme = Theme(name=name, dark=bool(data.get("dark", True)), ansi=bool(data.get("ansi", False)),
                  variables=dict(data.get("variables", {})),
                  **{k: data[k] for k in _COLOURS if k in data})
    try:
        theme.to_color_system()
    except ColorParseError as exc:  # it says which value it could not read
        raise KforgeError(f"{where}: {exc}") from None
    return theme


def read_theme(path: Path) -> ThemeSpec:
    return parse_theme(read_toml(path, "theme file"), path)


def load_themes(folders: list[Path] | None = None) -> tuple[dict[str, ThemeSpec], list[str]]:
    """Every readable theme in ``folders`` (shipped first, so a user file of the same name wins),
    with syntax roles a file leaves out filled from the shipped theme of its brightness.
    Returns the themes by name and one message per file that could not be used."""
    folders = folders if folders is not None else [shipped_dir(), user_dir()]
    specs: dict[str, ThemeSpec] = {}
    problems: list[str] = []
    for folder in folders:
        for path in sorted(folder.glob("*.toml")) if folder.is_dir() else []:
            try:
                spec = read_theme(path)
            except KforgeError as exc:
                problems.append(str(exc))
                continue
            specs[spec.theme.name] = spec
    return {name: complete_syntax(spec, specs) for name, spec in specs.items()}, problems


def complete_syntax(spec: ThemeSpec, specs: dict[str, ThemeSpec]) -> ThemeSpec:
    base = syntax_for(spec.theme, specs, own=False)
    return ThemeSpec(spec.theme, {**base, **spec.syntax}, spec.path, spec.fallbacks)


def syntax_for(theme: Theme, specs: dict[str, ThemeSpec], own: bool = True) -> dict[str, str]:
    """Syntax styles for any Textual theme: its own file's, else the shipped one that fits."""
    if own and theme.name in specs:
        return specs[theme.name].syntax
    fallback = ANSI_THEME if theme.ansi else DEFAULT_THEME if theme.dark else "kforge-light"
    spec = specs.get(fallback)
    return dict(spec.syntax) if spec and spec.theme.name != theme.name else {}
