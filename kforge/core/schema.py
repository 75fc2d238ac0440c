"""The one codec: dataclass records read from and written to plain data (JSON objects, TOML
tables, stored rows), with each field's type and value rules declared once, on the record.

Reading follows the record's type hints (ints widen to floats, lists become tuples, nested records
and tables of records are read by the same rules) and the rules a field carries in its metadata
(``checked``: ranges, finite numbers, choices, the longest text). How it reads is its ``Origin``:

* strict, for what a person wrote (a config file, the command line): an unknown key is an error
  that suggests the nearest known one, and a bad value is an error naming its section and key;
* lenient, for what was stored (a session's settings): unknown keys and bad values are dropped
  with a note each in ``Origin.notes`` (the field keeps its default), so old data still opens;
  an outcome's stored facts (``Origin.facts``) are read so too, their notes naming each dropped
  value by its path (``host.host_us is "fast", not a finite number: dropped``), and ``salvage``
  drops a whole record that cannot be read;
* a record's, for what a kforge process wrote (a wire message, an event row, a stored figure):
  keys this version does not know are passed over (a newer writer's), and a bad or missing value
  is an error. kforge writes no infinity or NaN: a float read so must be finite.

``encode`` writes a record back as plain data, all its fields or (``defaults=False``) those that
differ from their default. A type that keeps its own ``from_dict``/``to_dict`` (not this codec's
``Record`` wrappers) is read and written through them; an error it raises is reported as that
field's.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, fields
from enum import Enum
from pathlib import Path
from types import UnionType
from typing import Any, TypeVar, Union, get_args, get_origin, get_type_hints

from kforge.errors import KforgeError

T = TypeVar("T")
RULE = "kforge.rule"  # the metadata key of a field's value rule
STORED_AS = "kforge.key"  # the metadata key of a field stored under another key
SPREAD = "kforge.spread"  # the metadata key of a dict field whose entries sit beside the others
NOTED_CHARS = 80  # a dropped value as a note quotes it
_UNSET: Any = object()  # no value given


class SchemaError(KforgeError, ValueError):
    """A value that is unknown, missing, of the wrong type or against its field's rule; the
    message names the field (``[section] key where problem``). ``value`` is the value refused
    and ``wanted`` what its type wanted, where it was of the wrong type."""

    def __init__(self, message: str, *, section: str | None = None, key: str = "",
                 problem: str = "", missing: bool = False, value: Any = _UNSET,
                 wanted: str = "") -> None:
        super().__init__(message)
        self.section, self.key, self.problem, self.missing = section, key, problem, missing
        self.value, self.wanted = value, wanted

    @classmethod
    def of(cls, section: str | None, key: str, where: str, problem: str, *,
           missing: bool = False, value: Any = _UNSET, wanted: str = "") -> SchemaError:
        """The error of field ``key`` of ``[section]``, read from ``where``."""
        label = f"[{section}] " if section else ""
        message = " ".join(part for part in (f"{label}{key}".strip(), where, problem) if part)
        return cls(message, section=section, key=key, problem=problem, missing=missing,
                   value=value, wanted=wanted)

    @classmethod
    def wrong(cls, section: str | None, key: str, where: str, value: Any,
              wanted: str) -> SchemaError:
        """The error of a value that is not of its field's type."""
        return cls.of(section, key, where, f"must be {wanted}, not {value!r}", value=value,
                      wanted=wanted)

    @property
    def name(self) -> str:
        """The field's dotted path (``speedups.eager``)."""
        return _inner(self.section, self.key) if self.key else self.section or ""

    def noted(self) -> str:
        """The note of a value dropped for this error, naming it by its path."""
        if self.missing:
            return f"{self.section} lacks {self.key}: dropped"
        if self.wanted:
            return f"{self.name} is {_quoted(self.value)}, not {self.wanted}: dropped"
        return f"{self.name} {self.problem}: dropped"


