"""How the command line reads workload lengths and times: distributions, token lengths, ranges.

Their values use one syntax (:mod:`kvroute.traces.lengths`), checked when the command line is
parsed so a bad value names its flag. The options themselves are generated from the scenario's
fields (``kvroute.cli.scenario.scenario_options``); these readers are their types and callbacks,
kept apart so that they import nothing of the simulator.
"""

from __future__ import annotations

import click


def dist_value(item) -> float | str:
    """One item of a distribution axis: a fixed value as its number, any other distribution as
    its checked text.

    Raises:
        ValueError: as ``kvroute.traces.lengths.parse_dist`` (without its name prefix).
    """
    from kvroute.traces.lengths import parse_dist

    try:
        dist = parse_dist(item, "value")
    except ValueError as exc:
        raise ValueError(str(exc).removeprefix("value: ")) from None
    return dist.params[0] if dist.kind == "fixed" else dist.text


def length_value(item) -> int | tuple[int, int] | float | str:
    """One item of a token-length axis (``--reply-tokens``, ``--history``): ``N`` tokens, a
    ``LOW-HIGH`` uniform range (a tuple) or a distribution (as :func:`dist_value`).

    Raises:
        ValueError: neither a token count in 1..MAX_TOKENS, a range 0 <= LOW <= HIGH nor a
            distribution.
    """
    from kvroute.traces.inputs import MAX_TOKENS

    text = str(item).strip()
    if ":" in text:
        return dist_value(text)
    try:
        parts = [int(part) for part in text.split("-", 1)]
    except ValueError:
        raise ValueError(f"{text!r} is neither a token count nor a range LOW-HIGH") from None
    if len(parts) == 2:
        if 0 <= parts[0] <= parts[1]:
            return (parts[0], parts[1])
        raise ValueError(f"{text!r}: a range LOW-HIGH needs 0 <= LOW <= HIGH")
    if 1 <= parts[0] <= MAX_TOKENS:
        return parts[0]
    raise ValueError(f"{text!r}: a token count is 1 to {MAX_TOKENS}")


def history_value(item) -> int | tuple[int, int]:
    """One ``--history`` value: ``H`` tokens (meaning H/2-H) or a ``LOW-HIGH`` range (a tuple;
    a two-item list, as a scenario file may hold it, too).

    Raises:
        ValueError: neither a token count in 1..MAX_TOKENS nor a range 0 <= LOW <= HIGH.
    """
    if isinstance(item, (list, tuple)) and len(item) == 2:
        item = f"{item[0]}-{item[1]}"
    value = length_value(item) if ":" not in str(item) else None
    if value is None or isinstance(value, (float, str)):
        raise ValueError(f"{str(item).strip()!r} is neither a token count H nor a range LOW-HIGH")
    return value


class TokenRange(click.ParamType):
    """A click type for ``history_value``."""

    name = "tokens"

    def get_metavar(self, param: click.Parameter, ctx: click.Context) -> str:
        return "H|LOW-HIGH"

    def convert(self, value, param, ctx):
        try:
            return history_value(value)
        except ValueError as exc:
            self.fail(str(exc), param, ctx)


TOKEN_RANGE = TokenRange()


def positive_option(ctx: click.Context, param: click.Parameter, value: float | None):
    """Check a finite number > 0 at parse time (None stays None)."""
    import math

    if value is not None and not (math.isfinite(value) and value > 0):
        raise click.BadParameter(f"must be a finite number > 0, got {value}", ctx=ctx, param=param)
    return value


def arrival_option(ctx: click.Context, param: click.Parameter, value: str):
    """Check an arrival process (``kvroute.traces.arrivals.parse_arrival``) at parse time."""
    from kvroute.traces.arrivals import parse_arrival

    try:
        parse_arrival(value)
    except ValueError as exc:  # click names the flag already
        raise click.BadParameter(str(exc).removeprefix("--arrival: "), ctx=ctx, param=param) from None
    return value


def dist_option(ctx: click.Context, param: click.Parameter, value: str | None):
    """Check a distribution flag's text at parse time; keep the text (None stays None)."""
    if value is None:
        return None
    from kvroute.traces.lengths import parse_dist

    flag = next((opt for opt in param.opts if opt.startswith("--")), f"--{param.name.replace('_', '-')}")
    try:
        return parse_dist(value, flag).text
    except ValueError as exc:
        # click names the flag already: drop parse_dist's own "--flag: " prefix
        raise click.BadParameter(str(exc).removeprefix(f"{flag}: "), ctx=ctx, param=param) from None
