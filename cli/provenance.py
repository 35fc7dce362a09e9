"""What a run's outputs need to be reproduced: the resolved options, seeds, version and hashes.

``scenario.yaml`` (beside a command's ``--out``) holds every option of the command after
defaults, ``--config`` file and command line were merged (keyed by the options' long names, as
``kvroute compare --config`` reads them back), and a ``kvroute`` block that ``--config`` ignores:
the command, kvroute's version, the seeds and rounds, the profile's content hash (sha256 of its
canonical JSON: keys sorted, no spaces), the trace's hash (sha256 of the file's bytes, or of
the canonical JSON of each generated round's records) and the output options that chose the
files (``outputs``: ``--time-series``, ``--figure-format``, ``sweep --plot-load``,
``--records-format``); for a routing
policy of one's own, its file and the file's hash (``policy_files``; the header's command imports
it again with ``KVROUTE_POLICY_FILES``); for a policy that reads a config file (``epp:FILE``),
that file's path and hash (``policy_configs``).

Output options are not scenario values (``NOT_SCENARIO``): ``--config`` neither sets them nor
takes them as keys, so a saved scenario re-runs as its header prints it, with or without
``--out`` (``--time-series`` without ``--out`` is an error), and each re-run chooses its own
outputs. The header names the output flags the run was given, to write the same files again.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path

import click

from kvroute.cli.values import Axis, Cores

SCENARIO_FILE = "scenario.yaml"
"""Name of the scenario file written into an output directory."""

PROVENANCE_KEY = "kvroute"
"""Top-level key of the provenance block (read by people, ignored by ``--config``)."""

NOT_SCENARIO = ("config", "out", "json_out", "quiet", "figure_formats", "time_series", "plot_load", "records_format",
                "show", "no_progress")
"""Parameters that say where outputs go or what is shown, not what runs; left out of the scenario
(``sweep --plot-load``'s path too: kept, a re-run with ``--config`` would draw over the first
run's figure)."""

ONCE_SAVED = ("records_format", "show", "no_progress")
"""Parameters of ``NOT_SCENARIO`` that scenario files written before 2026-12-05 saved as values:
``--config`` leaves them out (with a warning when one differs from its default), so those files
still run."""

OUTPUT_FILE_OPTIONS = ("time_series", "figure_formats", "plot_load", "records_format")
"""The parameters of ``NOT_SCENARIO`` that choose which files a run writes under ``--out``:
recorded in the provenance block (``outputs``) and, when given, named in the file's header."""


def canonical_sha256(doc: object) -> str:
    """sha256 (hex) of ``doc`` as canonical JSON: keys sorted, ``(",", ":")`` separators, UTF-8."""
    text = json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def file_sha256(path: str | Path) -> str:
    """sha256 (hex) of a file's bytes, read in 1 MiB chunks."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def trace_file_record(path: str | Path) -> dict:
    """A trace file's provenance: its absolute path and :func:`file_sha256`."""
    return {"file": str(Path(path).resolve()), "sha256": file_sha256(path)}


def records_sha256(trace) -> str:
    """sha256 of a :class:`~kvroute.traces.format.Trace`'s block size and records as canonical
    JSON (each record's fields as a list, ``hash_ids`` expanded)."""
    rows = [[*(list(v) if isinstance(v, range) else v for v in dataclasses.astuple(r))] for r in trace.records]
    rows = [[list(v) if isinstance(v, tuple) else v for v in row] for row in rows]
    return canonical_sha256({"block_size": trace.block_size, "records": rows})


def resolved_options(ctx: click.Context) -> dict:
    """Every scenario option of ``ctx``'s command after defaults, keyed by long option name
    (``--trace-block-size`` -> ``trace-block-size``), values as YAML-ready plain types; paths
    absolute, so the file replays from any directory."""
    out = {}
    for param in ctx.command.params:
        name = param.name
        if name in NOT_SCENARIO or name not in ctx.params or not isinstance(param, click.Option):
            continue
        value = ctx.params[name]
        if name in POLICY_PARAMS and isinstance(value, str):
            value = absolute_configs(value)  # epp:FILE -> epp:/abs/FILE
        elif isinstance(param.type, Axis) and value is not None:
            value = Axis.text(value)  # a sweep's comma list, as --config reads it back
        elif isinstance(value, Path):
            value = str(value.resolve())
        elif name in ("profile", "profile_name") and isinstance(value, str) and Path(value).is_file():
            value = str(Path(value).resolve())  # a profile file, not a shipped name
        elif isinstance(value, tuple) and not param.multiple and len(value) == 2 and \
                not isinstance(param.type, Cores) and all(isinstance(v, (int, float)) for v in value):
            value = Axis.text([value])  # a (low, high) range as "low-high": a list would be a sweep's two values
        elif isinstance(value, tuple):
            value = list(value)
        out[_long_name(param)] = value
    return out


def output_options(ctx: click.Context) -> dict:
    """The ``OUTPUT_FILE_OPTIONS`` of ``ctx``'s command (those it has) with their values, keyed
    by long option name (``--time-series`` -> ``time-series``), tuples as lists."""
    return {_long_name(param): list(value) if isinstance(value, tuple) else
            str(value.resolve()) if isinstance(value, Path) else value
            for param in ctx.command.params
            if param.name in OUTPUT_FILE_OPTIONS and (value := ctx.params.get(param.name)) is not None}


def output_flags(ctx: click.Context) -> list[str]:
    """The ``OUTPUT_FILE_OPTIONS`` given to ``ctx``'s command (not left at their defaults), as
    command-line arguments: ``["--time-series", "--figure-format", "png,svg"]``; a path as
    ``FILE`` with its suffix (``--plot-load FILE.svg``: the run's own would be drawn over)."""
    from click.core import ParameterSource

    args = []
    for param in ctx.command.params:
        if param.name not in OUTPUT_FILE_OPTIONS or param.name not in ctx.params:
            continue
        if ctx.get_parameter_source(param.name) in (None, ParameterSource.DEFAULT):
            continue
        value = ctx.params[param.name]
        flag = "--" + _long_name(param)
        if getattr(param, "is_flag", False):
            args += [flag] if value else []
        elif isinstance(value, Path):
            args += [flag, f"FILE{value.suffix}"]
        else:
            args += [flag, ",".join(value) if isinstance(value, (tuple, list)) else str(value)]
    return args


def _out_metavar(ctx: click.Context) -> str:
    """``DIR`` when the command's ``--out`` is a directory (``compare``, ``simulate``), else ``FILE``."""
    out = next((p for p in ctx.command.params if p.name == "out"), None)
    return "DIR" if out is not None and getattr(out.type, "file_okay", True) is False else "FILE"


def _long_name(param: click.Option) -> str:
    longs = [o for o in param.opts if o.startswith("--")]
    return (longs[0] if longs else param.opts[0]).lstrip("-")


POLICY_PARAMS = ("policies_text", "policy")
"""The parameters that name a command's routing policies (``--policies``, ``simulate --policy``)."""


def policy_files(ctx: click.Context) -> dict[str, dict]:
    """Per policy of ``ctx``'s command not built into kvroute, the file it was imported from and
    that file's sha256: ``{name: {"path": ..., "sha256": ...}}`` (empty when every one is built in).
    A re-run needs the file again (``KVROUTE_POLICY_FILES``), and the hash says whether it changed."""
    from kvroute.sim.routing import POLICIES, parse_spec
    from kvroute.sim.routing.policy_errors import user_policy_file

    out = {}
    for spec in _policy_specs(ctx):
        name = parse_spec(spec)[0]
        path = user_policy_file(POLICIES[name])
        if path is not None and Path(path).is_file():
            out[name] = {"path": path, "sha256": file_sha256(path)}
    return out


def policy_configs(ctx: click.Context) -> dict[str, dict]:
    """Per policy spec of ``ctx``'s command that reads a config file (``epp:FILE``, an llm-d
    EndpointPickerConfig), the file's absolute path and sha256: ``{spec: {"path", "sha256"}}``."""
    from kvroute.sim.routing import parse_spec

    out = {}
    for spec in _policy_specs(ctx):
        file = _config_file(parse_spec(spec)[1])
        if file is not None:
            out[spec] = {"path": str(Path(file).resolve()), "sha256": file_sha256(file)}
    return out


def _config_file(params: dict) -> str | None:
    """The file a policy's ``config`` parameter reads (a Markdown report's for ``REPORT.md#NAME``),
    or None when it has none or it is no file here."""
    from kvroute.sim.routing.epp_config import config_file

    config = params.get("config")
    return config_file(config) if isinstance(config, str) and Path(config_file(config)).is_file() else None


def absolute_configs(text: str) -> str:
    """A ``--policies`` text with each config file a spec reads (``epp:FILE``, ``epp:config=FILE``,
    ``epp:REPORT.md#NAME``) made absolute; other specs, and a config that is no file here, as given.
    ``"epp:a.yaml,kv_aware"`` -> ``"epp:/run/dir/a.yaml,kv_aware"``.

    Raises:
        ValueError: a spec that does not parse (``parse_spec``).
    """
    from kvroute.sim.routing import parse_spec, split_specs

    out = []
    for spec in split_specs(text):
        name, params = parse_spec(spec)
        file = _config_file(params)
        if file is not None:
            absolute = str(Path(file).resolve()) + params["config"][len(file):]  # a report's #NAME kept
            items = [item.strip() for item in spec.partition(":")[2].split(",") if item.strip()]
            spec = f"{name}:" + ",".join(absolute if "=" not in item  # epp:FILE (the first, bare)
                                         else f"config={absolute}" if item.partition("=")[0].strip() == "config"
                                         else item for item in items)
        out.append(spec)
    return ",".join(out)


def _policy_specs(ctx: click.Context) -> list[str]:
    """The policy specs ``ctx``'s command was given (``POLICY_PARAMS``)."""
    from kvroute.sim.routing import split_specs

    return [spec for key in POLICY_PARAMS if isinstance(text := ctx.params.get(key), str) for spec in split_specs(text)]


def write_scenario(out_dir: Path, ctx: click.Context, provenance: dict, name: str = SCENARIO_FILE) -> Path:
    """Write ``out_dir/name`` (default ``scenario.yaml``): the resolved options, then
    ``kvroute: provenance``.

    Args:
        out_dir: the run's output directory (exists).
        name: the file's name.
        ctx: the running command's click context.
        provenance: seeds, rounds, hashes, ... (JSON-ready); ``command``, ``version`` and
            ``outputs`` (:func:`output_options`) are added.

    Returns:
        The file's path.
    """
    import shlex

    import yaml

    from kvroute.traces.outputs import write_text_atomic

    doc = resolved_options(ctx)
    outputs = output_options(ctx)
    own, configs = policy_files(ctx), policy_configs(ctx)
    doc[PROVENANCE_KEY] = {"command": ctx.command_path, "version": kvroute_version(), **provenance,
                           **({"policy_files": own} if own else {}), **({"policy_configs": configs} if configs else {}),
                           **({"outputs": outputs} if outputs else {})}
    path = out_dir / name
    env = ""
    if own:  # the policies of one's own are imported from their files again
        import os

        env = f"KVROUTE_POLICY_FILES={shlex.quote(os.pathsep.join(dict.fromkeys(f['path'] for f in own.values())))} "
    header = (f"# {env}{ctx.command_path} --config {path} re-runs this scenario; command-line flags override "
              f"these values.\n")
    flags = output_flags(ctx)
    if flags:
        given = shlex.join(flags)
        header += (f"# Output options are not scenario values and --config does not set them: this run also had "
                   f"{given};\n# to write the same files again: {env}{ctx.command_path} --config {path} "
                   f"--out {_out_metavar(ctx)} {given}\n")
    header += f"# The '{PROVENANCE_KEY}' block records what produced the outputs; --config ignores it.\n"
    write_text_atomic(path, header + yaml.safe_dump(doc, sort_keys=False, allow_unicode=True))
    return path


def kvroute_version() -> str:
    """The installed kvroute's version (``importlib.metadata``), or ``"unknown"``."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("kvroute")
    except PackageNotFoundError:
        return "unknown"
