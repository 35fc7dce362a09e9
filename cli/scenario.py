"""The scenario options of every command that runs a workload, generated from the one scenario
type (:class:`kvroute.sim.study.scenario.Scenario`), and the trace and cluster they give.

``scenario_options`` walks the dataclass's fields and makes each one's click option from its
metadata (flag, help, type, check, default: the field's own), as Vidur flattens its config
dataclasses; ``simulate``, ``compare``, ``sweep`` (as comma lists) and ``sensitivity`` take every
group, ``validate`` and ``trace generate`` the workload (and trace) ones. A command's parameters
are named as the fields, so ``scenario_from_options`` builds its ``Scenario`` without a rename
table; ``scenario_trace`` and ``scenario_spec`` turn the scenario's errors into click errors that
name the flag.
"""

from __future__ import annotations

import dataclasses
import functools
from pathlib import Path

import click

from kvroute.cli.values import (POSITIVE_SECONDS, PROCESSES, SCENARIO_VALUES, AliasedOption, Choice, InputFile, Number,
                                Opt, apply_options, check_values)
from kvroute.cli.lengths import (TOKEN_RANGE, arrival_option, dist_option, dist_value, history_value, length_value,
                                 positive_option)
from kvroute.sim.cluster.cluster import ClusterSpec
from kvroute.sim.cluster.metrics import ServiceClass
from kvroute.sim.routing import DEFAULT_POLICIES as POLICY_SET
from kvroute.sim.routing import make_policy, parse_spec, split_specs
from kvroute.sim.study.scenario import OPTION_GROUPS, SCENARIO_FIELDS, Scenario, ScenarioError
from kvroute.traces.format import Trace, truncate  # noqa: F401 - truncate: also kvroute.cli.scenario's

OPTION_FIELDS = {f.name: f for f in dataclasses.fields(Scenario) if f.metadata.get("option", True)}
"""The ``Scenario`` fields that are command-line options, by name (parameter name = field name)."""

FLAGS = {name: f.metadata.get("flag", "--" + name.replace("_", "-")) for name, f in OPTION_FIELDS.items()}
"""Each option field's long flag."""

FIELD_RULES = {name: f.metadata["check"] for name, f in OPTION_FIELDS.items() if "check" in f.metadata}
"""The numeric rules of the fields (the checks ``Scenario`` runs), by parameter name."""

_KINDS = {  # field kind -> (single-value type, its callback, a sweep item's converter)
    "dist": (str, dist_option, dist_value),
    "length": (str, dist_option, length_value),
    "history": (TOKEN_RANGE, None, history_value),
    "arrival": (str, arrival_option, True),
    "positive": (float, positive_option, True),
}


def field_option(name: str) -> Opt:
    """The option of ``Scenario`` field ``name``, made from its metadata and default."""
    f = OPTION_FIELDS[name]
    meta = f.metadata
    attrs = {"default": f.default, "show_default": f.default is not None, "help": meta["help"]}
    axis = meta.get("axis", True)
    if "choices" in meta:
        attrs["type"] = Choice(list(meta["choices"]))
    elif meta.get("type") == "path":
        attrs["type"] = InputFile(exists=False)  # a regular file; scenario_trace says when it is missing
    elif "kind" in meta:
        attrs["type"], callback, item = _KINDS[meta["kind"]]
        if "check" in meta and attrs["type"] is float:
            attrs["type"] = Number(meta["check"])
        if callback is not None:
            attrs["callback"] = callback
        axis = item if axis else False
    elif "check" in meta:
        attrs["type"] = Number(meta["check"])  # the field's bounds, checked as click parses the flag
    else:
        attrs["type"] = meta.get("type", str)
    if meta.get("aliases"):
        attrs.update(cls=AliasedOption, aliases=tuple(meta["aliases"]))
    return Opt(FLAGS[name], name, axis=axis, sweep_names=tuple(meta.get("sweep_flags", ())), **attrs)


