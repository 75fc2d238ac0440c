"""The settings tree: every setting a user can give kforge, typed, documented and checked once.

One frozen dataclass per section of the config file (``[search]``, ``[eval]``, ``[llm]``, ``[tui]``,
``[keys]``), gathered in ``Settings``; ``SessionSettings`` is what a session stores of them. The
CLI, the engine and the TUI read these records, never the raw tables.

What a person wrote (the config file, the command line) is read strictly: an unknown key is an
error that suggests the nearest known one, and a value of the wrong type or out of range is an
error naming where it came from, its section and its key. What an older kforge stored with a
session is read leniently: keys this version does not know, and values it no longer accepts, are
dropped (the default stands in), each with a note, so old sessions still open and resume. The
reading, and each field's value rules, are the codec's (``kforge.core.schema``).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields
from typing import Any, ClassVar, TypeVar
from urllib.parse import urlsplit, urlunsplit

from kforge.core.mcts import MctsParams
from kforge.core.schema import (
    InvalidValue,
    Origin,
    SchemaError,
    bounds,
    check,
    checked,
    did_you_mean,
    nearest,
    read,
    table,
)
from kforge.core.secrets import REDACTED, secret_problem, url_credentials

DEFAULT_THEME = "kforge-dark"

T = TypeVar("T")

# A setting that is unknown, of the wrong type or out of range; the message names it.
SettingsError = SchemaError

__all__ = ["InvalidValue", "Origin", "SettingsError", "did_you_mean", "nearest"]


class _Section:
    """What every section of the tree offers: reading a table, writing one back, and updating
    some keys."""

    SECTION: ClassVar[str]

    def __post_init__(self) -> None:
        check(self)

    @classmethod
    def from_dict(cls: type[T], data: Mapping[str, Any] | None,
                  origin: Origin | None = None) -> T:
        """The section from its table; SettingsError names the first bad key."""
        return read(cls, data, origin or Origin(), cls.SECTION)  # type: ignore[attr-defined]

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
    # average per op; the split over ops follows share and headroom
    iterations_per_op: int = checked(24, least=1, most=1_000_000)
    # an op may take up to this many times the average
    max_op_factor: float = checked(3.0, finite=True, above=0, most=1_000)
    # total LLM spend allowed for the session, in US dollars
    usd: float | None = checked(None, finite=True, least=0, most=1_000_000)
    # total engine run time allowed for the session, in seconds
    wall_s: float | None = checked(None, finite=True, above=0, most=366 * 24 * 3600)
    # proposals in flight at once: enough to keep every GPU worker busy
    parallel: int = checked(4, least=1, most=256)
    # confirmations (compute-sanitizer beside a fresh worker's re-timing) in flight at once, beside
    # the search's evaluations; never more than one per op
    confirmations: int = checked(2, least=1, most=64)
    # stop an op after this many iterations without improvement
    patience: int = checked(12, least=1, most=1_000_000)
    seed: int = checked(0, least=0, most=2**32 - 1)  # random seed of the search
    # search this op card first (an id `kforge show` lists), then all
    focus: int | None = checked(None, least=1, most=2**63 - 1)
    # only search the ops with the largest time shares
    top_ops: int | None = checked(None, least=1, most=100_000)
    # [search.mcts]: the tree search's constants (exploration, widening, repairs)
    mcts: MctsParams = field(default_factory=MctsParams)

    # The range each number may take (the command line's options state it): beyond it, a
    # setting is a slip (--parallel 100000, --time 99999999999h), never a search to run.
    RANGES: ClassVar[dict[str, tuple[float, float]]]

    def __post_init__(self) -> None:
        check(self)
        if self.cluster != self.cluster.strip():
            raise InvalidValue("cluster", "must be an address without spaces around it",
                               self.cluster)

    @property
    def per_op_limit(self) -> int:
        """The most iterations one op may take."""
        return max(1, math.ceil(self.iterations_per_op * self.max_op_factor))


SearchSettings.RANGES = bounds(SearchSettings)


# The range each option of how a model is built may take (`kforge profile --batch ...`).
MODEL_RANGES: dict[str, tuple[int, int]] = {"batch": (1, 65_536), "seq_len": (1, 1 << 24),
                                            "layers": (1, 10_000)}


@dataclass(frozen=True)
class TimingPlan:
    """How candidates, eager and torch.compile are timed; ``[eval]`` keys of the same names."""

    warmup: int = checked(3, least=0)  # untimed rounds first
    min_reps: int = checked(20, least=1)  # timed rounds at least...
    max_reps: int = checked(200, least=1)  # ...and at most; in between, as many as fit the budget
    # wall time aimed at for all timed rounds together
    budget_s: float = checked(0.12, finite=True, least=0)
    # rounds queued behind one hold of the stream (0: no hold)
    hold_rounds: int = checked(8, least=0)
    # calls issued back to back for the wall time per call (0: none)
    wall_calls: int = checked(20, least=0)

    def __post_init__(self) -> None:
        check(self)


@dataclass(frozen=True)
class EvalSettings(_Section):
    """``[eval]``: how candidates are verified and timed, and the GPU workers that do it. The
    timing plan's keys sit in the same table (``warmup = 5``), as a session stores them."""

    SECTION: ClassVar[str] = "eval"

    devices: tuple[int, ...] | None = None  # GPU indices to evaluate on; None: every visible GPU
    # one evaluation; a worker past it is killed and replaced
    timeout_s: float = checked(60.0, finite=True, above=0)
    # eager and torch.compile of one op (cold caches: minutes)
    baseline_timeout_s: float = checked(900.0, finite=True, above=0)
    start_timeout_s: float = checked(300.0, finite=True, above=0)  # a worker's start
    seeds: tuple[int, ...] = (1, 2, 3)  # seeds of the random input sets a candidate is checked on
    # captured sample inputs a candidate is checked on, before random sets
    max_samples: int = checked(2, least=0)
    # input buffers (at different addresses) rotated while timing
    timing_sets: int = checked(3, least=1)
    timing: TimingPlan = field(default_factory=TimingPlan)  # warmup, min_reps, max_reps, budget_s
    compile_baseline: bool = True  # time torch.compile beside eager
    stress_seed: int = 11  # seed of the input sets that stress the op's semantics
    # timed calls, chosen at random, whose results are verified
    checked_timed_calls: int = checked(8, least=0)
    # calls timed on the host for the launch path's own cost
    host_reps: int = checked(30, least=1)
    # evaluations a worker serves before a fresh one replaces it
    recycle_after: int = checked(20, least=1)
    # workers evaluating side by side on each GPU: their checks overlap, their timed sections
    # take turns holding the GPU alone
    workers: int = checked(2, least=1)
    # workers kept started beside them on each GPU, having run nothing: one replaces a recycled
    # worker, or re-times a confirmation, at once (two confirmations may run at a time)
    spares: int = checked(2, least=1, most=16)
    sanitize: bool = True  # a new best runs under compute-sanitizer before it counts
    counters: bool = True  # a correct candidate's kernels are measured with hardware counters

    def __post_init__(self) -> None:
        if self.devices is not None and any(d < 0 for d in self.devices):
            raise InvalidValue("devices", "must list GPU indices, 0 or more", list(self.devices))
        check(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None,
                  origin: Origin | None = None) -> EvalSettings:
        origin = origin or Origin()
        given = table(data, origin, cls.SECTION)
        plan_keys = [f.name for f in fields(TimingPlan)]
        plan = {k: given.pop(k) for k in plan_keys if k in given}
        return read(cls, given, origin, cls.SECTION, also_known=plan_keys,
                    built={"timing": read(TimingPlan, plan, origin, cls.SECTION)})

    def table(self) -> dict[str, Any]:
        flat = asdict(self)
        plan = flat.pop("timing")
        return {**flat, **plan}


