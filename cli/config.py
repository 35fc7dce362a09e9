"""``--config FILE``: a YAML or JSON scenario file as the defaults of a command's options.

The file maps option names (long names with or without dashes: ``trace-block-size``,
``trace_block_size``, or the parameter's own name, which for a scenario option is its
``Scenario`` field's or an earlier one, ``trace_path``, ``profile_name``) to values. It becomes
the command's click ``default_map``, so the scenario model stays the command's options: a value
from the file is converted and checked exactly as the same value given on the command line, and
a flag given on the command line overrides it. The ``kvroute`` provenance block of a saved
``scenario.yaml`` (:mod:`kvroute.cli.provenance`) is ignored.
"""

from __future__ import annotations

import difflib
import json
import os
from pathlib import Path

import click

from kvroute.cli.provenance import (NOT_SCENARIO, ONCE_SAVED, POLICY_PARAMS, PROVENANCE_KEY, policy_configs,
                                    policy_files)
from kvroute.cli.values import InputFile
from kvroute.traces.inputs import JSON_DECODER, DuplicateKeyError, InputError
from kvroute.traces.yaml_doc import parse_yaml


PROVENANCE_META = "kvroute.config_provenance"
"""``ctx.meta`` key holding the ``kvroute`` block of the ``--config`` file (or None)."""


