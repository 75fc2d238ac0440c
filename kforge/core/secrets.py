"""Secrets kept out of everything kforge writes: found by what they are, in every form they take.

An LLM secret (an API key, the password of a ``base_url``) leaves kforge's hands in more than one
form: as given; percent-encoded, wholly or in part, once or twice (an HTTP library logs each
request's URL with its password so); escaped by JSON or a ``repr``; base64-encoded in a basic
``Authorization`` header (``user:password``), or as part of any other base64 text. ``redact``
replaces each of these with ``REDACTED``, in one pass over the text.

A secret is found wherever it appears, so one that is short would be found inside other text
too (a key ``x`` rewrote op names such as ``aten._softmax.default``, and a settings key
``search``): a secret shorter than ``MIN_SECRET_CHARS`` is refused where it is configured
(``secret_problem``), and never searched for. What kforge keeps of its own (op names, settings
keys, paths) its store never passes through redaction at all (``kforge.store.connection``).
"""

from __future__ import annotations

import base64
import re
from collections.abc import Iterable, Mapping
from functools import lru_cache
from typing import Any
from urllib.parse import unquote, urlsplit

REDACTED = "[redacted]"  # what a secret is replaced with in text kforge shows or keeps
# Shorter than this, a secret cannot be told apart from the text around it.
MIN_SECRET_CHARS = 8
_KEY_VARIABLES = ("KFORGE_LLM_API_KEY", "OPENAI_API_KEY")
_URL_VARIABLES = ("KFORGE_LLM_BASE_URL", "OPENAI_BASE_URL")
# A base64 run of this many characters or more that a secret alone decides is searched for in
# base64 text of any alignment; a shorter one could be anything's.
_MIN_BASE64_RUN = 12


def secret_problem(secret: str) -> str | None:
    """Why ``secret`` cannot be kept out of what kforge writes, or None where it can. The
    secret itself is never quoted."""
    length = len(unquote(secret))
    if length < MIN_SECRET_CHARS:
        return (f"is {length} character{'s' * (length != 1)} long: a secret shorter than "
                f"{MIN_SECRET_CHARS} would be found inside other text, so it cannot be kept out "
                "of logs and the database; use the key the server gave (a server that needs "
                "none needs no api_key)")
    return None


def url_credentials(url: str | None) -> tuple[str, str] | None:
    """``(user, password)`` of a URL with a password, as written in it; None for any other."""
    try:
        parts = urlsplit(url) if url else None
        password = parts.password if parts else None
    except ValueError:  # not a URL: it holds no password to find
        return None
    if parts is None or password is None:
        return None
    return parts.username or "", password


def known_secrets(keys: Iterable[str | None], urls: Iterable[str | None],
                  env: Mapping[str, str] = {}) -> tuple[str, ...]:  # noqa: B006 (read only)
    """The secrets among ``keys`` and the passwords of ``urls``, and those of the environment's
    LLM variables, each once: a password also as ``user:password`` (the basic authorization an
    HTTP library sends for it). One too short to find safely (``secret_problem``) is left out:
    it is refused wherever it would be used."""
    keys = [*keys, *(env.get(name) for name in _KEY_VARIABLES)]
    urls = [*urls, *(env.get(name) for name in _URL_VARIABLES)]
    found = [key for key in keys if key and not secret_problem(key)]
    for credentials in map(url_credentials, urls):
        if credentials and not secret_problem(credentials[1]):
            user, password = credentials
            found += [password, f"{user}:{password}"]
    return tuple(dict.fromkeys(found))


def redact(text: str, secrets: Iterable[str]) -> str:
    """``text`` with every form of every secret replaced by ``REDACTED``: the one redaction of
    all text kforge records, shows or sends."""
    pattern = _pattern(tuple(sorted(set(secrets))))
    return pattern.sub(REDACTED, text) if pattern is not None else text


def redact_values(value: Any, secrets: Iterable[str]) -> Any:
    """``value`` (JSON-like data) with its text values redacted; keys, which name kforge's own
    fields, are kept as they are."""
    secrets = tuple(secrets)
    if isinstance(value, str):
        return redact(value, secrets)
    if isinstance(value, Mapping):
        return {key: redact_values(item, secrets) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [redact_values(item, secrets) for item in value]
    return value


@lru_cache(maxsize=64)
def _pattern(secrets: tuple[str, ...]) -> re.Pattern[str] | None:
    """One pattern matching every form of every secret: its literal forms first, longest first
    (where one secret holds another, the longer is found whole), then its base64 forms."""
    literal, encoded = set(), set()
    for secret in secrets:
        if secret_problem(secret):
            continue
        for plain in {secret, unquote(secret)}:
            literal.add(plain)
            encoded.update(_base64_forms(plain.encode()))
    if not literal:
        return None
    alternatives = [_spelled(s) for s in sorted(literal, key=len, reverse=True)]
    alternatives += [re.escape(s) for s in sorted(encoded, key=len, reverse=True)]
    return re.compile("|".join(alternatives))


def _spelled(secret: str) -> str:
    """A pattern for ``secret`` however each of its characters is written: as itself,
    percent-encoded (either case, once or twice), JSON's ``\\uXXXX`` or a backslash before it,
    or ``+`` for a space."""
    return "".join(_character(c) for c in secret)


def _character(c: str) -> str:
    forms = [re.escape(c)]
    forms.append("".join(f"%(?:25)?{_hex(byte)}" for byte in c.encode()))
    units = c.encode("utf-16-be")
    forms.append("".join(rf"\\u{_hex(units[i])}{_hex(units[i + 1])}"
                         for i in range(0, len(units), 2)))
    if not c.isalnum():
        forms.append(re.escape("\\" + c))
    if c == " ":
        forms.append(r"\+")
    return f"(?:{'|'.join(forms)})"


def _hex(byte: int) -> str:
    """Two hexadecimal digits of ``byte`` in either case."""
    return "".join(f"[{d.lower()}{d.upper()}]" if d.isalpha() else d for d in f"{byte:02X}")


def _base64_forms(data: bytes) -> set[str]:
    """``data`` base64-encoded (the standard and the URL-safe alphabet, with and without its
    padding), and the runs of characters that ``data`` alone decides wherever it lies in longer
    base64 text (at each of the three alignments)."""
    forms = set()
    for encode in (base64.b64encode, base64.urlsafe_b64encode):
        whole = encode(data).decode()
        forms |= {whole, whole.rstrip("=")}
        for offset in range(3):
            stream = encode(bytes(offset) + data + bytes(2)).decode()
            first = -(-8 * offset // 6)  # the first character made of the data's bits alone
            last = (8 * (offset + len(data)) - 6) // 6
            run = stream[first:last + 1]
            if len(run) >= _MIN_BASE64_RUN:
                forms.add(run)
    return forms