def slo_option_list() -> list[Opt]:
    """The goodput bounds (``ServiceClass``): how runs are judged, not what runs; one value each."""
    slo = ServiceClass()
    return [
        Opt("--slo-ttft", type=Number(POSITIVE_SECONDS), default=slo.ttft_s, show_default=True, axis=False,
            help="Goodput bound on TTFT, s."),
        Opt("--slo-tpot", type=Number(POSITIVE_SECONDS), default=slo.tpot_s, show_default=True, axis=False,
            help="Goodput bound on TPOT, s."),
    ]


def scenario_option_list(groups: tuple[str, ...] = OPTION_GROUPS, exclude: tuple[str, ...] = (),
                         include: tuple[str, ...] = (), slo: bool = True) -> list[Opt]:
    """The options of the ``Scenario`` fields in ``groups`` (and ``include``), but ``exclude``,
    group by group in ``OPTION_GROUPS`` order (fields in their dataclass order), with the SLO
    bounds after the cluster group when ``slo``."""
    out = []
    for group in OPTION_GROUPS:
        out += [field_option(name) for name, f in OPTION_FIELDS.items() if f.metadata["group"] == group
                and (group in groups or name in include) and name not in exclude]
        if group == "cluster" and slo:
            out += slo_option_list()
    return out


def scenario_options(func=None, *, axes: bool = False, groups: tuple[str, ...] = OPTION_GROUPS,
                     exclude: tuple[str, ...] = (), include: tuple[str, ...] = (), slo: bool = True):
    """Decorate a command with the scenario options (``scenario_option_list``; ``axes``: as a
    sweep's comma lists), their numeric values checked by the fields' rules before it runs."""
    if func is None:
        return functools.partial(scenario_options, axes=axes, groups=groups, exclude=exclude, include=include,
                                 slo=slo)
    checked = check_values(func, rules={**SCENARIO_VALUES, **FIELD_RULES})
    return apply_options(checked, scenario_option_list(groups, exclude, include, slo), axes)


def click_error(exc: ScenarioError) -> click.ClickException:
    """A scenario's error as the command line's: naming the field's flag where it has one."""
    flag = FLAGS.get(exc.field) if exc.field else None
    if flag is None:
        return click.UsageError(str(exc))
    return click.BadParameter(exc.reason, param_hint=f"'{flag}'")


def scenario_from_options(options: dict, **values) -> Scenario:
    """The ``Scenario`` of a command's scenario options (``options``: parameter name -> value;
    the names that are not fields are ignored) and ``values`` (more fields).

    Raises:
        click.BadParameter: naming the flag of the field at fault (click.UsageError when the
            message names the flags itself).
    """
    fields = {name: value for name, value in options.items() if name in SCENARIO_FIELDS}
    fields.update(values)
    if isinstance(fields.get("trace_file"), Path):
        fields["trace_file"] = str(fields["trace_file"])
    if isinstance(fields.get("workload_config"), Path):
        fields["workload_config"] = str(fields["workload_config"])
    try:
        return Scenario(**fields)
    except ScenarioError as exc:
        raise click_error(exc) from None


def scenario_trace(scenario: Scenario, round: int = 0) -> Trace:
    """``scenario.trace(round)`` (the one trace loader) with click errors.

    Raises:
        click.BadParameter: the trace file does not exist.
        click.ClickException: it cannot be read or parsed (the message names file, line and
            field), or cannot be rescaled.
    """
    if scenario.trace_file is not None and not Path(scenario.trace_file).exists():
        raise click.BadParameter(f"{scenario.trace_file} does not exist", param_hint="'--trace'")
    if scenario.workload_config is not None and not Path(scenario.workload_config).exists():
        raise click.BadParameter(f"{scenario.workload_config} does not exist", param_hint="'--workload-config'")
    try:
        return scenario.trace(round)
    except ValueError as exc:
        raise click.ClickException(str(exc)) from exc


