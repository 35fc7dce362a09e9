"""Distributions of token lengths and times for workload generators: one small text syntax.

The same syntax serves the CLI (``--reply-tokens lognormal:180:0.6``), sweeps and the Python API
(:func:`parse_dist`). Draws come only from the ``numpy.random.Generator`` passed in, so a seed
gives the same trace.

Syntax (numbers in the quantity's own unit: tokens for lengths, seconds for times):

===========================  ==============================================================
``V`` or ``fixed:V``         always ``V``
``uniform:LO:HI``            uniform on ``[LO, HI]``; integers inclusive for token lengths
``normal:MEAN:SD``           normal, draws below 0 clipped to 0 (not redrawn), so with SD
                             near MEAN the mean drawn is above MEAN
``lognormal:MEDIAN:CV``      lognormal with that median and coefficient of variation
                             (``sigma = sqrt(ln(1 + CV^2))``, ``mu = ln(MEDIAN)``)
``exponential:MEAN``         exponential with that mean
``empirical:FILE``           resampled with replacement from the numbers in ``FILE`` (one
                             per line, or the first column of a CSV; ``#`` starts a comment)
===========================  ==============================================================

Token lengths are drawn by :meth:`Dist.draw_tokens`: rounded half to even, then clipped to
``[minimum, cap]``. A cap is how a reply limit works: ``max_tokens`` caps where the model would
have stopped (an instruct model stops at its end-of-sequence token; vLLM stops at
``max_tokens`` otherwise).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from kvroute.traces.inputs import InputError, check_regular_file

KINDS = ("fixed", "uniform", "normal", "lognormal", "exponential", "empirical")


@dataclass(frozen=True, slots=True)
class Dist:
    """One distribution of a non-negative quantity (tokens or seconds).

    Attributes:
        kind: one of ``KINDS``.
        params: the numbers after the kind, in the syntax's order.
        values: the sample of an ``empirical`` distribution (empty otherwise).
        text: the canonical text, as :func:`parse_dist` reads it back (a scaled ``empirical``
            sample's: its own text and `` x FACTOR``, which names it but does not parse).
    """

    kind: str
    params: tuple[float, ...] = ()
    values: tuple[float, ...] = ()
    text: str = ""

    @property
    def is_fixed(self) -> bool:
        """True when every draw is the same value (no random numbers are used)."""
        return self.kind == "fixed" or (self.kind == "uniform" and self.params[0] == self.params[1])

    @property
    def mean(self) -> float:
        """The distribution's mean (before any cap or rounding); for ``normal``, its ``MEAN``
        parameter, before draws below 0 are clipped."""
        if self.kind == "fixed":
            return self.params[0]
        if self.kind == "uniform":
            return 0.5 * (self.params[0] + self.params[1])
        if self.kind == "normal":
            return self.params[0]
        if self.kind == "lognormal":
            median, cv = self.params
            return median * math.sqrt(1.0 + cv * cv)
        if self.kind == "exponential":
            return self.params[0]
        return float(np.mean(self.values))

    @property
    def largest_tokens(self) -> float:
        """The largest token count :meth:`draw_tokens` can give before its ``minimum`` and ``cap``
        (``inf`` where the draws are unbounded): what decides whether every draw would be raised
        to the minimum."""
        if self.is_fixed:
            return float(np.rint(self.params[0]))
        if self.kind == "uniform":
            lo, hi = math.ceil(self.params[0]), math.floor(self.params[1])
            return float(hi if hi >= lo else lo)
        if self.kind in ("normal", "exponential") and self.params[-1] == 0:  # no spread: its mean
            return float(np.rint(self.params[0]))
        if self.kind == "empirical":
            return float(np.rint(max(self.values)))
        return math.inf

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        """``n`` real-valued draws, shape ``(n,)``; a fixed distribution uses no random numbers."""
        if self.is_fixed:
            return np.full(n, self.params[0], dtype=float)
        if self.kind == "uniform":
            return rng.uniform(self.params[0], self.params[1], n)
        if self.kind == "normal":
            return np.maximum(rng.normal(self.params[0], self.params[1], n), 0.0)
        if self.kind == "lognormal":
            median, cv = self.params
            sigma = math.sqrt(math.log1p(cv * cv))
            return rng.lognormal(math.log(median), sigma, n)
        if self.kind == "exponential":
            return rng.exponential(self.params[0], n)
        return rng.choice(np.asarray(self.values, dtype=float), n)

    def draw_tokens(self, rng: np.random.Generator, n: int, cap: int | None = None,
                    minimum: int = 1) -> np.ndarray:
        """``n`` token counts, shape ``(n,)`` int64: rounded half to even, clipped to ``[minimum, cap]``.

        ``uniform:LO:HI`` draws integers uniformly from ``LO..HI`` inclusive.
        """
        if self.kind == "uniform" and not self.is_fixed:
            lo, hi = math.ceil(self.params[0]), math.floor(self.params[1])
            values = rng.integers(lo, hi, n, endpoint=True) if hi >= lo else np.full(n, lo)
        else:
            values = np.rint(self.sample(rng, n)).astype(np.int64)
        values = np.maximum(values, minimum)
        if cap is not None:
            values = np.minimum(values, cap)
        return values.astype(np.int64)

    def scaled(self, factor: float) -> "Dist":
        """The same shape with every value multiplied by ``factor`` > 0 (e.g. seconds to ms)."""
        if self.kind == "lognormal":
            params = (self.params[0] * factor, self.params[1])
        elif self.kind == "normal":
            params = (self.params[0] * factor, self.params[1] * factor)
        else:
            params = tuple(p * factor for p in self.params)
        values = tuple(v * factor for v in self.values)
        if factor == 1:
            text = self.text
        elif self.kind == "empirical":  # a file's sample has no text of its own once scaled
            text = f"{self.text} x {factor:g}"
        else:
            text = f"{self.kind}:" + ":".join(_num(p) for p in params)
        return Dist(self.kind, params, values, text)

    def __str__(self) -> str:
        return self.text


def fixed(value: float) -> Dist:
    """The distribution that is always ``value``."""
    return Dist("fixed", (float(value),), (), f"fixed:{_num(value)}")


def parse_dist(text: str | int | float | Dist, what: str = "distribution") -> Dist:
    """Read a distribution from the module's syntax (a bare number means ``fixed``).

    Args:
        text: e.g. ``"128"``, ``"fixed:128"``, ``"uniform:64:128"``, ``"lognormal:180:0.6"``,
            ``"empirical:replies.txt"``; a number or an existing ``Dist`` is accepted as is.
        what: names the option or field in error messages (e.g. ``"--reply-tokens"``).

    Raises:
        ValueError: unknown kind, wrong number of parameters, a non-finite or negative number,
            ``LO > HI``, a median <= 0, or an unreadable/empty empirical file (naming the file
            and line).
    """
    if isinstance(text, Dist):
        return text
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        return fixed(_check(float(text), what, "value"))
    raw = str(text).strip()
    kind, _, rest = raw.partition(":")
    if not rest:
        try:
            return fixed(_check(float(kind), what, "value"))
        except ValueError as exc:
            if "must be" in str(exc):
                raise
            raise ValueError(f"{what}: cannot read {raw!r}; expected a number or one of "
                             f"{', '.join(k + ':...' for k in KINDS)}") from None
    kind = kind.lower()
    if kind not in KINDS:
        raise ValueError(f"{what}: unknown distribution {kind!r} in {raw!r}; valid: {', '.join(KINDS)}")
    if kind == "empirical":
        values = _read_sample(Path(rest), what)
        return Dist("empirical", (), values, f"empirical:{rest}")
    arity = {"fixed": 1, "uniform": 2, "normal": 2, "lognormal": 2, "exponential": 1}[kind]
    parts = rest.split(":")
    if len(parts) != arity:
        raise ValueError(f"{what}: {kind} takes {arity} number(s), got {len(parts)} in {raw!r}")
    names = {"fixed": ("value",), "uniform": ("low", "high"), "normal": ("mean", "sd"),
             "lognormal": ("median", "cv"), "exponential": ("mean",)}[kind]
    params = []
    for part, name in zip(parts, names):
        try:
            value = float(part)
        except ValueError:
            raise ValueError(f"{what}: {kind} {name} {part!r} is not a number in {raw!r}") from None
        params.append(_check(value, what, f"{kind} {name}"))
    if kind == "uniform" and params[0] > params[1]:
        raise ValueError(f"{what}: uniform low {params[0]:g} > high {params[1]:g} in {raw!r}")
    if kind == "lognormal" and params[0] <= 0:
        raise ValueError(f"{what}: lognormal median must be > 0 in {raw!r}")
    if kind == "fixed":
        return fixed(params[0])
    return Dist(kind, tuple(params), (), f"{kind}:" + ":".join(_num(p) for p in params))


LIMIT = 1e9
"""Largest number a distribution may name (tokens or seconds): far past any real length or wait,
and small enough that sums of draws stay finite."""


def _check(value: float, what: str, name: str) -> float:
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"{what}: {name} must be a finite number >= 0, got {value!r}")
    if value > LIMIT:
        raise ValueError(f"{what}: {name} must be <= {LIMIT:g}, got {value!r}")
    return value


def _num(value: float) -> str:
    return f"{value:g}" if float(value) != int(value) else str(int(value))


def _read_sample(path: Path, what: str) -> tuple[float, ...]:
    try:
        check_regular_file(path)  # /dev/zero or a FIFO would never end
        # utf-8-sig: a byte-order mark (Excel's CSV) is not part of the first value;
        # not splitlines: \x0c would shift line numbers
        lines = path.read_text(encoding="utf-8-sig").split("\n")
    except UnicodeDecodeError as exc:
        raise ValueError(f"{what}: empirical sample {path}: not UTF-8 text (byte {exc.start})") from None
    except InputError as exc:
        raise ValueError(f"{what}: empirical sample {exc.reason}") from None
    except OSError as exc:
        raise ValueError(f"{what}: cannot read empirical sample {path}: {exc.strerror or exc}") from None
    values = []
    for number, line in enumerate(lines, 1):
        field = line.split("#", 1)[0].split(",", 1)[0].strip()
        if not field:
            continue
        try:
            value = float(field)
        except ValueError:
            if number == 1 and not any(c.isdigit() for c in field):
                continue  # a CSV header ("output_tokens"); "5OO" is a typo, refused below
            raise ValueError(f"{path}:{number}: {what}: {field!r} is not a number") from None
        values.append(_check(value, f"{path}:{number}: {what}", "sample value"))
    if not values:
        raise ValueError(f"{what}: empirical sample {path} holds no numbers")
    return tuple(values)
