"""What a run's outputs need to be reproduced: the resolved options, seeds, version and hashes.

``scenario.yaml`` (beside a command's ``--out``) holds every option of the command after
defaults, ``--config`` file and command line were merged (keyed by the options' long names, as
``kvroute compare --config`` reads them back), and a ``kvroute`` block that ``--config`` ignores:
the command, kvroute's version, the seeds and rounds, the profile's content hash (sha256 of its
canonical JSON: keys sorted, no spaces) and the trace's hash (sha256 of the file's bytes, or of
the canonical JSON of each generated round's records).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path

import click

from kvroute.cli.values import Axis

SCENARIO_FILE = "scenario.yaml"
"""Name of the scenario file written into an output directory."""

PROVENANCE_KEY = "kvroute"
"""Top-level key of the provenance block (read by people, ignored by ``--config``)."""

NOT_SCENARIO = ("config", "out", "json_out", "quiet", "figure_formats", "time_series")
"""Parameters that say where outputs go or what is shown, not what runs; left out of the scenario."""


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
        if isinstance(param.type, Axis) and value is not None:
            value = Axis.text(value)  # a sweep's comma list, as --config reads it back
        elif isinstance(value, Path):
            value = str(value.resolve())
        elif name in ("profile", "profile_name") and isinstance(value, str) and Path(value).is_file():
            value = str(Path(value).resolve())  # a profile file, not a shipped name
        elif isinstance(value, tuple):
            value = list(value)
        out[_long_name(param)] = value
    return out


def _long_name(param: click.Option) -> str:
    longs = [o for o in param.opts if o.startswith("--")]
    return (longs[0] if longs else param.opts[0]).lstrip("-")


def write_scenario(out_dir: Path, ctx: click.Context, provenance: dict, name: str = SCENARIO_FILE) -> Path:
    """Write ``out_dir/name`` (default ``scenario.yaml``): the resolved options, then
    ``kvroute: provenance``.

    Args:
        out_dir: the run's output directory (exists).
        name: the file's name.
        ctx: the running command's click context.
        provenance: seeds, rounds, hashes, ... (JSON-ready); ``command`` and ``version`` are added.

    Returns:
        The file's path.
    """
    import yaml

    from kvroute.traces.outputs import write_text_atomic

    doc = resolved_options(ctx)
    doc[PROVENANCE_KEY] = {"command": ctx.command_path, "version": kvroute_version(), **provenance}
    path = out_dir / name
    header = (f"# {ctx.command_path} --config {path} re-runs this scenario; command-line flags override "
              f"these values.\n# The '{PROVENANCE_KEY}' block records what produced the outputs; "
              f"--config ignores it.\n")
    write_text_atomic(path, header + yaml.safe_dump(doc, sort_keys=False, allow_unicode=True))
    return path


def kvroute_version() -> str:
    """The installed kvroute's version (``importlib.metadata``), or ``"unknown"``."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("kvroute")
    except PackageNotFoundError:
        return "unknown"
