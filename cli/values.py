"""Command-line values checked once, by the same rules as every other input.

A command's numeric options are described by a table (parameter name -> :class:`Num` rule from
:mod:`kvroute.sim.inputs`); :func:`check_values` wraps the command so that every given value is
checked before any work starts. A failure is a ``click.BadParameter`` naming the flag, e.g.
``Invalid value for '--think-time': must be a finite number, got inf``.
"""

from __future__ import annotations

import functools

import click

from kvroute.sim.inputs import (BLOCK_SIZE, COUNT, POSITIVE_INT, SECONDS, TOKENS, InputError, Num)

POSITIVE_SECONDS = Num(minimum=0.0, above=True, unit="s")

SCENARIO_VALUES: dict[str, Num] = {
    "trace_block_size": BLOCK_SIZE,
    "max_requests": POSITIVE_INT,
    "turns": POSITIVE_INT,
    "chats": POSITIVE_INT,
    "think_time": SECONDS,
    "workers": POSITIVE_INT,
    "gpus": POSITIVE_INT,
    "max_model_len": TOKENS,
    "kv_blocks": Num(integer=True, minimum=2),
    "arrival_spread": SECONDS,
    "seed": COUNT,
    "slo_ttft": POSITIVE_SECONDS,
    "slo_tpot": POSITIVE_SECONDS,
    "rounds": POSITIVE_INT,
    "live_rounds": POSITIVE_INT,
    "max_workers": POSITIVE_INT,
    "block_size": BLOCK_SIZE,
    "timeout": POSITIVE_SECONDS,
    "max_in_flight": POSITIVE_INT,
    "router_block_tokens": POSITIVE_INT,
    "client_lag": SECONDS,
    "max_len": TOKENS,
}
"""Rules of the numeric options of every command, by parameter name. A command checks the
names it has; values left at None (not given, no default) are not checked."""


def check_values(func=None, *, rules: dict[str, Num] = SCENARIO_VALUES):
    """Decorate a click command callback so its numeric options are checked before it runs.

    Apply it below the ``click.option`` decorators (so it wraps the plain function).

    Raises (from the wrapped command):
        click.BadParameter: naming the flag and the rule the value broke.
    """
    if func is None:
        return functools.partial(check_values, rules=rules)

    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        for name, value in kwargs.items():
            rule = rules.get(name)
            if rule is None or value is None or isinstance(value, str):
                continue
            try:
                rule.check(value)
            except InputError as exc:
                raise click.BadParameter(exc.reason, param_hint=_flag(name)) from None
        return func(*args, **kwargs)

    return wrapper


def check_urls(urls: tuple[str, ...] | list[str], flag: str = "--url") -> None:
    """Each server URL must be ``http(s)://host[:port]`` with a port in 1-65535.

    Raises:
        click.BadParameter: naming the flag and the URL.
    """
    from urllib.parse import urlsplit

    for url in urls:
        try:
            parts = urlsplit(url)
            port = parts.port  # raises ValueError when out of range or not a number
        except ValueError as exc:
            raise click.BadParameter(f"{url!r}: {exc}", param_hint=flag) from None
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise click.BadParameter(f"{url!r} is not an http(s)://host[:port] URL", param_hint=flag)
        if port == 0:
            raise click.BadParameter(f"{url!r}: port must be 1-65535", param_hint=flag)


def _flag(name: str) -> str:
    """The option string of parameter ``name`` in the running command (``--think-time``)."""
    ctx = click.get_current_context(silent=True)
    if ctx is not None:
        for param in ctx.command.params:
            if param.name == name and param.opts:
                return f"'{max(param.opts, key=len)}'"
    return f"'--{name.replace('_', '-')}'"
