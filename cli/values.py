"""Command-line values checked once, by the same rules as every other input.

Every numeric option declares its rule (a :class:`Num` from :mod:`kvroute.traces.inputs`, so an
upper bound that fits what the value feeds, and finite) in its type: ``type=Number(RULE)``
converts and checks the value as click parses it (also a ``--config`` file's value), and
``tests/cli/test_bounds.py`` fails for any ``int`` or ``float`` option of any command without
one. :func:`check_values` checks a command's values against a table (parameter name -> rule)
before any work starts (the scenario's fields and the shared flags of :data:`SCENARIO_VALUES`).
A failure is a ``click.BadParameter`` naming the flag, e.g.
``Invalid value for '--think-time': must be a finite number, got inf``. :class:`InputFile` is
the type of a file option: it must be a regular file (no FIFO, no ``/dev/zero``).
"""

from __future__ import annotations

import difflib
import functools

import click

from kvroute.traces.inputs import (BLOCK_SIZE, C_INT_MAX, MAX_RUNS, MAX_TASKS, POSITIVE_INT, RUNS, SECONDS, SEED,
                                   TOKENS, InputError, Num, check_regular_file)

POSITIVE_SECONDS = Num(minimum=0.0, above=True, maximum=SECONDS.maximum, unit="s")
PROCESSES = Num(integer=True, minimum=1, maximum=1024)
"""Processes of a local pool: each is a whole Python interpreter (about 100 MB)."""
DRAWS = Num(integer=True, minimum=0, maximum=MAX_RUNS)
"""Profiles drawn from a profile's priors (``--uncertainty``; 0: none): each is a set of runs."""
RELATIVE = Num(minimum=0.0, maximum=1.0)
"""A relative size from 0 to 1 (100 %): validate's ``--run-to-run-prior``."""
PRIOR_RANGE = Num(minimum=0.0, maximum=1.0, below=True)
"""A relative half-width below 1 (``--prior-range`` of compare and validate): a prior's range
``1 -+ it`` stays positive."""
OPEN_FRACTION = Num(minimum=0.0, above=True, maximum=1.0, below=True)
"""A share strictly between 0 and 1 (sensitivity's ``--prior-range``, ``--coverage``, ``--kv-range``)."""

