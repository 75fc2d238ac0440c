"""The settings tree: every setting a user can give kforge, typed, documented and checked once.

One frozen dataclass per section of the config file (``[search]``, ``[eval]``, ``[llm]``, ``[tui]``,
``[keys]``), gathered in ``Settings``; ``SessionSettings`` is what a session stores of them. The
CLI, the engine and the TUI read these records, never the raw tables.

What a person wrote (the config file, the command line) is read strictly: an unknown key is an
error that suggests the nearest known one, and a value of the wrong type or out of range is an
error naming where it came from, its section and its key. What an older kforge stored with a
session is read leniently: keys this version does not know, and values it no longer accepts, are
dropped (the default stands in), each with a note, so old sessions still open and resume.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field, fields
from types import UnionType
from typing import Any, ClassVar, TypeVar, Union, get_args, get_origin, get_type_hints
from urllib.parse import urlsplit, urlunsplit

from kforge.core.mcts import MctsParams
from kforge.core.secrets import REDACTED, secret_problem, url_credentials
from kforge.errors import KforgeError

DEFAULT_THEME = "kforge-dark"

T = TypeVar("T")


class SettingsError(KforgeError):
    """A setting that is unknown, of the wrong type or out of range; the message names it."""


class InvalidValue(SettingsError):
    """A value that breaks its field's rule, raised by a record's own check; reading a table
    re-raises it as a SettingsError that also says where the value came from."""

    def __init__(self, key: str, rule: str, value: object, *, secret: bool = False) -> None:
        self.key, self.rule, self.value = key, rule, value
        # a secret's value is never quoted back
        self.given = "" if secret else f", not {value!r}"
        super().__init__(f"{key} {rule}{self.given}")


@dataclass(frozen=True)
class Origin:
    """Where a table of settings comes from, as messages name it (``in /path/config.toml``,
    ``on the command line``), and how it is read: strictly for what a person wrote; leniently for
    what a session stored, where an unknown key or a bad value is dropped and noted in ``notes``."""

    where: str = "as given"
    strict: bool = True
    notes: list[str] = field(default_factory=list, compare=False)

    @classmethod
    def stored(cls, session_id: int) -> Origin:
        return cls(f"in the stored settings of session {session_id}", strict=False)


def nearest(word: str, known: Iterable[str]) -> str | None:
    """The known word that ``word`` most likely misspells, if any is close."""
    close = difflib.get_close_matches(word, sorted(known), n=1)
    return close[0] if close else None


def did_you_mean(word: str, known: Iterable[str]) -> str:
    """``did you mean X?`` for the known word nearest ``word``, else the known words listed."""
    known = sorted(known)
    guess = nearest(word, known)
    return f"did you mean {guess}?" if guess else f"known: {', '.join(known) or 'none'}"


# ----- the rules a record checks in __post_init__ -----


def _at_least(record: object, key: str, minimum: int) -> None:
    value = getattr(record, key)
    if value is not None and not value >= minimum:
        raise InvalidValue(key, f"must be at least {minimum}", value)


def _at_most(record: object, key: str, maximum: float) -> None:
    value = getattr(record, key)
    if value is not None and not value <= maximum:
        raise InvalidValue(key, f"must be at most {maximum:,}", value)


def _finite(record: object, key: str, minimum: float = 0.0, *, above: bool = False) -> None:
    """A finite number at least ``minimum`` (above it when ``above``); ``nan`` and ``inf`` fail."""
    value = getattr(record, key)
    if value is None:
        return
    if not (math.isfinite(value) and (value > minimum if above else value >= minimum)):
        bound = f"above {minimum:g}" if above else f"of at least {minimum:g}"
        raise InvalidValue(key, f"must be a finite number {bound}", value)


# ----- reading tables -----

_KINDS: dict[type, str] = {bool: "true or false", int: "a whole number", float: "a number",
                           str: "text"}


def _table(data: object, origin: Origin, section: str | None) -> dict[str, Any]:
    if data is None:
        return {}
    if not isinstance(data, Mapping):
        what = f"[{section}]" if section else "the settings"
        raise SettingsError(f"{what} {origin.where} must be a table of settings, not {data!r}")
    return dict(data)


def _unknown(key: str, known: Iterable[str], origin: Origin, section: str) -> None:
    """Refuse a key no field has, or drop it with a note when reading stored data."""
    if origin.strict:
        raise SettingsError(f"unknown setting [{section}] {key} {origin.where} "
                            f"({did_you_mean(key, known)})")
    origin.notes.append(f"ignored unknown setting [{section}] {key} {origin.where}")


def _bare(name: str) -> str:
    """A table name as TOML writes it: quoted unless it is a bare key."""
    return name if re.fullmatch(r"[A-Za-z0-9_-]+", name) else f'"{name}"'


def _is_kind(value: object, kind: type) -> bool:
    if kind is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if kind is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, kind)


def _convert(value: object, hint: Any, key: str, origin: Origin, section: str) -> Any:
    """``value`` as the field's type (ints widen to floats, lists become tuples); nested records
    and tables of records are read with the same rules."""
    shape, args = get_origin(hint), get_args(hint)
    if shape in (Union, UnionType):
        if value is None and type(None) in args:
            return None
        (hint,) = [a for a in args if a is not type(None)]
        shape, args = get_origin(hint), get_args(hint)
    if dataclasses.is_dataclass(hint):
        return _read(hint, value, origin, f"{section}.{key}")
    if shape is dict:
        return {name: _convert(entry, args[1], _bare(name), origin, f"{section}.{key}")
                for name, entry in _table(value, origin, f"{section}.{key}").items()}
    if shape is tuple:
        if isinstance(value, (list, tuple)) and all(_is_kind(v, args[0]) for v in value):
            return tuple(value)
        raise SettingsError(f"[{section}] {key} {origin.where} must be a list of "
                            f"{_KINDS[args[0]].removeprefix('a ')}s, not {value!r}")
    if _is_kind(value, hint):
        return float(value) if hint is float else value  # type: ignore[arg-type]
    raise SettingsError(f"[{section}] {key} {origin.where} must be {_KINDS[hint]}, not {value!r}")


def _read(cls: type[T], data: object, origin: Origin, section: str, *,
          built: Mapping[str, Any] | None = None, also_known: Iterable[str] = ()) -> T:
    """A ``cls`` from one table: unknown keys refused, values type-checked and converted, missing
    required ones named, then the record's own range checks. Read leniently, an unknown key or a
    bad value is dropped with a note instead (the field keeps its default). ``built`` holds fields
    the caller read already; ``also_known`` keys it took out of the table."""
    built = dict(built or {})
    hints = get_type_hints(cls)
    names = [f.name for f in fields(cls) if f.name not in built]
    values: dict[str, Any] = {}
    for key, value in _table(data, origin, section).items():
        if key not in names:
            _unknown(key, [*names, *also_known], origin, section)
            continue
        try:
            values[key] = _convert(value, hints[key], key, origin, section)
        except SettingsError as exc:
            _drop(exc, origin)
    for f in fields(cls):
        if (f.name not in values and f.name not in built and f.default is dataclasses.MISSING
                and f.default_factory is dataclasses.MISSING):
            raise SettingsError(f"[{section}] {f.name} {origin.where} is missing")
    while True:
        try:
            return cls(**values, **built)
        except InvalidValue as exc:
            error = SettingsError(f"[{section}] {exc.key} {origin.where} {exc.rule}{exc.given}")
            if exc.key not in values:
                raise error from None
            _drop(error, origin)
            del values[exc.key]


def _drop(error: SettingsError, origin: Origin) -> None:
    """Refuse a bad value, or, reading stored data, note that its default replaces it."""
    if origin.strict:
        raise error from None
    origin.notes.append(f"ignored {error}; using the default")


class _Section:
    """What every section of the tree offers: reading a table, writing one back, and updating
    some keys."""

    SECTION: ClassVar[str]

    @classmethod
    def from_dict(cls: type[T], data: Mapping[str, Any] | None,
                  origin: Origin | None = None) -> T:
        """The section from its table; SettingsError names the first bad key."""
        return _read(cls, data, origin or Origin(), cls.SECTION)  # type: ignore[attr-defined]

    def table(self) -> dict[str, Any]:
        """Every field as ``from_dict`` reads it, secrets included."""
        return asdict(self)  # type: ignore[call-overload]

    def to_dict(self) -> dict[str, Any]:
        """The section as a table that ``from_dict`` reads back (and a session stores)."""
        return self.table()

    def updated(self: T, data: Mapping[str, Any], origin: Origin) -> T:
        """These settings with the keys in ``data`` set from it, checked as ``from_dict`` checks
        (a nested table replaces the whole nested table)."""
        return type(self).from_dict({**self.table(), **data}, origin)  # type: ignore[attr-defined]


# ----- the sections -----


@dataclass(frozen=True)
class SearchSettings(_Section):
    """``[search]``: how a session's search spends its budget. The same names are the options of
    ``kforge search`` and ``kforge resume``; a session stores the values it runs with."""

    SECTION: ClassVar[str] = "search"

    proposer: str = "library"  # who writes kernels: library | llm | both | module:factory
    evaluator: str = "gpu"  # who judges them: gpu | module:factory
    # the Ray cluster whose GPUs the gpu evaluator runs on ("auto": the one `ray start` joined
    # this machine to; "host:6379"; "ray://host:10001"); "": this machine's GPUs
    cluster: str = ""
    iterations_per_op: int = 24  # average per op; the split over ops follows share and headroom
    max_op_factor: float = 3.0  # an op may take up to this many times the average
    usd: float | None = None  # total LLM spend allowed for the session, in US dollars
    wall_s: float | None = None  # total engine run time allowed for the session, in seconds
    parallel: int = 4  # proposals in flight at once: enough to keep every GPU worker busy
    # confirmations (compute-sanitizer, then a fresh worker's re-timing) in flight at once, beside
    # the search's evaluations; never more than one per op
    confirmations: int = 2
    patience: int = 12  # stop an op after this many iterations without improvement
    seed: int = 0  # random seed of the search
    focus: int | None = None  # search this op card first (an id `kforge show` lists), then all
    top_ops: int | None = None  # only search the ops with the largest time shares
    # [search.mcts]: the tree search's constants (exploration, widening, repairs)
    mcts: MctsParams = field(default_factory=MctsParams)

    # The range each number may take (the command line's options state it): beyond it, a
    # setting is a slip (--parallel 100000, --time 99999999999h), never a search to run.
    RANGES: ClassVar[dict[str, tuple[float, float]]] = {
        "iterations_per_op": (1, 1_000_000), "max_op_factor": (0, 1_000), "usd": (0, 1_000_000),
        "wall_s": (0, 366 * 24 * 3600), "parallel": (1, 256), "confirmations": (1, 64),
        "patience": (1, 1_000_000), "seed": (0, 2**32 - 1), "focus": (1, 2**63 - 1),
        "top_ops": (1, 100_000)}

    def __post_init__(self) -> None:
        for key in ("iterations_per_op", "parallel", "confirmations", "patience", "focus",
                    "top_ops"):
            _at_least(self, key, 1)
        _at_least(self, "seed", 0)
        _finite(self, "max_op_factor", above=True)
        _finite(self, "usd")
        _finite(self, "wall_s", above=True)
        for key, (_, most) in self.RANGES.items():
            _at_most(self, key, most)
        if self.cluster != self.cluster.strip():
            raise InvalidValue("cluster", "must be an address without spaces around it",
                               self.cluster)

    @property
    def per_op_limit(self) -> int:
        """The most iterations one op may take."""
        return max(1, math.ceil(self.iterations_per_op * self.max_op_factor))


# The range each option of how a model is built may take (`kforge profile --batch ...`).
MODEL_RANGES: dict[str, tuple[int, int]] = {"batch": (1, 65_536), "seq_len": (1, 1 << 24),
                                            "layers": (1, 10_000)}


@dataclass(frozen=True)
class TimingPlan:
    """How candidates, eager and torch.compile are timed; ``[eval]`` keys of the same names."""

    warmup: int = 3  # untimed rounds first
    min_reps: int = 20  # timed rounds at least...
    max_reps: int = 200  # ...and at most; in between, as many as fit the budget
    budget_s: float = 0.12  # wall time aimed at for all timed rounds together
    hold_rounds: int = 8  # rounds queued behind one hold of the stream (0: no hold)
    wall_calls: int = 20  # calls issued back to back for the wall time per call (0: none)

    def __post_init__(self) -> None:
        _at_least(self, "warmup", 0)
        _at_least(self, "hold_rounds", 0)
        _at_least(self, "wall_calls", 0)
        _at_least(self, "min_reps", 1)
        _at_least(self, "max_reps", 1)
        _finite(self, "budget_s")


@dataclass(frozen=True)
class EvalSettings(_Section):
    """``[eval]``: how candidates are verified and timed, and the GPU workers that do it. The
    timing plan's keys sit in the same table (``warmup = 5``), as a session stores them."""

    SECTION: ClassVar[str] = "eval"

    devices: tuple[int, ...] | None = None  # GPU indices to evaluate on; None: every visible GPU
    timeout_s: float = 60.0  # one evaluation; a worker past it is killed and replaced
    baseline_timeout_s: float = 900.0  # eager and torch.compile of one op (cold caches: minutes)
    start_timeout_s: float = 300.0  # a worker's start
    seeds: tuple[int, ...] = (1, 2, 3)  # seeds of the random input sets a candidate is checked on
    max_samples: int = 2  # captured sample inputs a candidate is checked on, before random sets
    timing_sets: int = 3  # input buffers (at different addresses) rotated while timing
    timing: TimingPlan = field(default_factory=TimingPlan)  # warmup, min_reps, max_reps, budget_s
    compile_baseline: bool = True  # time torch.compile beside eager
    stress_seed: int = 11  # seed of the input sets that stress the op's semantics
    checked_timed_calls: int = 8  # timed calls, chosen at random, whose results are verified
    host_reps: int = 30  # calls timed on the host for the launch path's own cost
    recycle_after: int = 20  # evaluations a worker serves before a fresh one replaces it
    # workers evaluating side by side on each GPU: their checks overlap, their timed sections
    # take turns holding the GPU alone (a spare beside them replaces one at once)
    workers: int = 2
    sanitize: bool = True  # a new best runs under compute-sanitizer before it counts
    counters: bool = True  # a correct candidate's kernels are measured with hardware counters

    def __post_init__(self) -> None:
        if self.devices is not None and any(d < 0 for d in self.devices):
            raise InvalidValue("devices", "must list GPU indices, 0 or more", list(self.devices))
        for key in ("timeout_s", "baseline_timeout_s", "start_timeout_s"):
            _finite(self, key, above=True)
        for key in ("max_samples", "checked_timed_calls"):
            _at_least(self, key, 0)
        for key in ("timing_sets", "host_reps", "recycle_after", "workers"):
            _at_least(self, key, 1)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None,
                  origin: Origin | None = None) -> EvalSettings:
        origin = origin or Origin()
        table = _table(data, origin, cls.SECTION)
        plan_keys = [f.name for f in fields(TimingPlan)]
        plan = {k: table.pop(k) for k in plan_keys if k in table}
        return _read(cls, table, origin, cls.SECTION, also_known=plan_keys,
                     built={"timing": _read(TimingPlan, plan, origin, cls.SECTION)})

    def table(self) -> dict[str, Any]:
        flat = asdict(self)
        plan = flat.pop("timing")
        return {**flat, **plan}