@dataclass(frozen=True)
class Price:
    """What an LLM's tokens cost: USD per million."""

    input_per_mtok: float = checked(finite=True, least=0)
    output_per_mtok: float = checked(finite=True, least=0)

    def __post_init__(self) -> None:
        check(self)

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
    # one request (a slow local model takes minutes for a long kernel)
    timeout_s: float = checked(300.0, finite=True, above=0)
    # further tries of a request that failed for a passing reason
    max_retries: int = checked(3, least=0)
    # None: the server's default (some models accept no other)
    temperature: float | None = checked(None, finite=True, least=0)
    max_tokens: int = checked(8192, least=1)  # the longest reply asked for
    # [llm.prices."model"]: what calls cost; a "default" entry prices every other model
    prices: dict[str, Price] = field(default_factory=dict)

    def __post_init__(self) -> None:
        check(self)
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
    durability: str = checked("full", choices=("full", "normal"))


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
        given = table(data, origin, cls.SECTION)
        for binding_id, keys in given.items():
            if not isinstance(keys, str) or not keys.strip():
                raise SettingsError(f"[keys] {binding_id} {origin.where} must name a key as "
                                    f'text, e.g. "x", not {keys!r}')
        return cls(given)

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
        given = table(data, origin, None)
        for name in given:
            if name not in SECTIONS:
                raise SettingsError(f"unknown section [{name}] {origin.where} "
                                    f"({did_you_mean(name, SECTIONS)})")
        return cls(**{name: section.from_dict(given.get(name), origin)
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
        given = table(data, origin, None)
        return read(cls, {"llm_model": given.get("llm_model")}, origin, built={
            "search": SearchSettings.from_dict(given.get("search"), origin),
            "eval": EvalSettings.from_dict(given.get("eval"), origin),
            "extra": {k: v for k, v in given.items() if k not in cls.STORED}})


_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(s|m|h)?\s*$")


def parse_duration(text: str) -> float:
    """``90``, ``90s``, ``15m``, ``2h`` -> seconds."""
    m = _DURATION.match(text)
    if not m:
        raise SettingsError(f"cannot read {text!r} as a duration: use e.g. 90s, 15m or 2h")
    return float(m.group(1)) * {"s": 1, "m": 60, "h": 3600, None: 1}[m.group(2)]
