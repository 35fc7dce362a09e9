"""``kvroute simulate`` and ``kvroute compare``."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click
from tqdm import tqdm

from kvroute.cli.scenario import build_spec, describe, load_trace, parse_policies, scenario_options, with_errors
from kvroute.sim.metrics import ServiceClass

DEFAULT_POLICIES = "round_robin,least_loaded,kv_aware"


def _run(policies, rounds, json_out, out, records_format, workload, trace_path, trace_block_size, max_requests, turns, chats,
         think_time, workers, gpus, profile_name, max_model_len, kv_blocks, arrival_spread, replay, seed,
         slo_ttft, slo_tpot):
    from kvroute.sim.experiment import compare as run_compare
    from kvroute.sim.experiment import format_table

    trace = load_trace(trace_path, workload, turns, chats, think_time, trace_block_size, max_requests, seed)
    spec = build_spec(profile_name, workers, gpus, arrival_spread, replay, max_model_len, kv_blocks)
    header = describe(trace, spec)
    if not json_out:
        click.echo(f"{header} | {rounds} round(s) per policy")
    bar = tqdm(total=len(policies) * rounds, desc="simulating", unit="run", file=sys.stderr,
               disable=json_out or not sys.stderr.isatty())
    comparison = run_compare(trace, spec, policies, rounds=rounds, seed=seed,
                             slo=ServiceClass(slo_ttft, slo_tpot), progress=lambda p, r: bar.update())
    bar.close()
    if json_out:
        doc = {"scenario": header, "rounds": rounds, "seed": seed,
               "slo": {"ttft_s": slo_ttft, "tpot_s": slo_tpot}, **comparison.to_dict()}
        click.echo(json.dumps(doc, indent=2))
    else:
        click.echo(format_table(comparison))
        click.echo(f"\n{rounds} round(s) per policy, seeds {seed}..{seed + rounds - 1}; "
                   f"± is the 95% interval over rounds; goodput at TTFT <= {slo_ttft} s and TPOT <= {slo_tpot} s.")
    if out is not None:
        _write_outputs(comparison, out, header, json_out, records_format)


def _write_outputs(comparison, out: Path, header: str, quiet: bool, records_format: str) -> None:
    from kvroute.sim.plots import plot_ttft

    out.mkdir(parents=True, exist_ok=True)
    records = comparison.records()
    records_file = out / f"records.{records_format}"
    if records_format == "csv":
        records.to_csv(records_file, index=False)
    else:
        records.to_parquet(records_file, index=False)
    comparison.summaries.to_csv(out / "summary.csv", index=False)
    (out / "compare.json").write_text(json.dumps({"scenario": header, **comparison.to_dict()}, indent=2))
    plot_ttft(records, out / "ttft.png", title=header.split(" | ")[0])
    if not quiet:
        click.echo(f"wrote {', '.join(str(out / name) for name in (records_file.name, 'summary.csv', 'compare.json', 'ttft.png'))}")


def output_options(func):
    """Decorate a command with --json, --out and --records-format."""
    for option in reversed([
        click.option("--json", "json_out", is_flag=True, help="Print JSON instead of the table."),
        click.option("--out", type=click.Path(file_okay=False, path_type=Path), default=None,
                     help="Write records.parquet, summary.csv, compare.json and ttft.png here."),
        click.option("--records-format", type=click.Choice(["parquet", "csv"]), default="parquet",
                     show_default=True, help="Format of the per-request records written with --out."),
    ]):
        func = option(func)
    return func


@click.command()
@scenario_options
@click.option("--policies", "policies_text", default=DEFAULT_POLICIES, show_default=True,
              help="Comma-separated policies; the first is the baseline of the change columns.")
@click.option("--rounds", type=int, default=3, show_default=True, help="Seeded rounds per policy.")
@output_options
@with_errors
def compare(policies_text, rounds, json_out, out, records_format, **scenario):
    """Compare routing policies on the same trace and cluster (default: the seed study's burst)."""
    _run(parse_policies(policies_text), rounds, json_out, out, records_format, **scenario)


@click.command()
@scenario_options
@click.option("--policy", default="kv_aware", show_default=True, help="Routing policy.")
@click.option("--rounds", type=int, default=1, show_default=True, help="Seeded rounds.")
@output_options
@with_errors
def simulate(policy, rounds, json_out, out, records_format, **scenario):
    """Simulate one routing policy and print its summary."""
    _run(parse_policies(policy, "--policy"), rounds, json_out, out, records_format, **scenario)