class InvalidValue(SchemaError):
    """A value that breaks its field's rule, raised by ``check`` or a record's own check; reading
    a table re-raises it as a SchemaError that also says where the value came from."""

    def __init__(self, key: str, rule: str, value: object, *, secret: bool = False) -> None:
        self.rule, self.value = rule, value
        # a secret's value is never quoted back
        self.given = "" if secret else f", not {value!r}"
        super().__init__(f"{key} {rule}{self.given}", key=key, problem=f"{rule}{self.given}")


@dataclass(frozen=True)
class Origin:
    """Where a table comes from, as messages name it (``in /path/config.toml``, ``on the command
    line``), and how it is read: strictly for what a person wrote; leniently (``strict=False``)
    for what was stored, where an unknown key or a bad value is dropped and noted in ``notes``;
    ``open`` passes keys no field has over in silence (what a newer kforge process wrote);
    ``whole`` wants every field given, those with a default too (a message of this version);
    ``finite`` refuses an infinite or NaN float (kforge writes none); ``by_path``: a note names a
    dropped value by its path (``SchemaError.noted``)."""

    where: str = "as given"
    strict: bool = True
    notes: list[str] = field(default_factory=list, compare=False)
    open: bool = False
    whole: bool = False
    finite: bool = False
    by_path: bool = False

    @classmethod
    def stored(cls, session_id: int) -> Origin:
        return cls(f"in the stored settings of session {session_id}", strict=False)

    @classmethod
    def record(cls, *, whole: bool = False) -> Origin:
        """What a kforge process wrote: unknown keys passed over, a bad value an error."""
        return cls("", open=True, whole=whole, finite=True)

    @classmethod
    def facts(cls) -> Origin:
        """An outcome's stored facts: unknown keys passed over, each damaged value dropped and
        noted by its path."""
        return cls("", strict=False, open=True, finite=True, by_path=True)


# ----- value rules -----


@dataclass(frozen=True)
class Rule:
    """What a field's values must be beyond their type; a container's rule holds for each of its
    items (each value of a table)."""

    least: float | None = None  # at least this
    above: float | None = None  # greater than this
    most: float | None = None  # at most this
    finite: bool = False  # no nan or infinity
    choices: tuple[str, ...] = ()  # one of these
    longest: int | None = None  # at most this many characters
    means: str = ""  # what a value that keeps the rule is, as a problem names it

    def problem(self, value: Any) -> str | None:
        """What is wrong with ``value``, as ``must be ...`` (``must be {means}`` where the rule
        says what it means); None when it keeps the rule."""
        problem = self._problem(value)
        return f"must be {self.means}" if problem and self.means else problem

    def _problem(self, value: Any) -> str | None:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            if self.finite:
                bound = (f" above {self.above:g}" if self.above is not None else
                         f" of at least {self.least:g}" if self.least is not None else "")
                if not (math.isfinite(value) and self._bounded(value)):
                    return f"must be a finite number{bound}"
            elif not self._bounded(value):
                return (f"must be at least {self.least}" if self.above is None
                        else f"must be above {self.above}")
            if self.most is not None and not value <= self.most:
                return f"must be at most {self.most:,}"
        if self.choices and value not in self.choices:
            return f"must be one of {', '.join(self.choices)}"
        if self.longest is not None and isinstance(value, str) and len(value) > self.longest:
            return f"must be at most {self.longest:,} characters long"
        return None

    def _bounded(self, value: float) -> bool:
        return ((self.least is None or value >= self.least)
                and (self.above is None or value > self.above))


def checked(default: Any = dataclasses.MISSING, *, factory: Any = dataclasses.MISSING,
            stored_as: str | None = None, **rule: Any) -> Any:
    """A dataclass field whose values keep ``Rule(**rule)`` (``checked(4, least=1, most=256)``);
    ``stored_as`` names the key it is stored under where that differs from its name."""
    metadata: dict[str, Any] = {RULE: Rule(**rule)} if rule else {}
    if stored_as:
        metadata[STORED_AS] = stored_as
    return field(default=default, default_factory=factory, metadata=metadata)


def spread() -> Any:
    """A ``dict`` field whose entries are stored beside the record's other keys (every key no
    other field has)."""
    return field(default_factory=dict, metadata={SPREAD: True})