@dataclass(frozen=True)
class Price:
    """What an LLM's tokens cost: USD per million."""

    input_per_mtok: float
    output_per_mtok: float

    def __post_init__(self) -> None:
        _finite(self, "input_per_mtok")
        _finite(self, "output_per_mtok")

    def cost(self, input_tokens: int, output_tokens: int) -> float:
        return (input_tokens * self.input_per_mtok + output_tokens * self.output_per_mtok) / 1e6


@dataclass(frozen=True, repr=False)
class LlmSection(_Section):
    """``[llm]``: the OpenAI-compatible endpoint the ``llm`` proposer asks, as the config file gives
    it; ``kforge.propose.llm.settings`` lays the environment and a session's model over it. The
    API key (and a password in ``base_url``) is a secret: it is kept out of ``repr`` and out of
    ``to_dict``, so out of anything stored or shown."""

    SECTION: ClassVar[str] = "llm"

    base_url: str | None = None  # the server's /v1 URL; None: OpenAI's own endpoint
    model: str | None = None  # a model name the endpoint serves
    api_key: str | None = None  # or KFORGE_LLM_API_KEY in the environment
    timeout_s: float = 300.0  # one request (a slow local model takes minutes for a long kernel)
    max_retries: int = 3  # further tries of a request that failed for a passing reason
    temperature: float | None = None  # None: the server's default (some models accept no other)
    max_tokens: int = 8192  # the longest reply asked for
    # [llm.prices."model"]: what calls cost; a "default" entry prices every other model
    prices: dict[str, Price] = field(default_factory=dict)

    def __post_init__(self) -> None:
        _finite(self, "timeout_s", above=True)
        _at_least(self, "max_retries", 0)
        _finite(self, "temperature")
        _at_least(self, "max_tokens", 1)
        password = url_credentials(self.base_url)
        for key, secret in (("api_key", self.api_key), ("base_url", password and password[1])):
            if secret and (problem := secret_problem(secret)):
                what = "its password " if key == "base_url" else ""
                raise InvalidValue(key, what + problem, secret, secret=True)

    def to_dict(self) -> dict[str, Any]:
        table = self.table()
        del table["api_key"]
        table["base_url"] = _without_password(self.base_url)
        return table

    def __repr__(self) -> str:
        shown = ", ".join(f"{key}={value!r}" for key, value in self.to_dict().items())
        return f"LlmSection({shown})"


