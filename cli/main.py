"""The ``kvroute`` command: one entry point with subcommands."""

from __future__ import annotations

import contextlib
import gc
import importlib
import os
import sys
from collections.abc import Iterator

import click

from kvroute.cli.help_text import SHORT_HELP_LIMIT, HelpfulGroup

# Subcommands are loaded only when invoked, so that ``kvroute --help`` and ``kvroute simulate
# --help`` stay fast and a simulation imports no calibration code (name -> module, attribute,
# first paragraph of the command's help; tests/cli/test_lazy_imports.py checks it against the command's).
LAZY_COMMANDS: dict[str, tuple[str, str, str]] = {
    "simulate": ("kvroute.cli.sim_commands", "simulate", "Simulate one routing policy and print its summary."),
    "compare": ("kvroute.cli.sim_commands", "compare", "Compare routing policies on the same trace and cluster (default: the seed study's burst)."),
    "trace": ("kvroute.cli.trace_commands", "trace", "Generate, import and describe traces."),
    "sweep": ("kvroute.cli.sweep_command", "sweep_command", "Run a grid of scenarios (every combination of the comma lists) and print pivot tables."),
    "plot-series": ("kvroute.cli.plot_command", "plot_series_command", "Redraw one run's time-series plot from a timeseries.parquet (compare --time-series)."),
    "policies": ("kvroute.cli.sim_commands", "policies_command", "List the routing policies, one line each: name, parameters with defaults, summary."),
    "sensitivity": ("kvroute.cli.sensitivity_command", "sensitivity", "Rank the scenario's uncertain inputs by how much each moves the headline metrics."),
    "profiles": ("kvroute.cli.profiles_command", "profiles_command", "List the shipped profiles, one line each: name, source (measured/derived), hardware, model, KV blocks per worker."),
    "serve": ("kvroute.cli.serve_command", "serve", "Start vLLM OpenAI-compatible servers (one per GPU, or one per CPU core) and keep them up until Ctrl-C. Arguments after ``--`` go to vLLM as they are."),
    "calibrate": ("kvroute.cli.calibrate_commands", "calibrate", "Measure real vLLM servers and fit a profile for the simulator."),
    "validate": ("kvroute.cli.validate_command", "validate", "Replay a trace live against vLLM servers with the simulator's routing policies, simulate the same trace, and report predicted against measured (time to complete, TTFT, ITL, hit rate, per-worker hit tokens). Ctrl-C or SIGTERM writes what was measured so far (exit code 130)."),
}


SINGLE_THREADED_BLAS = {"kvroute.cli.sim_commands"}
"""Command modules that import numpy with OpenBLAS's thread pool held to one thread."""


@contextlib.contextmanager
def single_threaded_blas() -> Iterator[None]:
    """Within the block, a first import of numpy starts OpenBLAS with one thread (unless the
    user's ``OPENBLAS_NUM_THREADS`` says otherwise); the environment is restored after it.

    NOTE: OpenBLAS reads the variable once, when numpy loads it. A simulation makes no BLAS calls,
    but starting the thread pool costs time on every run (docs/log/speed-passes.md); child
    processes (a sweep's workers) get the user's environment back."""
    name = "OPENBLAS_NUM_THREADS"
    if name in os.environ or "numpy" in sys.modules:
        yield
        return
    os.environ[name] = "1"
    try:
        yield
    finally:
        os.environ.pop(name, None)