def bounds(cls: type) -> dict[str, tuple[float, float]]:
    """The range each bounded number of ``cls`` may take, by field (what options state)."""
    found = {}
    for f in fields(cls):
        rule = f.metadata.get(RULE)
        if rule is not None and rule.most is not None:
            found[f.name] = (rule.least if rule.least is not None else rule.above or 0, rule.most)
    return found


def _broken(rule: Rule, value: Any) -> str | None:
    """The first problem of ``value`` or, for a container, of one of its items."""
    if value is None:
        return None
    if isinstance(value, Mapping):
        items: Iterable[Any] = value.values()
    elif isinstance(value, (list, tuple)):
        items = value
    else:
        return rule.problem(value)
    return next((p for item in items if (p := _broken(rule, item)) is not None), None)


def check(record: object, rules: Mapping[str, Rule] | None = None) -> None:
    """Raise InvalidValue for the first field that breaks its rule (a record's ``__post_init__``
    calls it, so one built in code is checked as one read from data)."""
    for f in fields(record):  # type: ignore[arg-type]
        rule = (rules or {}).get(f.name) or f.metadata.get(RULE)
        if rule is not None:
            value = getattr(record, f.name)
            if (problem := _broken(rule, value)) is not None:
                raise InvalidValue(f.name, problem, value)


# ----- reading -----

_KINDS: dict[type, str] = {bool: "true or false", int: "a whole number", float: "a number",
                           str: "text", dict: "a table", list: "a list"}


def nearest(word: str, known: Iterable[str]) -> str | None:
    """The known word that ``word`` most likely misspells, if any is close."""
    close = difflib.get_close_matches(word, sorted(known), n=1)
    return close[0] if close else None


def did_you_mean(word: str, known: Iterable[str]) -> str:
    """``did you mean X?`` for the known word nearest ``word``, else the known words listed."""
    known = sorted(known)
    guess = nearest(word, known)
    return f"did you mean {guess}?" if guess else f"known: {', '.join(known) or 'none'}"


def table(data: object, origin: Origin, section: str | None, what: str = "settings"
          ) -> dict[str, Any]:
    """``data`` as a table (None: an empty one); SchemaError where it is something else."""
    if data is None:
        return {}
    if not isinstance(data, Mapping):
        raise SchemaError.of(section, "" if section else f"the {what}", origin.where,
                             f"must be a table of {what}, not {data!r}", value=data,
                             wanted="a table")
    return dict(data)


def _inner(section: str | None, key: str) -> str:
    return f"{section}.{key}" if section else key


def _bare(name: str) -> str:
    """A table name as TOML writes it: quoted unless it is a bare key."""
    return name if re.fullmatch(r"[A-Za-z0-9_-]+", name) else f'"{name}"'


def _is_kind(value: object, kind: type, finite: bool = False) -> bool:
    if kind is float:
        return (isinstance(value, (int, float)) and not isinstance(value, bool)
                and (not finite or math.isfinite(value)))
    if kind is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, kind)


def own_codec(kind: Any) -> bool:
    """Whether ``kind`` reads and writes itself (its own ``from_dict``/``to_dict``)."""
    return (isinstance(kind, type) and hasattr(kind, "from_dict") and hasattr(kind, "to_dict")
            and not issubclass(kind, Record))


def _kind(hint: Any, origin: Origin) -> str:
    """What a value of type ``hint`` is, as an error names it (``a whole number``)."""
    shape, args = get_origin(hint), get_args(hint)
    if shape in (Union, UnionType):
        return " or ".join(_kind(a, origin) for a in args if a is not type(None))
    if shape is tuple:
        if len(args) == 2 and args[1] is Ellipsis:
            return f"a list of {_kind(args[0], origin).removeprefix('a ')}s"
        return f"a list of {len(args)} values"
    if hint is float and origin.finite:
        return "a finite number"
    if dataclasses.is_dataclass(hint) or shape is dict:
        return "a table"
    return _KINDS.get(shape or hint, f"a {getattr(hint, '__name__', hint)}")


