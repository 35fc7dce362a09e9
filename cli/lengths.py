"""The workload-length options shared by every command that generates a workload.

Their values use one syntax (:mod:`kvroute.traces.lengths`), checked when the command line is
parsed so a bad value names its flag. Kept apart from ``scenario`` so that commands can take these
options without importing the simulator.
"""

from __future__ import annotations

import click

from kvroute.cli.values import Opt, apply_options


def length_options() -> list[Opt]:
    """The workload-length options of generated workloads (``kvroute.traces.lengths`` syntax);
    as sweep axes, comma lists of the same values (``--reply-tokens`` also takes LOW-HIGH)."""
    return [
        Opt("--reply-tokens", default=None, callback=_dist_option, axis=length_value, sweep_names=("--reply",),
            help="Where replies stop, tokens: N, uniform:LO:HI, lognormal:MEDIAN:CV, "
                 "empirical:FILE, ... (capped at --max-tokens) [seed-chat: the fitted "
                 "default, see docs/reference/seed-study-fit.md; agent: uniform:50:300]."),
        Opt("--max-tokens", type=click.IntRange(min=1), default=None,
            help="Reply limit of every request (vLLM's max_tokens) [seed-chat 128, agent none]."),
        Opt("--user-tokens", default=None, callback=_dist_option, axis=dist_value,
            help="Tokens of each user message (seed-chat) or new tokens per later turn (agent), "
                 "as a distribution [seed-chat 195, agent uniform:200:1000]."),
        Opt("--think-time", default="0", show_default=True, callback=_dist_option, axis=dist_value,
            help="Seconds between a reply's last token and the next turn: a number or a distribution."),
        Opt("--start", default="0", show_default=True, callback=_dist_option, axis=dist_value,
            help="Seed-chat: each chat's first send, seconds (a distribution; on top of --arrival-spread)."),
        Opt("--request-rate", type=float, default=None, callback=_positive,
            help="Load: sessions started per second for a generated workload (later turns follow "
                 "closed-loop); for a --trace file, its timestamps rescaled to this mean request rate "
                 "[generated: all at once]."),
        Opt("--arrival", default="poisson", show_default=True, callback=_arrival_option,
            help="Arrival process of --request-rate: poisson, gamma:CV (CV > 1 burstier), constant."),
        Opt("--speedup", type=float, default=None, callback=_positive,
            help="Divide a --trace file's timestamps by this factor (2 = twice the load)."),
    ]


def workload_length_options(func):
    """Decorate a command with the workload-length options alone (``length_options``)."""
    return apply_options(func, length_options())


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
        if "-" in text:
            low, high = (int(part) for part in text.split("-", 1))
            if 0 <= low <= high:
                return (low, high)
        elif 1 <= int(text) <= MAX_TOKENS:
            return int(text)
    except ValueError:
        pass
    raise ValueError(f"{text!r} is neither a token count nor a range LOW-HIGH")


def _positive(ctx: click.Context, param: click.Parameter, value: float | None):
    import math

    if value is not None and not (math.isfinite(value) and value > 0):
        raise click.BadParameter(f"must be a finite number > 0, got {value}", ctx=ctx, param=param)
    return value


def _arrival_option(ctx: click.Context, param: click.Parameter, value: str):
    from kvroute.traces.arrivals import parse_arrival

    try:
        parse_arrival(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc), ctx=ctx, param=param) from None
    return value


def _dist_option(ctx: click.Context, param: click.Parameter, value: str | None):
    """Check a distribution flag's text at parse time; keep the text (None stays None)."""
    if value is None:
        return None
    from kvroute.traces.lengths import parse_dist

    flag = f"--{param.name.replace('_', '-')}"
    try:
        return parse_dist(value, flag).text
    except ValueError as exc:
        # click names the flag already: drop parse_dist's own "--flag: " prefix
        raise click.BadParameter(str(exc).removeprefix(f"{flag}: "), ctx=ctx, param=param) from None