def scenario_spec(scenario: Scenario, **changes) -> ClusterSpec:
    """``scenario.spec(**changes)`` (the one ``ClusterSpec`` builder) with click errors.

    Raises:
        click.BadParameter: an unknown profile (listing the shipped ones) or a bad profile
            file (``--profile``), more GPUs than workers (``--gpus``).
        click.UsageError: any other cluster that cannot be built.
    """
    try:
        profile = scenario.base_profile()
    except (FileNotFoundError, ValueError) as exc:
        raise click.BadParameter(str(exc), param_hint="'--profile'") from exc
    if scenario.gpus is not None and not 1 <= scenario.gpus <= scenario.workers:
        raise click.BadParameter(f"must be between 1 and --workers ({scenario.workers}), got {scenario.gpus}",
                                 param_hint="'--gpus'")
    try:
        return scenario.spec(profile, **changes)
    except ValueError as exc:
        raise click.UsageError(str(exc)) from exc


def read_any_trace(path: Path, block_size: int | None, fmt: str = "auto", count_tokens=None,
                   tokens_note: str | None = None, param_hint: str = "'--trace'") -> Trace:
    """Read a trace in any format :mod:`kvroute.traces.detect` knows (``auto``: by suffix/content);
    a missing or unreadable file is named under ``param_hint`` (the option or argument that gave it).

    Raises:
        click.BadParameter: the file is missing or malformed (the message names line and field).
    """
    from kvroute.traces.detect import read_any

    if not path.exists():
        raise click.BadParameter(f"{path} does not exist", param_hint=param_hint)
    try:
        return read_any(path, block_size, fmt, count_tokens, tokens_note)
    except ValueError as exc:
        raise click.ClickException(str(exc)) from exc
    except OSError as exc:
        raise click.BadParameter(f"cannot read {path}: {exc.strerror or exc}", param_hint=param_hint) from None


def parse_policies(text: str, param_hint: str = "--policies") -> list[str]:
    """Split ``a,b:key=value,key=value,c`` into policy specs and check every one (each policy is
    built once, so a value it rejects fails here, before any run).

    Raises:
        click.BadParameter: naming the unknown policy (listing the valid ones), the unknown
            parameter (listing the policy's), the malformed value or the value out of range.
    """
    import numpy as np

    try:
        specs = split_specs(text)
        for spec in specs:
            parse_spec(spec)
            make_policy(spec, np.random.default_rng(0))
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint=f"'{param_hint}'") from None
    if not specs:
        raise click.BadParameter("give at least one policy", param_hint=f"'{param_hint}'")
    twice = sorted({name for name in specs if specs.count(name) > 1})
    if twice:
        raise click.BadParameter(f"policy {', '.join(twice)} listed twice; name each policy once",
                                 param_hint=f"'{param_hint}'")
    return specs


DEFAULT_POLICIES = ",".join(POLICY_SET)
"""``--policies``' default: ``kvroute.sim.routing.DEFAULT_POLICIES``, the same on every command."""


class PolicySpecs(click.ParamType):
    """``--policies``' value: the comma text of policy specs, checked as :func:`parse_policies`
    checks it; a list (a ``--config`` file's YAML list) is joined with commas first. The value
    stays the text (``parse_policies`` splits it), so a scenario file saves it as given."""

    name = "policies"

    def convert(self, value, param, ctx) -> str:
        items = value if isinstance(value, (list, tuple)) else [value]
        wrong = [item for item in items if not isinstance(item, str)]
        if wrong:  # a number, a null, a mapping: a --config file's value
            self.fail(f"expected policy names (a comma list, or a list of names), got {wrong[0]!r}", param, ctx)
        text = ",".join(items)
        try:
            parse_policies(text)
        except click.BadParameter as exc:
            self.fail(exc.message, param, ctx)
        return text