def _without_password(url: str | None) -> str | None:
    parts = urlsplit(url) if url else None
    if parts is None or parts.password is None:
        return url
    host = parts.netloc.rsplit("@", 1)[1]
    return urlunsplit(parts._replace(netloc=f"{parts.username}:{REDACTED}@{host}"))


@dataclass(frozen=True)
class TuiSettings(_Section):
    """``[tui]``: how kforge-tui looks."""

    SECTION: ClassVar[str] = "tui"

    theme: str = DEFAULT_THEME  # a shipped theme or one in <config dir>/themes/ (ctrl+t picks)


@dataclass(frozen=True)
class StoreSettings(_Section):
    """``[store]``: how the session database is written."""

    SECTION: ClassVar[str] = "store"

    # "full": every committed result (a finished evaluation, its cost) survives a power loss, one
    # fsync per commit; "normal": faster commits, the last ones may be lost on a power loss (never
    # on a crash of kforge itself).
    durability: str = "full"

    def __post_init__(self) -> None:
        if self.durability not in DURABILITY:
            raise InvalidValue("durability", f"must be one of {', '.join(DURABILITY)}",
                               self.durability)


DURABILITY = ("full", "normal")


@dataclass(frozen=True)
class KeyBindings(_Section):
    """``[keys]``: kforge-tui's bindings remapped by id (``prune = "x"``, ``quit = "q,ctrl+c"``).
    Which ids exist, and which keys a terminal can send, the TUI checks: it knows its bindings."""

    SECTION: ClassVar[str] = "keys"

    by_id: dict[str, str] = field(default_factory=dict)  # binding id -> comma-separated keys

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None,
                  origin: Origin | None = None) -> KeyBindings:
        origin = origin or Origin()
        table = _table(data, origin, cls.SECTION)
        for binding_id, keys in table.items():
            if not isinstance(keys, str) or not keys.strip():
                raise SettingsError(f"[keys] {binding_id} {origin.where} must name a key as "
                                    f'text, e.g. "x", not {keys!r}')
        return cls(table)

    def table(self) -> dict[str, Any]:
        return dict(self.by_id)


