"""The ``kvroute`` command: one entry point with subcommands."""

from __future__ import annotations

import os
import sys

import click


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="kvroute")
def cli() -> None:
    """kvroute: simulate vLLM workers behind a router, calibrate, and validate live."""


def _register() -> None:
    from kvroute.cli import sim_commands, sweep_command, trace_commands

    cli.add_command(sim_commands.simulate)
    cli.add_command(sim_commands.compare)
    cli.add_command(sim_commands.policies_command)
    cli.add_command(trace_commands.trace)
    cli.add_command(sweep_command.sweep_command)
    from kvroute.cli.sensitivity_command import sensitivity; cli.add_command(sensitivity)  # noqa: E702
    from kvroute.cli.profiles_command import profiles_command; cli.add_command(profiles_command)  # noqa: E702
    from kvroute.calibrate import validate_command
    from kvroute.calibrate.commands import COMMANDS

    for command in COMMANDS:
        cli.add_command(command)
    cli.add_command(validate_command.validate)


def main() -> None:
    """Console-script entry point.

    Every expected failure is a one-line ``Error: ...`` from the command. Anything else is a
    bug: it is reported on one line too (exit 1), and ``KVROUTE_DEBUG=1`` shows the traceback.
    """
    _register()
    try:
        cli(standalone_mode=True)
    except Exception as exc:  # noqa: BLE001 - the last line of defence, see the docstring
        if os.environ.get("KVROUTE_DEBUG"):
            raise
        reason = " ".join(str(exc).split())[:300]
        click.echo(f"Error: internal error (a bug in kvroute; KVROUTE_DEBUG=1 shows the traceback): "
                   f"{type(exc).__name__}: {reason}", err=True)
        sys.exit(1)
