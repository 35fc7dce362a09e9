"""Command-line values checked once, by the same rules as every other input.

A command's numeric options are described by a table (parameter name -> :class:`Num` rule from
:mod:`kvroute.traces.inputs`); :func:`check_values` wraps the command so that every given value is
checked before any work starts. A failure is a ``click.BadParameter`` naming the flag, e.g.
``Invalid value for '--think-time': must be a finite number, got inf``.
"""

from __future__ import annotations

import functools

import click

from kvroute.traces.inputs import (BLOCK_SIZE, COUNT, POSITIVE_INT, SECONDS, TOKENS, InputError, Num)

POSITIVE_SECONDS = Num(minimum=0.0, above=True, maximum=SECONDS.maximum, unit="s")

SCENARIO_VALUES: dict[str, Num] = {
    "max_model_len": TOKENS,
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
"""Rules of the numeric options of every command, by parameter name, but the scenario's: those
are its fields' (``kvroute.cli.scenario.FIELD_RULES``, which ``scenario_options`` adds). A
command checks the names it has; values left at None (not given, no default) are not checked."""


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
            if rule is None:
                continue
            for item in value if isinstance(value, list) else [value]:  # a list: a sweep's axis
                if item is None or isinstance(item, (str, tuple)):
                    continue
                try:
                    rule.check(item)
                except InputError as exc:
                    raise click.BadParameter(exc.reason, param_hint=_flag(name)) from None
        return func(*args, **kwargs)

    return wrapper


class Axis(click.ParamType):
    """A comma list of one option's values (a sweep's grid axis), e.g. ``--workers 2,4,8``.

    Each item is converted by ``item`` (a function of the item's text raising ValueError or
    click.BadParameter), or else by the single-value option's type. A list (from a ``--config``
    file) or a single value (a default) is taken item by item too. The value is a list.
    """

    name = "list"

    def __init__(self, item_type: click.ParamType | None = None, item=None) -> None:
        self.item_type = click.types.convert_type(item_type)
        self.item = item

    def get_metavar(self, param: click.Parameter, ctx: click.Context) -> str:
        inner = self.item_type.get_metavar(param, ctx) or self.item_type.name.upper()
        return f"{inner},..."

    def convert(self, value, param, ctx) -> list:
        if isinstance(value, list):
            items = value
        elif isinstance(value, str):
            items = [part.strip() for part in value.split(",") if part.strip()]
        else:
            items = [value]
        if not items:
            self.fail("give at least one value", param, ctx)
        out = []
        for item in items:
            try:
                out.append(self.item(item) if self.item is not None else self.item_type.convert(item, param, ctx))
            except click.BadParameter as exc:
                self.fail(exc.message, param, ctx)
            except ValueError as exc:
                self.fail(str(exc), param, ctx)
        return out

    @staticmethod
    def text(values: list):
        """``values`` as a ``--config`` file holds them: one value as itself, several as the comma
        list (a ``(low, high)`` range as ``"low-high"``)."""
        items = [f"{v[0]}-{v[1]}" if isinstance(v, tuple) else v for v in values]
        return items[0] if len(items) == 1 else ",".join(map(str, items))


class AliasedOption(click.Option):
    """A click option that a ``--config`` scenario file may also name by ``aliases`` (earlier
    parameter names of the option)."""

    def __init__(self, *args, aliases: tuple[str, ...] = (), **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.aliases = tuple(aliases)


class Opt:
    """One option of a command family, made for one command or as a sweep's axis.

    ``make()`` gives the ``click.option`` decorator; ``make(axes=True)`` the same option (same
    names, default and help) taking a comma list (:class:`Axis`) unless ``axis`` is False, with
    ``sweep_names`` as extra names. ``axis`` may be a function converting one item's value (it
    replaces the option's type and callback in the list); True converts each item as the
    single-value option does.
    """

    def __init__(self, *decls: str, axis=True, sweep_names: tuple[str, ...] = (), **attrs) -> None:
        self.decls, self.axis, self.sweep_names, self.attrs = decls, axis, sweep_names, attrs

    def make(self, axes: bool = False):
        if not axes or self.axis is False:
            return click.option(*self.decls, **self.attrs)
        attrs = dict(self.attrs)
        callback = attrs.pop("callback", None)
        if callable(self.axis):
            attrs["type"] = Axis(item=self.axis)
        else:
            attrs["type"] = Axis(attrs.get("type"))
            if callback is not None:
                attrs["callback"] = lambda ctx, param, value: (
                    value if value is None else [callback(ctx, param, item) for item in value])
        attrs["help"] = f"{attrs.get('help', '')} Comma list: one axis of the grid."
        longs = [d for d in self.decls if d.startswith("--")]
        rest = [d for d in self.decls if not d.startswith("--")]
        return click.option(*longs, *self.sweep_names, *rest, **attrs)


def apply_options(func, options: list[Opt], axes: bool = False):
    """Decorate ``func`` with ``options`` (first listed first in the help)."""
    for option in reversed(options):
        func = option.make(axes)(func)
    return func


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
            raise click.BadParameter(f"{url!r}: {exc}", param_hint=f"'{flag}'") from None
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise click.BadParameter(f"{url!r} is not an http(s)://host[:port] URL", param_hint=f"'{flag}'")
        if port == 0:
            raise click.BadParameter(f"{url!r}: port must be 1-65535", param_hint=f"'{flag}'")


def _flag(name: str) -> str:
    """The option string of parameter ``name`` in the running command (``--think-time``)."""
    ctx = click.get_current_context(silent=True)
    if ctx is not None:
        for param in ctx.command.params:
            if param.name == name and param.opts:
                return f"'{max(param.opts, key=len)}'"
    return f"'--{name.replace('_', '-')}'"
