"""The CLI's help answers without importing the heavy libraries, and says the same as before."""

import subprocess
import sys

import click
import pytest

from kvroute.cli.main import LAZY_COMMANDS

PROBE = """
import sys
sys.argv = ["kvroute", *sys.argv[1:]]
from kvroute.cli.main import main
try:
    main()
except SystemExit:
    pass
heavy = sorted({m.split(".")[0] for m in sys.modules} & {"pandas", "scipy", "pyarrow", "matplotlib"})
print("HEAVY", ",".join(heavy))
"""


@pytest.mark.parametrize("args", [["--help"], ["simulate", "--help"], ["compare", "--help"], ["plot-series", "--help"]])
def test_help_imports_neither_pandas_nor_scipy(args):
    out = subprocess.run([sys.executable, "-c", PROBE, *args], capture_output=True, text=True, check=True).stdout
    assert out.strip().splitlines()[-1] == "HEAVY", out


def test_lazy_short_help_is_the_commands_own():
    """The short help printed for a not yet imported command equals what click prints for it."""
    import importlib

    for name, (module, attribute, text) in LAZY_COMMANDS.items():
        command = getattr(importlib.import_module(module), attribute)
        for limit in (30, 45, 60, 200):
            assert command.get_short_help_str(limit) == click.Command(name, help=text).get_short_help_str(limit), name


def test_simulate_json_imports_neither_pandas_nor_scipy():
    """One round printed as JSON is summarised from plain rows: pandas (about 0.3 s of a short
    run's start-up), pyarrow and scipy stay unimported."""
    args = ["simulate", "--turns", "2", "--policy", "round_robin,kv_aware", "--json"]
    out = subprocess.run([sys.executable, "-c", PROBE, *args], capture_output=True, text=True, check=True).stdout
    assert out.strip().splitlines()[-1] == "HEAVY", out[-300:]


def test_simulate_json_carries_its_notes_and_stays_light():
    """``--json`` gives the notes the table would print that need no per-request table (a derived
    prior, failures counted), still without pandas."""
    import json

    args = ["simulate", "--workload", "agent", "--chats", "2", "--max-model-len", "8192", "--json"]
    out = subprocess.run([sys.executable, "-c", PROBE, *args], capture_output=True, text=True, check=True).stdout
    assert out.strip().splitlines()[-1] == "HEAVY", out[-300:]
    notes = json.loads(out.rsplit("HEAVY", 1)[0])["notes"]
    assert notes[0] == ("Note: 20 requests failed (all policies and rounds); the notes without --json, or --out's "
                        "records, give the reasons")
    assert notes[1].startswith("Note: a6000-qwen2.5-7b is a derived prior, not a measurement")


def test_a_sweep_that_draws_nothing_leaves_matplotlib_unimported():
    """Checking whether --plot-load had a load axis imported the plots (matplotlib, about half a
    second) on every sweep, drawn or not."""
    args = ["sweep", "--chats", "2", "--turns", "2", "--workers", "2", "--rounds", "1", "--policies", "round_robin",
            "--executor", "sequential", "--no-progress"]
    out = subprocess.run([sys.executable, "-c", PROBE, *args], capture_output=True, text=True, check=True).stdout
    assert "matplotlib" not in out.strip().splitlines()[-1], out[-300:]