def read_config(path: Path, command: click.Command, meta: dict | None = None,
                ctx: click.Context | None = None) -> dict:
    """The ``default_map`` (parameter name -> value) of a scenario file for ``command``.

    ``meta[PROVENANCE_META]`` (when ``meta`` is given) receives the file's ``kvroute`` block.
    With ``ctx``, every value is also converted by its option's type first, so that a bad one
    is an error naming the file, the line (YAML) and the option, not only the option as a value
    given on the command line would be.

    Raises:
        click.BadParameter (``--config``): the file cannot be read, is not YAML/JSON, is not a
            mapping, names an option ``command`` does not have (listing the valid names; an
            option of another scenario command, ``compare``'s ``uncertainty`` given to ``sweep``,
            is left out with a warning), or
            (with ``ctx``) holds a value its option's type refuses.
    """
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise click.BadParameter(f"cannot read {path}: {exc}", param_hint="'--config'") from None
    try:
        doc = JSON_DECODER.decode(text) if path.suffix.lower() == ".json" else parse_yaml(text, str(path),
                                                                                            track_lines=True)
    except DuplicateKeyError as exc:  # JSON (YAML's come with their file from parse_yaml)
        raise click.BadParameter(str(DuplicateKeyError(exc.key, str(path), exc.line)), param_hint="'--config'") from None
    except InputError as exc:  # YAML: not valid, a key given twice, nested too deep (kvroute.traces.yaml_doc)
        raise click.BadParameter(str(exc), param_hint="'--config'") from None
    except json.JSONDecodeError as exc:
        raise click.BadParameter(f"{path}:{exc.lineno}: not valid JSON: {' '.join(exc.msg.split())}",
                                 param_hint="'--config'") from None
    except ValueError as exc:  # an int of over 4300 digits; JSON nested too deep
        raise click.BadParameter(f"{path}: {' '.join(str(exc).split(';')[0].split())}",
                                 param_hint="'--config'") from None
    except RecursionError:  # JSON nested deeper than Python's recursion limit
        raise click.BadParameter(f"{path}: nested too deep to read", param_hint="'--config'") from None
    if doc is None:
        return {}
    if meta is not None and isinstance(doc, dict):
        meta[PROVENANCE_META] = doc.get(PROVENANCE_KEY)
    if not isinstance(doc, dict):
        raise click.BadParameter(f"{path}: expected a mapping of option names to values, got "
                                 f"{type(doc).__name__}", param_hint="'--config'")
    names = {}
    shown = set()  # the keys an error lists: the options' long names (not the old names still read)
    for param in command.params:
        if isinstance(param, click.Option) and param.name not in NOT_SCENARIO:
            names[param.name] = param.name
            for alias in getattr(param, "aliases", ()):  # an earlier parameter name (AliasedOption)
                names[alias] = param.name
            for opt in param.opts:
                if opt.startswith("--"):
                    names[opt[2:]] = names[opt[2:].replace("-", "_")] = param.name
                    shown.add(opt[2:])
    lines = getattr(doc, "key_lines", {})  # YAML: each key's line
    params = {p.name: p for p in command.params}
    values = {}
    for key, value in doc.items():
        where = f"{path}:{lines[key]}" if key in lines else str(path)
        if key == PROVENANCE_KEY:
            continue
        if key not in names:
            param, output = next(((q, o[2:]) for q in command.params if isinstance(q, click.Option)
                                  and q.name in NOT_SCENARIO for o in q.opts if o[2:] == key or q.name == key),
                                 (None, None))
            if param is not None and param.name in ONCE_SAVED:  # a file of an earlier version
                if _plain(value) != param.default:
                    click.echo(f"warning: {where}: {key!r} is no longer a scenario value and --config leaves it "
                               f"out: give --{output} on the command line", err=True)
                continue
            if output is not None:
                raise click.BadParameter(f"{where}: {output!r} says where {command.name} writes or what it shows, not "
                                         f"what it runs: give --{output} on the command line", param_hint="'--config'")
            elsewhere = _sibling_with(ctx, command, key)
            if elsewhere is not None:  # a scenario saved by compare, run by sweep: the rest still applies
                other, option = elsewhere
                if _plain(value) != option.default:  # at its default it changed nothing
                    click.echo(f"warning: {where}: {key!r} is an option of {other}, not of {command.name}; "
                               f"{command.name} runs the scenario without it", err=True)
                continue
            valid = sorted(shown)
            close = difflib.get_close_matches(key, valid, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise click.BadParameter(f"{where}: unknown option {key!r} for {command.name}{hint}; valid: "
                                     f"{', '.join(valid)}", param_hint="'--config'")
        value = _plain(value)
        if ctx is not None and value is not None:
            param = params[names[key]]
            try:
                cast = param.type_cast_value(ctx, value)
                if param.callback is not None:  # its checks too (a length distribution's), so the error names the file
                    param.callback(ctx, param, cast)
            except click.BadParameter as exc:
                hint = _saved_policy_files(doc.get(PROVENANCE_KEY)) if names[key] in POLICY_PARAMS else ""
                raise click.BadParameter(f"{where}: option {key!r}: {exc.message}{hint}",
                                         param_hint="'--config'") from None
        values[names[key]] = value
    return values


def _saved_policy_files(saved: object) -> str:
    """For policies of one's own that the file's run imported and this one has not (the ``kvroute``
    block's ``policy_files``): where from, so that the re-run imports them too; "" otherwise."""
    from kvroute.sim.routing import POLICIES

    files = saved.get("policy_files") if isinstance(saved, dict) else None
    if not isinstance(files, dict):
        return ""
    missing = {name: then["path"] for name, then in files.items()
               if name not in POLICIES and isinstance(then, dict) and isinstance(then.get("path"), str)
               and then["path"]}
    if not missing:
        return ""
    paths = os.pathsep.join(dict.fromkeys(missing.values()))
    return (f"; its run imported {', '.join(missing)} from {paths}: re-run with KVROUTE_POLICY_FILES={paths}, "
            "as the file's first line says")


SCENARIO_COMMANDS = ("compare", "simulate", "sweep")
"""The commands whose ``--out`` writes a scenario file the others may be given."""


def _sibling_with(ctx: click.Context | None, command: click.Command, key: str) -> tuple[str, click.Option] | None:
    """The first other scenario command (``SCENARIO_COMMANDS``) with a scenario option named
    ``key`` (long name), and that option; or None."""
    if ctx is None or command.name not in SCENARIO_COMMANDS:
        return None
    root = ctx.find_root()
    group = root.command
    if not isinstance(group, click.Group):
        return None
    for name in SCENARIO_COMMANDS:
        other = group.get_command(root, name) if name != command.name else None
        for q in other.params if other is not None else ():
            if isinstance(q, click.Option) and (q.name not in NOT_SCENARIO or q.name in ONCE_SAVED) \
                    and f"--{key}" in q.opts:
                return name, q
    return None


def _plain(value: object) -> object:
    """``value`` with the line-tracking YAML containers as plain dicts and lists."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


def _apply(ctx: click.Context, param: click.Parameter, value: Path | None) -> Path | None:
    if value is not None:
        ctx.default_map = {**(ctx.default_map or {}), **read_config(value, ctx.command, ctx.meta, ctx)}
    return value


def changed_inputs(ctx: click.Context, trace_sha256: str | None, profile_sha256: str) -> list[str]:
    """Which inputs differ from those the ``--config`` file's run recorded (empty without one).

    Args:
        ctx: the running command's context.
        trace_sha256: the trace file's sha256 now, or None for a generated workload.
        profile_sha256: the profile's content hash now.
    """
    saved = ctx.meta.get(PROVENANCE_META)
    if not isinstance(saved, dict):
        return []
    changed = []
    old_trace = (saved.get("trace") or {}).get("sha256") if isinstance(saved.get("trace"), dict) else None
    if trace_sha256 is not None and old_trace is not None and old_trace != trace_sha256:
        changed.append(f"the trace file (sha256 {old_trace[:12]}... then, {trace_sha256[:12]}... now)")
    for block, files, what in (("policy_files", policy_files(ctx), "file"),
                               ("policy_configs", policy_configs(ctx), "config file")):
        old_files = saved.get(block) if isinstance(saved.get(block), dict) else {}
        by_path = {then.get("path"): then for then in old_files.values() if isinstance(then, dict)}
        for name, now in files.items():  # a spec saved as given is re-read with its path absolute
            then = old_files.get(name, by_path.get(now["path"]))
            if isinstance(then, dict) and then.get("sha256") not in (None, now["sha256"]):
                changed.append(f"policy {name}'s {what} {now['path']} (sha256 {then['sha256'][:12]}... then, "
                               f"{now['sha256'][:12]}... now)")
    old_profile = (saved.get("profile") or {}).get("sha256") if isinstance(saved.get("profile"), dict) else None
    if old_profile is not None and old_profile != profile_sha256:
        changed.append(f"the profile (sha256 {old_profile[:12]}... then, {profile_sha256[:12]}... now)")
    return changed


def config_option(func):
    """Decorate a command with ``--config FILE`` (eager, so its values are defaults for the rest)."""
    return click.option(
        "--config", type=InputFile(), default=None,
        is_eager=True, expose_value=False, callback=_apply,
        help="Scenario file (YAML or JSON: option names -> values), e.g. a run's saved scenario.yaml; "
             "flags given here override it.")(func)