class LazyGroup(HelpfulGroup):
    """A click group that imports the modules of ``LAZY_COMMANDS`` on first use.

    Attributes:
        resume_collector: set by ``main``, which starts with the cyclic garbage collector paused:
            once the command's modules are loaded, freeze what start-up made and resume it.
    """

    resume_collector = False

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *LAZY_COMMANDS})

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        command = super().get_command(ctx, name)
        if command is None and name in LAZY_COMMANDS:
            module, attribute, _ = LAZY_COMMANDS[name]
            with single_threaded_blas() if module in SINGLE_THREADED_BLAS else contextlib.nullcontext():
                command = getattr(importlib.import_module(module), attribute)
            self.add_command(command, name)
        if self.resume_collector:
            # NOTE: the modules (click, numpy, simpy, the simulator) live as long as the process:
            # frozen, no later collection walks them (the collector's passes over them were
            # 1.4 % of a 1,000-request run's instructions).
            self.resume_collector = False
            gc.freeze()
            gc.enable()
        return command

    def invoke(self, ctx: click.Context):
        """Run the command; an input error it did not turn into a click error itself (an
        ``InputError`` from any layer names its file, line, field or flag: bad input or an
        output that cannot be written) is the one-line ``Error:`` all bad input gets, and so
        is running out of memory (not a bug: the input was too large for this machine)."""
        try:
            return super().invoke(ctx)
        except ValueError as exc:
            from kvroute.traces.inputs import InputError

            if isinstance(exc, InputError):
                raise click.ClickException(str(exc)) from exc
            raise
        except MemoryError as exc:
            detail = f" ({' '.join(str(exc).split())})" if str(exc) else ""
            raise click.ClickException(f"ran out of memory{detail}: the inputs together are too large for this "
                                       "machine; use fewer requests, workers or rounds") from exc

    def command_summary(self, ctx: click.Context, name: str) -> str | None:
        """A command not yet imported is summed up from ``LAZY_COMMANDS`` (``--help`` imports none)."""
        if name in LAZY_COMMANDS and name not in self.commands:
            return click.Command(name, help=LAZY_COMMANDS[name][2]).get_short_help_str(SHORT_HELP_LIMIT)
        return super().command_summary(ctx, name)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="kvroute")
def cli() -> None:
    """kvroute: simulate vLLM workers behind a router, calibrate, and validate live."""


OPTIONAL_MODULES = {
    "aiohttp": "pip install 'kvroute[gpu]' (GPU servers) or 'kvroute[live]' (vLLM on the CPU)",
    "vllm": "pip install 'kvroute[gpu]' (GPU servers) or 'kvroute[live]' (vLLM on the CPU)",
    "transformers": "pip install 'kvroute[live]'",
    "tokenizers": "pip install 'kvroute[live]'",
}
"""Modules that only the optional extras (pyproject.toml) install, and how to get them: a command
that imports one of them when it is missing ends in a one-line error saying so, not in an
internal error."""


def main() -> None:
    """Console-script entry point.

    Every expected failure is a one-line ``Error: ...`` from the command. Anything else is a
    bug: it is reported on one line too (exit 1), and ``KVROUTE_DEBUG=1`` shows the traceback.
    """
    if gc.isenabled():
        gc.disable()
        cli.resume_collector = True
    try:
        cli(standalone_mode=True)
    except Exception as exc:  # noqa: BLE001 - the last line of defence, see the docstring
        if os.environ.get("KVROUTE_DEBUG"):
            raise
        install = OPTIONAL_MODULES.get(exc.name) if isinstance(exc, ModuleNotFoundError) else None
        if install is not None:
            click.echo(f"Error: this command needs {exc.name}, which kvroute does not install by default: {install}",
                       err=True)
            sys.exit(1)
        reason = " ".join(str(exc).split())[:300]
        click.echo(f"Error: internal error (a bug in kvroute; KVROUTE_DEBUG=1 shows the traceback): "
                   f"{type(exc).__name__}: {reason}", err=True)
        sys.exit(1)
    finally:
        # NOTE: the process ends here. CPython's exit runs a full garbage collection over every
        # object still alive (about 3 % of a 1,000-request run's instructions) although the OS
        # frees them all; frozen objects are skipped. Files are closed by their ``with`` blocks.
        gc.freeze()
        if cli.resume_collector:  # no command was loaded (``kvroute --help``, a usage error)
            cli.resume_collector = False
            gc.enable()
