"""The one check for values that come from outside the program.

Trace records and metadata lines, profile files, command-line values and server responses are
each described by a small schema: a mapping from field name to a :class:`Num` rule (int or
float, range, finite). :func:`check_fields` applies a schema to one parsed object at the
boundary, so nothing past it sees a NaN, an infinity, a bool posing as a number, a negative
count or an absurd size. Every failure is one :class:`InputError` whose message names where the
value came from (file and line, server, or flag) and the field, on one line.

Limits shared by every input kind live here too: :data:`MAX_TOKENS` (the longest sequence any
length field may state) and :data:`MAX_BLOCK_SIZE` (the largest block of tokens).

This module imports nothing from kvroute, so every package (``traces``, ``sim``, ``calibrate``,
``cli``) can use it.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

MAX_TOKENS = 1 << 27
"""Largest token count a length field may hold: 134,217,728 tokens, over ten times the longest
context of any model vLLM serves (10M). Larger values are typos or hostile input,
and would be expanded into ``len / block_size`` hash ids before ``max_model_len`` rejects them."""

MAX_BLOCK_SIZE = 1 << 20
"""Largest KV or trace block, tokens (vLLM's blocks are 16-256 tokens, Mooncake's 512)."""


class InputError(ValueError):
    """A value read from a file, a flag or a server is missing, of the wrong type or out of range.

    The message is one line: ``<where>:<line>: field '<field>': <reason>`` (parts that are None
    are left out).

    Attributes:
        where: the file, server URL or flag the value came from, or None.
        line: 1-based line number in that file, or None.
        field: the offending field name, or None.
        reason: the bare explanation, without the location prefix.
    """

    def __init__(self, reason: str, where: str | None = None, line: int | None = None,
                 field: str | None = None) -> None:
        self.where = None if where is None else str(where)
        self.line = line
        self.field = field
        self.reason = reason
        super().__init__(format_location(self.where, line, field) + " ".join(str(reason).split()))


def format_location(where: str | None, line: int | None, field: str | None) -> str:
    """The ``"file:line: field 'x': "`` prefix of an input error (empty when nothing is known)."""
    text = where or ""
    if line is not None:
        text += f":{line}" if text else f"line {line}"
    prefix = f"{text}: " if text else ""
    if field is not None:
        prefix += f"field '{field}': "
    return prefix


@dataclass(frozen=True, slots=True)
class Num:
    """Rule for one numeric field.

    Attributes:
        integer: the value must be an int (a float with an integral value, as some JSON writers
            produce, is accepted and returned as an int); otherwise int or float.
        minimum: smallest allowed value, or None.
        maximum: largest allowed value, or None.
        above: the value must be strictly greater than ``minimum``.
        unit: shown in messages ("tokens", "s", "ms").

    Bools are never numbers, and non-finite values are always rejected.
    """

    integer: bool = False
    minimum: float | None = None
    maximum: float | None = None
    above: bool = False
    unit: str = ""

    def check(self, value: object, field: str | None = None, where: str | None = None,
              line: int | None = None) -> int | float:
        """Return ``value`` (an int for integer rules) or raise :class:`InputError`."""
        kind = "an int" if self.integer else "a number"
        unit = f" ({self.unit})" if self.unit else ""
        if type(value) is int:
            pass
        elif type(value) is float:
            if not math.isfinite(value):
                raise InputError(f"must be a finite number, got {value!r}", where, line, field)
            if self.integer:
                if not value.is_integer():
                    raise InputError(f"expected {kind}{unit}, got {value!r}", where, line, field)
                value = int(value)
        else:
            raise InputError(f"expected {kind}{unit}, got {describe(value)}", where, line, field)
        if self.minimum is not None and (value <= self.minimum if self.above else value < self.minimum):
            relation = ">" if self.above else ">="
            raise InputError(f"must be {relation} {_fmt(self.minimum)}, got {value!r}", where, line, field)
        if self.maximum is not None and value > self.maximum:
            raise InputError(f"must be <= {_fmt(self.maximum)}, got {value!r}", where, line, field)
        return value


COUNT = Num(integer=True, minimum=0)
POSITIVE_INT = Num(integer=True, minimum=1)
TOKENS = Num(integer=True, minimum=1, maximum=MAX_TOKENS, unit="tokens")
BLOCK_SIZE = Num(integer=True, minimum=1, maximum=MAX_BLOCK_SIZE, unit="tokens")
SECONDS = Num(minimum=0.0, maximum=1e9, unit="s")  # up to ~31 years: later times lose all precision
MILLISECONDS = Num(minimum=0.0, maximum=SECONDS.maximum * 1000.0, unit="ms")
""":data:`SECONDS` for fields stated in ms (trace ``timestamp`` and ``think_time``): the same bound."""
COST_SECONDS = Num(minimum=0.0, maximum=3600.0, unit="s")  # a profile coefficient; larger overflows sums
FRACTION = Num(minimum=0.0, maximum=1.0, above=True)


def check_fields(doc: object, schema: dict[str, Num], where: str | None = None, line: int | None = None,
                 required: tuple[str, ...] = (), prefix: str = "") -> dict[str, int | float]:
    """Check the fields of ``doc`` named in ``schema``; return the checked values.

    Args:
        doc: a parsed JSON object (must be a dict).
        schema: field name -> rule. Fields absent from ``doc`` (or null) are skipped unless
            listed in ``required``; fields of ``doc`` not in ``schema`` are ignored.
        where: file, server or flag, for messages.
        line: line number, for messages.
        required: fields that must be present and non-null.
        prefix: prepended to field names in messages (``"engine."``).

    Returns:
        ``{field: value}`` for every present field of ``schema``.

    Raises:
        InputError: ``doc`` is not an object, a required field is missing, or a rule fails.
    """
    if type(doc) is not dict:
        raise InputError(f"expected a JSON object, got {describe(doc)}", where, line,
                         prefix.rstrip(".") or None)
    out: dict[str, int | float] = {}
    for name, rule in schema.items():
        value = doc.get(name)
        if value is None:
            if name in required:
                raise InputError("required field missing", where, line, prefix + name)
            continue
        out[name] = rule.check(value, prefix + name, where, line)
    return out


class DuplicateKeyError(InputError):
    """A JSON or YAML object names the same key twice (parsers would silently keep the last).

    ``field`` is the repeated key; ``key`` the key as parsed.
    """

    def __init__(self, key: object, where: str | None = None, line: int | None = None) -> None:
        super().__init__("given twice in one object (each key may appear once)", where, line, str(key))
        self.key = key


def unique_keys(pairs: list[tuple[str, object]]) -> dict:
    """The ``object_pairs_hook`` of :data:`JSON_DECODER`: the object, or
    :class:`DuplicateKeyError` when a key repeats (json keeps the last silently)."""
    out = dict(pairs)
    if len(out) != len(pairs):
        seen: set = set()
        for key, _ in pairs:
            if key in seen:
                raise DuplicateKeyError(key)
            seen.add(key)
    return out


JSON_DECODER = json.JSONDecoder(object_pairs_hook=unique_keys)
"""Decodes JSON refusing duplicate keys: ``JSON_DECODER.decode(text)`` (as fast as ``json.loads``);
failures are ``json.JSONDecodeError`` or :class:`DuplicateKeyError` (no location: add it)."""


def describe(value: object) -> str:
    """A JSON-ish name for a value's type, for error messages."""
    if value is None:
        return "null"
    if type(value) is bool:
        return "a boolean"
    if type(value) is str:
        text = value if len(value) <= 40 else value[:37] + "..."
        return f"a string ({text!r})"
    if type(value) is float:
        return f"a float ({value!r})"
    if type(value) is list:
        return "a list"
    if type(value) is dict:
        return "an object"
    return f"{type(value).__name__} ({value!r})"


def _fmt(value: float) -> str:
    if abs(value) >= 10000 and (type(value) is int or value.is_integer()):
        return f"{value:,}" if type(value) is int else f"{value:g}"  # 1,000,000 or 1e+09
    return repr(value)