def _convert(value: object, hint: Any, key: str, origin: Origin, section: str | None) -> Any:
    """``value`` as the field's type (ints widen to floats, lists become tuples); nested records
    and tables of records are read with the same rules; a union takes the first of its types
    that reads the value."""
    shape, args = get_origin(hint), get_args(hint)
    if shape in (Union, UnionType):
        if value is None and type(None) in args:
            return None
        options = [a for a in args if a is not type(None)]
        if len(options) > 1:
            for option in options:
                try:
                    return _convert(value, option, key, origin, section)
                except SchemaError:
                    continue
            raise SchemaError.wrong(section, key, origin.where, value, _kind(hint, origin))
        (hint,) = options
        shape, args = get_origin(hint), get_args(hint)
    if hint is Any or hint is object:
        return value
    if own_codec(hint):
        try:
            return hint.from_dict(value)
        except Exception as exc:  # whatever its reader raises, the field is named
            reason = " ".join(str(exc).split())[:160] or type(exc).__name__
            raise SchemaError.of(section, key, origin.where,
                                 f"cannot be read ({reason})") from None
    if dataclasses.is_dataclass(hint):
        return read(hint, value, origin, _inner(section, key))  # type: ignore[arg-type]
    if shape is dict:
        inner = _inner(section, key)
        return {name: _convert(entry, args[1], _bare(name), origin, inner)
                for name, entry in table(value, origin, inner).items()}
    if shape is tuple:
        return _items(value, hint, key, origin, section)
    if hint is Path and isinstance(value, str):
        return Path(value)
    if isinstance(hint, type) and issubclass(hint, Enum):
        try:
            return hint(value)
        except ValueError:
            choices = ", ".join(str(m.value) for m in hint)
            raise SchemaError.of(section, key, origin.where,
                                 f"must be one of {choices}, not {value!r}") from None
    if _is_kind(value, shape or hint, origin.finite):
        return float(value) if hint is float else value  # type: ignore[arg-type]
    raise SchemaError.wrong(section, key, origin.where, value, _kind(hint, origin))


def _items(value: object, hint: Any, key: str, origin: Origin, section: str | None) -> tuple:
    """A list as a tuple of its declared types (``tuple[int, ...]`` or ``tuple[int, int]``);
    a record among them names its own damage, any other item's is the list's."""
    args = get_args(hint)
    if not isinstance(value, (list, tuple)):
        raise SchemaError.wrong(section, key, origin.where, value, _kind(hint, origin))
    kinds = args[:1] * len(value) if len(args) == 2 and args[1] is Ellipsis else args
    if len(kinds) != len(value):
        raise SchemaError.wrong(section, key, origin.where, value, _kind(hint, origin))
    try:
        return tuple(_convert(item, kind, f"{key}[{i}]", origin, section)
                     for i, (item, kind) in enumerate(zip(value, kinds)))
    except SchemaError as exc:
        if exc.section != section:  # a record's field: named by its own path
            raise
        raise SchemaError.wrong(section, key, origin.where, value,
                                _kind(hint, origin)) from None


def read(cls: type[T], data: object, origin: Origin | None = None, section: str | None = None,
         *, built: Mapping[str, Any] | None = None, also_known: Iterable[str] = (),
         rules: Mapping[str, Rule] | None = None, what: str = "settings") -> T:
    """A ``cls`` from one table: unknown keys refused, values type-checked and converted, their
    rules (``checked``, or ``rules`` for a type declared elsewhere) kept, missing required ones
    named, then the record's own checks. Read leniently, an unknown key or a bad value is dropped
    with a note instead (the field keeps its default). ``built`` holds fields the caller read
    already; ``also_known`` keys it took out of the table."""
    origin = origin or Origin()
    built = dict(built or {})
    hints = get_type_hints(cls)
    own = [f for f in fields(cls) if f.name not in built]  # type: ignore[arg-type]
    by_key = {f.metadata.get(STORED_AS, f.name): f for f in own}
    rest = next((f.name for f in own if f.metadata.get(SPREAD)), None)
    values: dict[str, Any] = {}
    for key, value in table(data, origin, section, what).items():
        f = by_key.get(key)
        if f is None or f.name == rest:
            if rest is not None:
                values.setdefault(rest, {})[key] = value
            elif not origin.open:
                _unknown(key, [*by_key, *also_known], origin, section)
            continue
        try:
            values[f.name] = _convert(value, hints[f.name], key, origin, section)
        except SchemaError as exc:
            _drop(exc, origin)
    for f in own:
        rule = (rules or {}).get(f.name) or f.metadata.get(RULE)
        if rule is not None and f.name in values:
            if (problem := _broken(rule, values[f.name])) is not None:
                _drop(SchemaError.of(section, f.metadata.get(STORED_AS, f.name), origin.where,
                                     f"{problem}, not {values[f.name]!r}",
                                     value=values[f.name]), origin)
                del values[f.name]
    for f in own:
        if f.name not in values and (origin.whole or (f.default is dataclasses.MISSING and
                                                      f.default_factory is dataclasses.MISSING)):
            raise SchemaError.of(section, f.metadata.get(STORED_AS, f.name), origin.where,
                                 "is missing", missing=True)
    while True:
        try:
            return cls(**values, **built)
        except InvalidValue as exc:
            error = SchemaError.of(section, exc.key, origin.where, exc.problem)
            if exc.key not in values:
                raise error from None
            _drop(error, origin)
            del values[exc.key]