SECTIONS: dict[str, type[_Section]] = {
    s.SECTION: s for s in (SearchSettings, EvalSettings, LlmSection, TuiSettings, StoreSettings,
                           KeyBindings)}


@dataclass(frozen=True)
class Settings:
    """The user's whole config file, section by section; a section it leaves out has every
    default."""

    search: SearchSettings = field(default_factory=SearchSettings)
    eval: EvalSettings = field(default_factory=EvalSettings)
    llm: LlmSection = field(default_factory=LlmSection)
    tui: TuiSettings = field(default_factory=TuiSettings)
    store: StoreSettings = field(default_factory=StoreSettings)
    keys: KeyBindings = field(default_factory=KeyBindings)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None, origin: Origin | None = None) -> Settings:
        """The tree from the config file's tables; SettingsError names the first bad section or
        key."""
        origin = origin or Origin()
        table = _table(data, origin, None)
        for name in table:
            if name not in SECTIONS:
                raise SettingsError(f"unknown section [{name}] {origin.where} "
                                    f"({did_you_mean(name, SECTIONS)})")
        return cls(**{name: section.from_dict(table.get(name), origin)
                      for name, section in SECTIONS.items()})

    def to_dict(self) -> dict[str, Any]:
        """Every section as a table, secrets left out."""
        return {name: getattr(self, name).to_dict() for name in SECTIONS}


