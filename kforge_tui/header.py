"""The one-line bar atop each screen, fitted to the terminal: every part has a full and a short
form, and a narrow terminal gets short forms, least needed parts first, before anything is cut.
Pure functions."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from kforge.core.fmt import fmt_headline
from kforge.core.settings import SessionSettings
from kforge.store import SessionStatus
from kforge.store.commands import HELD_STATUSES
from kforge.store.events import ModelMeasured
from kforge.store.records import CardRow, Session
from kforge_tui.format import model_projection

SEPARATOR = " · "
ELLIPSIS = "…"


@dataclass(frozen=True)
class Part:
    """One piece of a bar; parts of lower ``keep`` are shortened first."""

    full: str
    short: str
    keep: int = 0


# A database this process may not write: its write keys say so when pressed.
READ_ONLY = Part("read-only database", "read-only", keep=5)


def fit(parts: list[Part], width: int) -> str:
    """The parts joined in order: all in full where that fits ``width`` cells, else each in
    its short form, the parts of highest ``keep`` first given back their full form while the line
    still fits. Where even the short forms do not fit, parts of least ``keep`` are left out whole
    (a figure is never cut in the middle); only a lone part too wide is cut, with an ellipsis."""
    shown = [part.full for part in parts]
    if len(SEPARATOR.join(shown)) > width:
        shown = [part.short for part in parts]
        for index in sorted(range(len(parts)), key=lambda i: -parts[i].keep):
            longer = [*shown[:index], parts[index].full, *shown[index + 1:]]
            if len(SEPARATOR.join(longer)) <= width:
                shown = longer
    kept = list(range(len(parts)))
    while len(kept) > 1 and len(SEPARATOR.join(shown[i] for i in kept)) > width:
        kept.remove(min(kept, key=lambda i: (parts[i].keep, -i)))
    return clip(SEPARATOR.join(shown[i] for i in kept), width)


def clip(text: str, width: int) -> str:
    """``text`` cut to ``width`` cells, with an ellipsis where it was cut."""
    if len(text) <= width:
        return text
    return text[:max(0, width - 1)] + ELLIPSIS if width > 0 else ""


def short_model(model: str, width: int = 24) -> str:
    """A model as a narrow bar names it: a model file by its file name and factory."""
    if ":" in model and not model.startswith(("http:", "https:")):
        path, factory = model.rsplit(":", 1)
        model = f"{Path(path).name}:{factory}"
    return clip(model, width)


def short_gpu(label: str) -> str:
    """``NVIDIA H100 80GB HBM3 (+7)`` -> ``H100 +7``: an NVIDIA GPU by its model number (and how
    many more there are); any other label as it is."""
    if not label.startswith("NVIDIA "):
        return label
    words = label.removeprefix("NVIDIA ").split()
    more = next((w.strip("()") for w in words if w.startswith("(+")), "")
    return " ".join(w for w in (words[0], more) if w)


def engine_state(status: str, alive: bool, starting: int | None = None) -> tuple[str, str]:
    """The session's state as (full, short) text; an engine started (process ``starting``)
    that has not taken the session yet is starting; a search whose engine died says so, and how
    to start it again."""
    if alive:
        return f"{status} (engine live)", f"{status} ●"
    if starting is not None:
        return f"starting (engine process {starting})…", "starting…"
    if status in HELD_STATUSES:
        return "engine stopped — r to resume", "engine stopped — r to resume"
    if status in (SessionStatus.STOPPED, SessionStatus.READY, SessionStatus.FAILED):
        verb = "start" if status == SessionStatus.READY else "resume"
        return f"{status} — r to {verb}", status
    return status, status


def session_header(session: Session, cards: list[CardRow], alive: bool, gpu: str,
                   width: int, demo: bool = False, measured: ModelMeasured | None = None,
                   read_only: bool = False, starting: int | None = None) -> str:
    """The session screen's bar: which session, its state (``starting``: the pid of an engine
    started for it that has not taken it yet), iterations, the whole model's speedup (as
    ``measured`` by ``kforge e2e``, and as the cards project it), money, time and GPU; and
    whether nothing of it can be changed here (the demo, a read-only database)."""
    search = SessionSettings.from_stored(session.settings).search
    targets = sum(1 for c in cards if c.card.target)
    done = sum(c.spent for c in cards)
    spent = f"${session.usd_spent:.2f}"
    limit = f"/${search.usd:.2f}" if search.usd is not None else ""
    minutes = f"{session.run_seconds / 60:.0f}m"
    wall = f"/{search.wall_s / 60:.0f}m" if search.wall_s else ""
    state = (session.status, session.status) if demo else \
        engine_state(session.status, alive, starting)
    parts = [Part(f"#{session.id} {session.model}", f"#{session.id} {short_model(session.model)}",
                  keep=3),
             Part(*state, keep=4),
             Part(f"{done}/{search.iterations_per_op * targets} it",
                  f"{done}/{search.iterations_per_op * targets}", keep=2),
             Part(spent + limit, spent, keep=1),
             Part(minutes + wall, minutes, keep=1),
             Part(gpu, short_gpu(gpu.removeprefix("GPU: ")), keep=0)]
    parts[3:3] = model_parts(model_projection(cards), measured)
    if demo:
        parts.insert(0, Part("demo (read-only)", "demo", keep=1))  # nothing here is yours
    elif read_only:
        parts.insert(1, READ_ONLY)
    return fit(parts, width)


def model_parts(projected: float | None, measured: ModelMeasured | None) -> list[Part]:
    """The whole model's speedup: where ``kforge e2e`` measured it, kforge's best mode against
    the best mode without kforge (``ModelMeasured.headline``); and at most what the op cards
    project over eager (were every op's best kernel used)."""
    headline = measured.headline() if measured is not None else None
    if headline is None:
        return [] if projected is None else [
            Part(f"model ≤{projected:.2f}x over eager projected",
                 f"model ≤{projected:.2f}x vs eager proj", keep=2)]
    assert measured is not None
    parts = [Part(*fmt_headline(headline, checked=bool(measured.kernels)), keep=2)]
    if projected is not None:
        parts.append(Part(f"≤{projected:.2f}x over eager projected",
                          f"≤{projected:.2f}x vs eager proj", keep=1))
    return parts


def sessions_header(db: Path, gpu: str, width: int, demo: bool = False,
                    read_only: bool = False) -> str:
    """The sessions screen's bar: the database (and whether it is read-only here) and this
    machine's GPU."""
    where = Part("demo recording (read-only)", "demo") if demo else \
        Part(str(db), clip_path(db))
    parts = [Part("kforge", "kforge", keep=2), where]
    if read_only and not demo:
        parts.append(READ_ONLY)
    return fit([*parts, Part(gpu, short_gpu(gpu.removeprefix("GPU: ")), keep=1)], width)



def clip_path(path: Path, width: int = 32) -> str:
    """A path shortened from the left, so the file's own name stays."""
    text = str(path)
    return text if len(text) <= width else ELLIPSIS + text[-(width - 1):]
