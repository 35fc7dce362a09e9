"""The ``kvroute`` command: one entry point with subcommands."""

from __future__ import annotations

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
    from kvroute.calibrate import validate_command
    from kvroute.calibrate.commands import COMMANDS

    for command in COMMANDS:
        cli.add_command(command)
    cli.add_command(validate_command.validate)


def main() -> None:
    """Console-script entry point."""
    _register()
    cli()
