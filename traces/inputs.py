"""The one check for values that come from outside the program.

Trace records and metadata lines, profile files, command-line values and server responses are
each described by a small schema: a mapping from field name to a :class:`Num` rule (int or
float, range, finite). :func:`check_fields` applies a schema to one parsed object at the
boundary, so nothing past it sees a NaN, an infinity, a bool posing as a number, a negative
count or an absurd size. Every failure is one :class:`InputError` whose message names where the
value came from (file and line, server, or flag) and the field, on one line.

Bounds are a rule, not a list (issue 35): every integer rule has an upper bound that fits the
arithmetic it feeds (a :class:`Num` for ints that states none gets :data:`C_INT_MAX`, the
compiled core's C ``int``; counts that size memory state smaller ones: :data:`MAX_WORKERS`,
:data:`MAX_RECORDS`, :data:`MAX_RUNS`), every number is finite, and an input file must be a
regular file (:func:`check_regular_file`: no FIFO, no device such as ``/dev/zero``). JSON nested
deeper than Python can parse is a :class:`ValueError` (:data:`JSON_DECODER`), not a
``RecursionError``. Limits shared by every input kind: :data:`MAX_TOKENS` (the longest sequence
any length field may state) and :data:`MAX_BLOCK_SIZE` (the largest block of tokens).

This module imports nothing from kvroute, so every package (``traces``, ``sim``, ``calibrate``,
``cli``) can use it.
"""

from __future__ import annotations

import json
import math
import os
import stat
from dataclasses import dataclass

MAX_TOKENS = 1 << 27
"""Largest token count a length field may hold: 134,217,728 tokens, over ten times the longest
context of any model vLLM serves (10M). Larger values are typos or hostile input,
and would be expanded into ``len / block_size`` hash ids before ``max_model_len`` rejects them."""

MAX_BLOCK_SIZE = 1 << 20
"""Largest KV or trace block, tokens (vLLM's blocks are 16-256 tokens, Mooncake's 512)."""

MAX_HASH_ID = (1 << 48) - 1
"""Largest trace ``hash_id``: the simulator names generated tokens (replies, new turns) with
content ids from ``MAX_HASH_ID + 1`` on (``kvroute.sim.engine.content.GENERATED_CONTENT_BASE``),
so a larger trace id would share blocks with a reply it never saw. Mooncake's ids are dense
counts (under 200,000 in its conversation trace)."""

C_INT_MAX = 2**31 - 1
"""Largest value of a C ``int`` (int32): the compiled core's block ids and block counts
(``sim/engine/_block_pool.pyx``). The bound of every integer :class:`Num` that states none."""

EXACT_INT_MAX = 2**53
"""Largest integer a float64 holds exactly: the bound of byte counts and counters that meet
float arithmetic (a profile's ``memory`` section)."""

MAX_WORKERS = 10_000
"""Most workers (and GPUs, gateway replicas) of one cluster: each worker costs about 56 KB
before it holds a request, so 10,000 take about 0.6 GB and a second to build."""

MAX_RECORDS = 1_000_000
"""Most requests of one generated workload (chats x turns) or kept of a trace file
(``--max-requests``): a simulated request costs about 5 KB at its peak (100,000 requests
of ``simulate`` took 0.6 GB), so a million take about 5 GB."""

MAX_RUNS = 10_000
"""Most rounds, trajectories, noise rounds or drawn profiles: each is a whole simulation, and
their tasks and results are held at once."""

MAX_TASKS = 1_000_000
"""Most simulation runs one command plans (a sweep's grid x rounds, sensitivity's points x
rounds x policies, compare's policies x rounds x drawn profiles): their tasks are built at once."""

MAX_ID = 2**63 - 1
"""Largest magnitude of an id read from a file (``request_id``, ``parent``, ``session_id``,
``turn``): ids are kept in int64 columns."""

MAX_SEED = 2**32 - 1
"""Largest seed (numpy's legacy ``RandomState`` bound; ``seed + round`` stays exact)."""

