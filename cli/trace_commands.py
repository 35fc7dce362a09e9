"""``kvroute trace generate|import|stats``."""

from __future__ import annotations

import json
from pathlib import Path

import click

from kvroute.cli.help_text import HelpfulGroup
from kvroute.cli.scenario import read_any_trace, scenario_from_options, scenario_options
from kvroute.cli.signals import stops_on_sigterm
from kvroute.cli.values import Choice, InputFile, Number, check_values
from kvroute.traces.inputs import BLOCK_SIZE, SEED, Num


@click.group(cls=HelpfulGroup)
def trace() -> None:
    """Generate, import and describe traces."""


def _check_out(out: Path) -> None:
    """``--out`` must be writable before any work."""
    from kvroute.traces.outputs import check_output

    try:
        check_output(out)
    except ValueError as exc:
        raise click.ClickException(str(exc)) from None


@trace.command()
@click.argument("kind", type=Choice(["seed-chat", "agent"]))
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path), required=True, help="JSONL file to write.")
@scenario_options(groups=("workload",), exclude=("workload",), slo=False)
@click.option("--seed", type=Number(SEED), default=0, show_default=True,
              help="Seed of the length draws (the same as a simulation round with this seed draws).")
@click.option("--block-size", type=Number(BLOCK_SIZE), default=16, show_default=True, help="Tokens per hash_ids block.")
@check_values
@stops_on_sigterm
def generate(kind, out, seed, block_size, **options):
    """Write a generated workload as a kvroute trace, with every drawn length written out.

    The file replays exactly: `kvroute simulate --trace FILE` gives the records of the built-in
    workload's round with this seed, and `kvroute validate --trace FILE` sends these lengths.
    """
    from kvroute.traces import generators
    from kvroute.traces.writer import write_trace

    _check_out(out)
    scenario = scenario_from_options(options, workload=kind, seed=seed)  # its checks, its sizes
    chats, turns = scenario.sizes
    result = generators.builtin_workload(kind, chats, turns, scenario.think_time_s, seed, scenario.reply,
                                         scenario.history_range, max_tokens=scenario.max_tokens, user=scenario.user,
                                         start_s=scenario.start_s, block_size=block_size,
                                         request_rate=scenario.request_rate, arrival=scenario.arrival)
    out.parent.mkdir(parents=True, exist_ok=True)
    write_trace(result, out)
    click.echo(f"wrote {len(result.records)} requests to {out}")


@trace.command("import")
@click.argument("source", type=InputFile())
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path), required=True, help="JSONL file to write.")
@click.option("--format", "fmt", type=Choice(["auto", "kvroute", "azure", "burstgpt", "sharegpt", "vllm-bench"]),
              default="auto", show_default=True,
              help="Source format; auto: .csv by header (Azure/BurstGPT), .json by content (ShareGPT list / "
                   "vllm bench serve result), else JSONL.")
@click.option("--block-size", type=Number(BLOCK_SIZE), default=None,
              help="Block size of the source's hash_ids [512; ShareGPT 16].")
@click.option("--tokenizer", default=None,
              help="ShareGPT: count tokens with this Hugging Face tokenizer (needs transformers).")
@click.option("--chars-per-token", type=Number(Num(minimum=0.1, maximum=1000.0)), default=4.0, show_default=True,
              help="ShareGPT without --tokenizer: tokens estimated as ceil(characters / this).")
@check_values
@stops_on_sigterm
def import_(source, out, fmt, block_size, tokenizer, chars_per_token):
    """Convert a trace (Mooncake JSONL, Azure or BurstGPT CSV, ShareGPT conversations, vllm bench serve
    result) to kvroute's format, validating it."""
    from kvroute.traces.sharegpt import char_estimate, tokenizer_counter
    from kvroute.traces.writer import write_trace

    _check_out(out)
    try:
        if tokenizer is not None:
            count, note = tokenizer_counter(tokenizer), f"counted by tokenizer {tokenizer}"
        else:
            count, note = char_estimate(chars_per_token), f"estimated at {chars_per_token:g} characters per token"
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="'--tokenizer'" if tokenizer else "'--chars-per-token'") from None
    result = read_any_trace(source, block_size, fmt, count, note, param_hint="'SOURCE'")
    out.parent.mkdir(parents=True, exist_ok=True)
    write_trace(result, out)
    click.echo(f"wrote {len(result.records)} requests to {out}")
    for key, what in (("skipped_conversations", "conversation(s) without an answered user message skipped"),
                      ("repeated_ids", "conversation(s) whose id an earlier one has became session '<id>#<index>'")):
        if result.metadata.get(key):
            click.echo(f"note: {result.metadata[key]} {what}", err=True)


@trace.command()
@click.argument("source", type=InputFile())
@click.option("--block-size", type=Number(BLOCK_SIZE), default=None,
              help="Block size of the source's hash_ids [512; ShareGPT 16].")
@click.option("--json", "json_out", is_flag=True, help="Print JSON.")
@check_values
@stops_on_sigterm
def stats(source, block_size, json_out):
    """Print a trace's size, token and prefix-sharing figures."""
    from kvroute.traces.stats import format_stats, trace_stats

    figures = trace_stats(read_any_trace(source, block_size, param_hint="'SOURCE'"))
    click.echo(json.dumps(figures, indent=2, default=float) if json_out else format_stats(figures))