def policies_option(func):
    """Decorate a command with ``--policies`` (``parse_policies`` reads its text)."""
    return click.option(
        "--policies", "policies_text", type=PolicySpecs(), default=DEFAULT_POLICIES, show_default=True,
        help="Comma-separated policies, each optionally with parameters (dynamo:overlap_weight=2,temperature=0.5), "
             "or an llm-d EndpointPickerConfig file (epp:FILE); "
             "the first is the baseline of the change columns. `kvroute policies` lists them.")(func)


def executor_options(func):
    """Decorate a command with where its runs execute (``kvroute.sim.study.executors``): ``--executor``,
    ``--address``, ``--max-workers``; the same options and defaults for ``compare`` and ``sweep``."""
    from kvroute.sim.study.executors import EXECUTORS

    options = [
        click.option("--executor", type=Choice(EXECUTORS), default=None,
                     help="local: process pool; sequential: this process; dask: a Dask cluster [local]."),
        click.option("--address", default=None,
                     help="Dask scheduler address, e.g. tcp://host:8786 (implies --executor dask) "
                          "[dask without it: a temporary local cluster]."),
        click.option("--max-workers", type=Number(PROCESSES), default=None, help="Local processes [CPU count]."),
    ]
    for option in reversed(options):
        func = option(func)
    return func


def resolve_executor(executor: str | None, address: str | None, sequential_only: str | None = None) -> str:
    """Where a command's runs execute, from ``--executor`` (None: not given) and ``--address``:
    ``dask`` with an address, else the executor given, else ``local``.

    Args:
        sequential_only: why the command runs in this process whatever is asked (``--uncertainty``),
            or None.

    Raises:
        click.UsageError: ``--address`` with another ``--executor`` than dask, or either option
            where ``sequential_only`` says they do not apply.
    """
    if address is not None and executor not in (None, "dask"):
        raise click.UsageError(f"--address sends the runs to a Dask cluster and --executor {executor} runs them "
                               "here: give one")
    if sequential_only and (address is not None or executor not in (None, "sequential")):
        given = f"--address {address}" if address is not None else f"--executor {executor}"
        raise click.UsageError(f"{sequential_only} runs in this process; {given} does not apply (leave it out)")
    return "dask" if address is not None else executor or "local"


def describe(trace: Trace, spec: ClusterSpec) -> str:
    """One line naming the scenario (KV blocks per worker after any GPU sharing; a profile measured
    on vLLM's CPU backend, ``hardware.device`` ``"cpu"``, has CPU devices in place of GPUs)."""
    gpus = spec.num_gpus or spec.num_workers
    blocks = sorted({spec.profile.shared(spec.workers_on_gpu(spec.gpu_of(w))).engine.num_gpu_blocks
                     for w in range(spec.num_workers)})
    on = f"{gpus} {'CPU device' if spec.profile.on_cpu else 'GPU'}" + ("" if gpus == 1 else "s")
    par = spec.profile.raw.get("parallel") if isinstance(spec.profile.raw, dict) else None
    tp = par.get("tensor_parallel_size", 1) if isinstance(par, dict) else 1
    if isinstance(tp, int) and tp > 1:  # a GPU of the scenario is one TP group of the profile
        on = f"{gpus} TP{tp} group{'s' if gpus > 1 else ''} ({gpus * tp} GPUs)"
    return (f"trace {trace.source}: {len(trace.records)} requests | {spec.num_workers} worker{'s' if spec.num_workers != 1 else ''} on {on} | "
            f"profile {spec.profile.name} ({'/'.join(map(str, blocks))} KV blocks of "
            f"{spec.profile.engine.block_size} tokens per worker"
            f"{', async scheduling' if spec.profile.engine.async_scheduling else ''})")


def with_errors(func):
    """Turn the simulator's ValueErrors into clean CLI errors."""
    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        try:
            return func(*args, **kwargs)
        except ValueError as exc:
            raise click.ClickException(str(exc)) from exc
    return wrapper