MAX_JSON_DEPTH = 1_000
"""About the nesting at which a JSON document is refused (none of kvroute's formats nests more
than five levels): the decoder stops where it exhausts Python's recursion limit (1,000 frames),
a few levels earlier when the call that reads it is already deep."""


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
        maximum: largest allowed value; None means :data:`C_INT_MAX` for an int rule and no
            bound for a float rule (a float is still refused when not finite).
        above: the value must be strictly greater than ``minimum``.
        below: the value must be strictly less than ``maximum``.
        unit: shown in messages ("tokens", "s", "ms").

    Bools are never numbers, and non-finite values are always rejected.
    """

    integer: bool = False
    minimum: float | None = None
    maximum: float | None = None
    above: bool = False
    unit: str = ""
    below: bool = False

    def __post_init__(self) -> None:
        if self.integer and self.maximum is None:  # the rule: every int has an upper bound
            object.__setattr__(self, "maximum", C_INT_MAX)

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
                if abs(value) > EXACT_INT_MAX:  # past 2**53 a float is no exact count: name it as given
                    bound = (f"<= {_fmt(self.maximum)}" if value > 0 or self.minimum is None
                             else f">= {_fmt(self.minimum)}")
                    raise InputError(f"must be {bound}, got {value!r}", where, line, field)
                value = int(value)
        else:
            raise InputError(f"expected {kind}{unit}, got {describe(value)}", where, line, field)
        if self.minimum is not None and (value <= self.minimum if self.above else value < self.minimum):
            relation = ">" if self.above else ">="
            raise InputError(f"must be {relation} {_fmt(self.minimum)}, got {value!r}", where, line, field)
        if self.maximum is not None and (value >= self.maximum if self.below else value > self.maximum):
            relation = "<" if self.below else "<="
            raise InputError(f"must be {relation} {_fmt(self.maximum)}, got {value!r}", where, line, field)
        return value


COUNT = Num(integer=True, minimum=0, maximum=C_INT_MAX)
POSITIVE_INT = Num(integer=True, minimum=1, maximum=C_INT_MAX)
BYTES = Num(integer=True, minimum=0, maximum=EXACT_INT_MAX, unit="bytes")
KV_BLOCKS = Num(integer=True, minimum=2, maximum=C_INT_MAX, unit="blocks")  # block 0 is vLLM's null block
WORKERS = Num(integer=True, minimum=1, maximum=MAX_WORKERS)
RECORDS = Num(integer=True, minimum=1, maximum=MAX_RECORDS)
RUNS = Num(integer=True, minimum=1, maximum=MAX_RUNS)
SEED = Num(integer=True, minimum=0, maximum=MAX_SEED)
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


class _Decoder(json.JSONDecoder):
    def decode(self, s, *args, **kwargs):
        try:
            return super().decode(s, *args, **kwargs)
        except RecursionError:
            raise ValueError(f"nested too deep to read (about {MAX_JSON_DEPTH:,} levels, Python's recursion "
                             "limit)") from None


JSON_DECODER = _Decoder(object_pairs_hook=unique_keys)
"""Decodes JSON refusing duplicate keys: ``JSON_DECODER.decode(text)`` (as fast as ``json.loads``);
failures are ``json.JSONDecodeError``, :class:`DuplicateKeyError` (no location: add it) or a
plain ``ValueError`` (an int of over 4300 digits; a document nested too deep for Python)."""


def check_regular_file(path: str | os.PathLike[str], flag: str | None = None) -> None:
    """Refuse an input that is not a regular file: a directory, a FIFO (which would block until
    a writer comes) or a device (``/dev/zero`` never ends). A path that does not exist passes
    (opening it gives the usual error).

    Raises:
        InputError: naming ``flag`` (when given) or the path, and what the path is.
    """
    try:
        mode = os.stat(path).st_mode
    except (OSError, ValueError):
        return
    if stat.S_ISREG(mode):
        return
    kind = ("a directory" if stat.S_ISDIR(mode) else "a FIFO (named pipe)" if stat.S_ISFIFO(mode)
            else "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else "a socket" if stat.S_ISSOCK(mode)
            else "not a file")
    raise InputError(f"{path} is {kind}, not a regular file", flag)


def ascii_int(text: str) -> int | None:
    """``text``, spaces around it aside, as an int when it is plain ASCII digits, else None
    (``int()`` also reads ``1_000``, ``+5`` and other scripts' digits, which no count in a
    trace file is)."""
    digits = text.strip()
    return int(digits) if digits.isascii() and digits.isdigit() else None


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
    if isinstance(value, list):  # LineList, LineMap (kvroute.traces.yaml_doc) included
        return "a list"
    if isinstance(value, dict):
        return "an object"
    return f"{type(value).__name__} ({value!r})"


def _fmt(value: float) -> str:
    if abs(value) >= 10000 and (type(value) is int or value.is_integer()):
        return f"{value:,}" if type(value) is int else f"{value:g}"  # 1,000,000 or 1e+09
    return repr(value)
