"""The user's key map: ``[keys]`` in the config file remaps bindings by id (``prune = "x"``).

The config file's loader checks that each entry names a key as text; the ids and keys are checked
here, before they reach Textual's ``App.set_keymap``: unknown ids and chords that terminals
(especially over SSH) cannot send are left out, each with a one-line reason."""

from __future__ import annotations

from collections.abc import Iterable

from textual.binding import Binding

from kforge.core.settings import KeyBindings, nearest

# Modifier combinations a terminal does not encode distinctly: the app would never see them.
_UNSENDABLE = ("ctrl+enter", "shift+enter", "alt+enter", "ctrl+tab", "ctrl+shift+", "super+",
               "hyper+", "meta+", "ctrl+space+", "ctrl+backspace")


def binding_ids(owners: Iterable[type]) -> dict[str, Binding]:
    """Every binding with an id declared by these classes, by id (the first declaration wins)."""
    found: dict[str, Binding] = {}
    for owner in owners:
        for item in getattr(owner, "BINDINGS", []):
            if isinstance(item, Binding) and item.id and item.id not in found:
                found[item.id] = item
    return found


def unsendable(keys: str) -> str | None:
    """The first key in a comma-separated list that a terminal cannot send, if any."""
    for key in (k.strip().lower() for k in keys.split(",")):
        if any(key.startswith(bad) or key == bad.rstrip("+") for bad in _UNSENDABLE):
            return key
    return None


def user_keymap(keys: KeyBindings, known: Iterable[str]) -> tuple[dict[str, str], list[str]]:
    """The usable part of the config's ``[keys]`` table, and a message per entry left out."""
    known = set(known)
    keymap: dict[str, str] = {}
    problems: list[str] = []
    for binding_id, chords in keys.by_id.items():
        if binding_id not in known:
            guess = nearest(binding_id, known)
            hint = f"did you mean {guess}? " if guess else ""
            problems.append(f"[keys] {binding_id}: no such binding ({hint}press ? to see the ids)")
        elif bad := unsendable(chords):
            problems.append(f"[keys] {binding_id}: terminals cannot send {bad}; pick another key")
        else:
            keymap[binding_id] = chords.replace(" ", "")
    return keymap, problems