def _unknown(key: str, known: Iterable[str], origin: Origin, section: str | None) -> None:
    """Refuse a key no field has, or drop it with a note when reading stored data."""
    where = f"[{section}] {key}" if section else key
    if origin.strict:
        raise SchemaError(f"unknown setting {where} {origin.where} ({did_you_mean(key, known)})",
                          section=section, key=key, problem="is unknown")
    origin.notes.append(f"ignored unknown setting {where} {origin.where}")


def salvage(cls: type[T], data: object, origin: Origin, section: str) -> T | None:
    """A ``cls`` read as ``read`` reads it; read leniently, one that is no table or lacks a
    required field is None, noted."""
    try:
        return read(cls, data, origin, section)
    except SchemaError as exc:
        _drop(exc, origin)
        return None


def _drop(error: SchemaError, origin: Origin) -> None:
    """Refuse a bad value, or, reading stored data, note that its default replaces it."""
    if origin.strict:
        raise error from None
    origin.notes.append(error.noted() if origin.by_path else f"ignored {error}; using the default")


def _quoted(value: object) -> str:
    """``value`` as a note quotes it: as JSON, cut to ``NOTED_CHARS``."""
    text = json.dumps(value, default=str)
    return text if len(text) <= NOTED_CHARS else text[:NOTED_CHARS - 3] + "..."


# ----- writing -----


def encode(record: object, *, defaults: bool = True) -> dict[str, Any]:
    """A record as the plain table ``read`` reads back: nested records as tables, tuples as
    lists, paths as text, members of an enum as their values, types with their own codec
    through their ``to_dict``; ``defaults=False`` leaves out the fields at their default (in
    nested records too)."""
    data: dict[str, Any] = {}
    for f in fields(record):  # type: ignore[arg-type]
        value = getattr(record, f.name)
        if not defaults and _at_default(f, value):
            continue
        value = _plain(value, defaults)
        if f.metadata.get(SPREAD):
            data.update(value)
        else:
            data[f.metadata.get(STORED_AS, f.name)] = value
    return data


def _at_default(f: dataclasses.Field, value: Any) -> bool:
    if f.default is not dataclasses.MISSING:
        return bool(value == f.default)
    if f.default_factory is not dataclasses.MISSING:
        return bool(value == f.default_factory())
    return False


def _plain(value: Any, defaults: bool = True) -> Any:
    if own_codec(type(value)):
        return value.to_dict()
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return encode(value, defaults=defaults)
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, dict):
        return {key: _plain(item, defaults) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(item, defaults) for item in value]
    return value


class Record:
    """What a record that crosses a process or the store offers on top of the codec:
    ``from_dict`` (read as what a kforge process wrote: unknown keys passed over) and
    ``to_dict``."""

    @classmethod
    def from_dict(cls: type[T], data: Mapping[str, Any]) -> T:
        return read(cls, data, Origin.record(), what="fields")

    def to_dict(self) -> dict[str, Any]:
        return encode(self)