SCENARIO_VALUES: dict[str, Num] = {
    "max_model_len": TOKENS,
    "seed": SEED,
    "slo_ttft": POSITIVE_SECONDS,
    "slo_tpot": POSITIVE_SECONDS,
    "rounds": RUNS,
    "live_rounds": RUNS,
    "max_workers": PROCESSES,
    "block_size": BLOCK_SIZE,
    "timeout": POSITIVE_SECONDS,
    "max_in_flight": POSITIVE_INT,
    "router_block_tokens": TOKENS,
    "client_lag": SECONDS,
    "max_len": TOKENS,
    "uncertainty": DRAWS,
    "prior_range": PRIOR_RANGE,
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


class Number(click.ParamType):
    """A numeric option's type: the value converted (an int rule also takes ``1e6``) and checked
    by its :class:`Num` rule (range, finite), so the option declares its bounds where it is made.

    Raises (from ``convert``):
        click.BadParameter: not a number, or the rule's message (``must be <= 10,000, got 100000``).
    """

    def __init__(self, rule: Num) -> None:
        self.rule = rule
        self.name = "integer" if rule.integer else "float"

    def convert(self, value, param, ctx):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            text = str(value).strip()
            try:
                value = int(text) if self.rule.integer else float(text)
            except ValueError:
                try:
                    value = float(text)  # 1e6 for an int rule; 1.5 is refused by the rule
                except ValueError:
                    self.fail(f"{text!r} is not a valid {self.name}", param, ctx)
        try:
            return self.rule.check(value)
        except InputError as exc:
            self.fail(exc.reason, param, ctx)

    def __repr__(self) -> str:
        return f"Number({self.rule})"


class Cores(click.ParamType):
    """CPU core ids ``"1"``, ``"1,3"`` or ``"2-5"``: each must be one this process may run on
    (``os.sched_getaffinity``). The value is a tuple of ints (None stays None)."""

    name = "cores"

    def convert(self, value, param, ctx):
        if isinstance(value, tuple):
            return value
        import os

        allowed = (sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
                   else list(range(os.cpu_count() or 1)))
        out: list[int] = []
        for part in str(value).split(","):
            part = part.strip()
            if not part:
                continue
            lo, _, hi = part.partition("-")
            try:
                first, last = int(lo), int(hi) if hi else int(lo)
            except ValueError:
                self.fail(f"{part!r} is not a core id or a LOW-HIGH range of them (e.g. 1, 1,3 or 2-5)", param, ctx)
            bad = next((c for c in (first, last) if c not in allowed), None)
            if bad is not None or first > last:
                self.fail(f"{part!r}: cores must be among this process's {_ranges(allowed)} (LOW <= HIGH)",
                          param, ctx)
            out += [c for c in allowed if first <= c <= last]
        if not out:
            self.fail(f"no core named in {value!r}", param, ctx)
        return tuple(dict.fromkeys(out))


def _ranges(ids: list[int]) -> str:
    """``[0, 1, 2, 5]`` as ``"0-2,5"``."""
    parts, start = [], None
    for i, c in enumerate(ids):
        if start is None:
            start = c
        if i + 1 == len(ids) or ids[i + 1] != c + 1:
            parts.append(str(start) if start == c else f"{start}-{c}")
            start = None
    return ",".join(parts)


def token_id_range(text: str | None, flag: str = "--token-range") -> tuple[int, int] | None:
    """``LO:HI`` prompt token ids, 0 <= LO < HI <= 2**31 - 1 (None stays None).

    Raises:
        click.BadParameter: naming ``flag``.
    """
    if not text:
        return None
    try:
        lo, hi = (int(x) for x in text.split(":"))
    except ValueError:
        raise click.BadParameter(f"must be LO:HI, got {text!r}", param_hint=f"'{flag}'") from None
    if not 0 <= lo < hi <= C_INT_MAX:
        raise click.BadParameter(f"must be LO:HI token ids with 0 <= LO < HI <= {C_INT_MAX:,}, got {text!r}",
                                 param_hint=f"'{flag}'")
    return lo, hi


class InputFile(click.Path):
    """The type of an input file option or argument: it must exist (unless ``exists=False``) and
    be a regular file (:func:`~kvroute.traces.inputs.check_regular_file`: no directory, FIFO or
    device). The value is a :class:`~pathlib.Path`."""

    def __init__(self, exists: bool = True) -> None:
        from pathlib import Path

        super().__init__(exists=exists, dir_okay=False, path_type=Path)

    def convert(self, value, param, ctx):
        path = super().convert(value, param, ctx)
        try:
            check_regular_file(path)
        except InputError as exc:
            self.fail(exc.reason, param, ctx)
        return path


class Choice(click.Choice):
    """``click.Choice`` that names the closest choice of a misspelt value, as the policy and
    ``--config`` errors do: ``Invalid value for '--workload': 'seedchat' is not one of
    'seed-chat', 'agent' (did you mean 'seed-chat'?).``

    Raises:
        click.BadParameter: a value not among the choices (click's message, with the closest
            choice by ``difflib``, case ignored, where one is close).
    """

    def convert(self, value, param, ctx):
        try:
            return super().convert(value, param, ctx)
        except click.BadParameter as exc:
            names = {str(c).lower(): str(c) for c in self.choices}
            close = difflib.get_close_matches(str(value).lower(), list(names), n=1)
            if not close:
                raise
            self.fail(f"{exc.message.rstrip('.')} (did you mean {names[close[0]]!r}?).", param, ctx)


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


def check_runs(runs: int, flags: str) -> None:
    """Refuse a command that would plan more than ``MAX_TASKS`` simulation runs (their tasks and
    results are held at once), naming the flags whose product ``runs`` is.

    Raises:
        click.UsageError: ``"--rounds x --policies ... is N runs, more than 1,000,000"``.
    """
    if runs > MAX_TASKS:
        raise click.UsageError(f"{flags} is {runs:,} simulation runs, more than the {MAX_TASKS:,} one command "
                               "may plan")


def check_urls(urls: tuple[str, ...] | list[str], flag: str = "--url") -> None:
    """Each server URL must be ``http(s)://host[:port]`` with a port in 1-65535, and name another
    server than the others (the same server twice would be taken for two workers).

    Raises:
        click.BadParameter: naming the flag and the URL.
    """
    from urllib.parse import urlsplit

    from kvroute.calibrate.live.server import machine_key  # localhost and 127.0.0.1 are one machine

    seen: dict[tuple, str] = {}
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
        default_port = 443 if parts.scheme == "https" else 80
        key = (parts.scheme, machine_key(parts.hostname), port or default_port, parts.path.rstrip("/"))
        if key in seen:
            raise click.BadParameter(f"{url!r} names the same server as {seen[key]!r}: each {flag} is one worker",
                                     param_hint=f"'{flag}'")
        seen[key] = url


def _flag(name: str) -> str:
    """The option string of parameter ``name`` in the running command (``--think-time``)."""
    ctx = click.get_current_context(silent=True)
    if ctx is not None:
        for param in ctx.command.params:
            if param.name == name and param.opts:
                return f"'{max(param.opts, key=len)}'"
    return f"'--{name.replace('_', '-')}'"