@dataclass(frozen=True)
class SessionSettings:
    """What a session stores of its settings: the search and evaluation settings it runs with,
    the LLM model it asks for, and everything else as stored (how its model was profiled, tables
    that plug-in proposers and evaluators read)."""

    STORED: ClassVar[tuple[str, ...]] = ("search", "eval", "llm_model")

    search: SearchSettings = field(default_factory=SearchSettings)
    eval: EvalSettings = field(default_factory=EvalSettings)
    llm_model: str | None = None  # the model this session asks the [llm] endpoint for
    extra: dict[str, Any] = field(default_factory=dict)  # dtype, batch, ...; plug-ins' tables

    @classmethod
    def from_stored(cls, data: Mapping[str, Any] | None,
                    origin: Origin | None = None) -> SessionSettings:
        """Read what a session stored: leniently unless ``origin`` says otherwise, so settings an
        older kforge wrote still load (what was dropped is in ``origin.notes``)."""
        origin = origin or Origin("in the stored session settings", strict=False)
        table = _table(data, origin, None)
        model = table.get("llm_model")
        if model is not None and not isinstance(model, str):
            _drop(SettingsError(f"llm_model {origin.where} must be text, not {model!r}"), origin)
            model = None
        return cls(search=SearchSettings.from_dict(table.get("search"), origin),
                   eval=EvalSettings.from_dict(table.get("eval"), origin), llm_model=model,
                   extra={k: v for k, v in table.items() if k not in cls.STORED})


_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(s|m|h)?\s*$")


def parse_duration(text: str) -> float:
    """``90``, ``90s``, ``15m``, ``2h`` -> seconds."""
    m = _DURATION.match(text)
    if not m:
        raise SettingsError(f"cannot read {text!r} as a duration: use e.g. 90s, 15m or 2h")
    return float(m.group(1)) * {"s": 1, "m": 60, "h": 3600, None: 1}[m.group(2)]
