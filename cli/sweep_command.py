"""``kvroute sweep``: a grid of scenarios on a local process pool or a Dask cluster."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import click
import pandas as pd

from kvroute.cli.config import config_option
from kvroute.cli.scenario import executor_options, parse_policies, with_errors
from kvroute.cli.values import check_values
from kvroute.sim.inputs import MAX_TOKENS
from kvroute.sim.outputs import atomic_output, check_output
from kvroute.sim.metrics import SUMMARY_METRICS
from kvroute.sim.profile import load_profile
from kvroute.sim.sweep import (COUNTER_COLUMNS, WORKLOADS, Scenario, SweepInterrupted, grid, intervals,
                               sweep)
from kvroute.sim.metrics import ServiceClass
from kvroute.traces.arrivals import parse_arrival
from kvroute.traces.lengths import parse_dist

DEFAULT_SHOW = "time_to_complete_s,later_ttft_mean_s,later_ttft_p90_s,hit_rate"


def _split(text: str | None) -> list[str]:
    return [item.strip() for item in (text or "").split(",") if item.strip()]


def _ints(text: str | None, hint: str, minimum: int = 1) -> list[int] | None:
    """``"2,4,8"`` -> ``[2, 4, 8]``; None or empty -> None."""
    items = _split(text)
    if not items:
        return None
    try:
        values = [int(item) for item in items]
    except ValueError:
        raise click.BadParameter(f"expected comma-separated integers, got {text!r}", param_hint=hint) from None
    for value in values:
        if value < minimum:
            raise click.BadParameter(f"values must be >= {minimum}, got {value}", param_hint=hint)
    return values


def _dists(text: str | None, hint: str) -> list[float | str] | None:
    """``"0,uniform:0:2"`` -> ``[0.0, "uniform:0:2"]`` (fixed values as numbers, others as checked
    distribution texts); None or empty -> None."""
    items = _split(text)
    if not items:
        return None
    try:
        dists = [parse_dist(item, hint) for item in items]
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint=hint) from None
    return [d.params[0] if d.kind == "fixed" else d.text for d in dists]


def _rates(text: str | None) -> list[float] | None:
    """``"1,2,4"`` -> ``[1.0, 2.0, 4.0]`` sessions per second; None or empty -> None."""
    items = _split(text)
    if not items:
        return None
    try:
        values = [float(item) for item in items]
    except ValueError:
        raise click.BadParameter(f"expected comma-separated numbers, got {text!r}", param_hint="--request-rate") from None
    if not all(math.isfinite(v) and v > 0 for v in values):
        raise click.BadParameter(f"rates must be finite numbers > 0, got {text!r}", param_hint="--request-rate")
    return values


def _arrivals(text: str) -> list[str]:
    items = _split(text)
    try:
        for item in items:
            parse_arrival(item)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--arrival") from None
    return items


def _lengths(text: str | None, hint: str) -> list[int | tuple[int, int] | str] | None:
    """``"8000,8000-16000,lognormal:150:1"`` -> ``[8000, (8000, 16000), "lognormal:150:1"]``."""
    items = _split(text)
    if not items:
        return None
    out: list[int | tuple[int, int] | str] = []
    for item in items:
        if ":" in item:
            out.extend(_dists(item, hint))
            continue
        try:
            if "-" in item:
                low, high = (int(part) for part in item.split("-", 1))
                if not 0 <= low <= high:
                    raise ValueError
                out.append((low, high))
            else:
                out.append(int(item))
                if not 1 <= out[-1] <= MAX_TOKENS:
                    raise ValueError
        except ValueError:
            raise click.BadParameter(f"{item!r} is neither a token count nor a range LOW-HIGH", param_hint=hint) from None
    return out


def _choices(text: str, valid: tuple[str, ...] | list[str], hint: str) -> list[str]:
    names = _split(text)
    for name in names:
        if name not in valid:
            raise click.BadParameter(f"unknown name {name!r}; valid names: {', '.join(valid)}", param_hint=hint)
    if not names:
        raise click.BadParameter("give at least one value", param_hint=hint)
    return names


def _profiles(text: str) -> list[str]:
    names = _split(text)
    for name in names:
        try:
            load_profile(name)
        except (FileNotFoundError, ValueError) as exc:
            raise click.BadParameter(str(exc), param_hint="--profile") from exc
    if not names:
        raise click.BadParameter("give at least one profile", param_hint="--profile")
    return names


def pivot_table(frame: pd.DataFrame, metric: str) -> str:
    """``metric``'s mean ± 95% half-width over rounds: a row per scenario, a column per policy."""
    iv = intervals(frame, [metric])
    by = [c for c in iv.columns if c not in ("rounds", metric, f"{metric}_low", f"{metric}_high")]
    values = iv[metric].dropna()
    integral = len(values) > 0 and bool((values == values.round()).all())
    digits = 0 if integral else 3 if values.abs().max() < 10 else 1

    def cell(row) -> str:
        if math.isnan(row[metric]):
            return "-"
        mean, low, high = row[metric], row[f"{metric}_low"], row[f"{metric}_high"]
        if row["rounds"] > 1 and not math.isclose(mean - low, high - mean, rel_tol=1e-9, abs_tol=1e-12):
            return f"{mean:.{digits}f} [{low:.{digits}f}, {high:.{digits}f}]"  # clipped to possible values
        if row["rounds"] > 1:
            return f"{mean:.{digits}f} ± {high - mean:.{digits}f}"
        return f"{mean:.{digits}f}"

    iv["cell"] = iv.apply(cell, axis=1)
    index = [c for c in by if c != "policy"]
    if "policy" in by and index:
        table = iv.pivot(index=index, columns="policy", values="cell")[list(dict.fromkeys(iv["policy"]))]
        table.columns.name = None
    elif "policy" in by:
        table = iv.set_index("policy")[["cell"]].T
        table.index = [""]
    elif index:
        table = iv.set_index(index)[["cell"]]
    else:
        table = iv[["cell"]]
        table.index = [""]
    table = table.rename(columns={"cell": metric})
    label = SUMMARY_METRICS.get(metric) or COUNTER_COLUMNS.get(metric, metric)
    return f"{label}\n{table.to_string()}"


@click.command("sweep")
@click.option("--workload", "workloads", default="seed-chat", show_default=True,
              help=f"Comma-separated workloads: {', '.join(WORKLOADS)}.")
@click.option("--chats", default="64", show_default=True, help="Chats or agent sessions, comma list.")
@click.option("--turns", default="6", show_default=True, help="Turns per chat, comma list.")
@click.option("--history", default=None,
              help="Agent prompt tokens, comma list of H (meaning H/2-H) or LOW-HIGH ranges [8000-32000].")
@click.option("--reply", default=None,
              help="Where replies stop, tokens: comma list of N, LOW-HIGH ranges or distributions "
                   "(lognormal:MEDIAN:CV, ...) [seed-chat: the fitted default, agent 50-300].")
@click.option("--max-tokens", default=None, help="Reply limit, comma list [seed-chat 128, agent none].")
@click.option("--user-tokens", default=None,
              help="User-message tokens (seed-chat) or new tokens per turn (agent), comma list of distributions.")
@click.option("--think-time", default="0", show_default=True,
              help="Seconds between turns, comma list of numbers or distributions.")
@click.option("--start", default="0", show_default=True,
              help="Seed-chat: each chat's first send, s, comma list of numbers or distributions.")
@click.option("--request-rate", default=None,
              help="Load: sessions started per second, comma list (e.g. 1,2,4,8) [all at once].")
@click.option("--arrival", default="poisson", show_default=True,
              help="Arrival process of --request-rate, comma list: poisson, gamma:CV, constant.")
@click.option("--profile", "profiles", default="a6000-qwen2.5-7b", show_default=True,
              help="Shipped profile names or profile JSON files, comma list.")
@click.option("--workers", default="4", show_default=True, help="vLLM workers, comma list.")
@click.option("--gpus", default=None, help="GPUs, comma list (fewer than workers means sharing) [one per worker].")
@click.option("--policies", default="round_robin,least_loaded,kv_aware", show_default=True,
              help="Routing policies, comma list.")
@click.option("--kv-blocks", default=None, help="Override of each worker's KV blocks, comma list [the profile's].")
@click.option("--arrival-spread", type=float, default=0.005, show_default=True,
              help="Uniform start jitter of root requests, s.")
@click.option("--seeds", default="0", show_default=True,
              help="Base seeds, comma list (round r uses seed + r; agent traces are drawn from the seed).")
@click.option("--rounds", type=int, default=3, show_default=True, help="Seeded rounds per scenario.")
@click.option("--slo-ttft", type=float, default=2.0, show_default=True, help="Goodput bound on TTFT, s.")
@click.option("--slo-tpot", type=float, default=0.1, show_default=True, help="Goodput bound on TPOT, s.")
@executor_options
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Write every row to FILE.parquet or FILE.csv.")
@click.option("--plot-load", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="With --request-rate: write a PNG of goodput, TTFT p50/p90 and throughput against load per policy.")
@click.option("--show", default=DEFAULT_SHOW, show_default=True, help="Metrics to print, comma list.")
@click.option("--no-progress", "--quiet", "no_progress", is_flag=True, help="Hide the progress bar.")
@config_option
@check_values
@with_errors
def sweep_command(workloads, chats, turns, history, reply, max_tokens, user_tokens, think_time, start, request_rate,
                  arrival, profiles, workers, gpus, policies,
                  kv_blocks, arrival_spread, seeds, rounds, slo_ttft, slo_tpot, executor, address, max_workers,
                  out, plot_load, show, no_progress):
    """Run a grid of scenarios (every combination of the comma lists) and print pivot tables.

    Example: kvroute sweep --workload agent --workers 2,4,8 --policies round_robin,kv_aware
    --history 8000,16000 --reply 64,128 --chats 32 --rounds 3 --out sweep.parquet
    """
    if plot_load is not None and not request_rate:
        raise click.UsageError("--plot-load draws against --request-rate: give --request-rate 1,2,4,...")
    valid_metrics = [*SUMMARY_METRICS, *COUNTER_COLUMNS]
    shown = _choices(show, valid_metrics, "--show")
    if out is not None and out.suffix.lower() not in (".parquet", ".csv"):
        raise click.BadParameter(f"{out} must end in .parquet or .csv", param_hint="--out")
    if address is not None:
        executor = "dask"
    axes = {
        "workload": _choices(workloads, WORKLOADS, "--workload"),
        "chats": _ints(chats, "--chats"),
        "turns": _ints(turns, "--turns"),
        "history": _lengths(history, "--history"),
        "reply": _lengths(reply, "--reply"),
        "max_tokens": _ints(max_tokens, "--max-tokens"),
        "user": _dists(user_tokens, "--user-tokens"),
        "think_time_s": _dists(think_time, "--think-time"),
        "start_s": _dists(start, "--start"),
        "request_rate": _rates(request_rate),
        "arrival": _arrivals(arrival),
        "profile": _profiles(profiles),
        "workers": _ints(workers, "--workers"),
        "gpus": _ints(gpus, "--gpus"),
        "policy": parse_policies(policies),
        "kv_blocks": _ints(kv_blocks, "--kv-blocks", minimum=2),
        "seed": _ints(seeds, "--seeds", minimum=0),
    }
    if axes["history"] is not None and "seed-chat" in axes["workload"]:
        raise click.BadParameter("applies to --workload agent only", param_hint="--history")
    scenarios = grid(Scenario(arrival_spread_s=arrival_spread), **{k: v for k, v in axes.items() if v is not None})
    if out is not None:  # before the work: about 1 KB per row
        check_output(out, 1024 * len(scenarios) * rounds)
    click.echo(f"{len(scenarios)} scenario(s) x {rounds} round(s) on executor {executor}", err=True)
    try:
        frame = sweep(scenarios, rounds=rounds, executor=executor, address=address, max_workers=max_workers,
                      progress=not no_progress, slo=ServiceClass(slo_ttft, slo_tpot))
    except SweepInterrupted as stop:
        click.echo(f"\ninterrupted ({stop.signal_name}): {len(stop.frame)} of {stop.total} runs finished",
                   err=True)
        if out is not None and len(stop.frame):
            _write_rows(stop.frame, out)
            click.echo(f"wrote {len(stop.frame)} finished rows to {out} (column partial = true)", err=True)
        sys.exit(130)
    failed = frame[frame["status"] == "failed"] if "status" in frame else frame.iloc[:0]
    if len(failed):
        click.echo(f"{len(failed)} of {len(frame)} runs failed (infeasible; shown as -, reason in column error): "
                   f"{failed['error'].iloc[0]}", err=True)
    for metric in shown:
        click.echo(pivot_table(frame, metric) + "\n")
    click.echo(f"{rounds} round(s) per scenario; ± is the 95% interval over rounds; "
               f"goodput at TTFT <= {slo_ttft} s and TPOT <= {slo_tpot} s.")
    if out is not None:
        _write_rows(frame, out)
        _write_provenance(out, axes, rounds)
        click.echo(f"wrote {len(frame)} rows to {out} and its scenario to {out.stem}.scenario.yaml", err=True)
    if plot_load is not None:
        from kvroute.sim.plots import plot_load_curve

        plot_load.parent.mkdir(parents=True, exist_ok=True)
        plot_load_curve(frame, plot_load, title=f"{len(scenarios)} scenario(s) x {rounds} round(s)")
        click.echo(f"wrote {plot_load}", err=True)


def _write_provenance(out: Path, axes: dict, rounds: int) -> None:
    """``<out stem>.scenario.yaml`` beside the rows: resolved options, seeds, version, profile hashes.

    Every grid point generates its own workload per seed, so no single trace hash applies; the
    rows' ``seed`` and options name each one, and ``kvroute trace generate`` writes it out.
    """
    from kvroute.cli.provenance import canonical_sha256, write_scenario

    profiles = {name: canonical_sha256(load_profile(name).raw) for name in axes["profile"]}
    seeds = sorted({s + r for s in (axes["seed"] or [0]) for r in range(rounds)})
    write_scenario(out.parent, click.get_current_context(), {
        "seeds": seeds, "rounds": rounds, "profile_sha256": profiles,
        "trace": "generated per grid point and seed (no trace file)",
    }, name=f"{out.stem}.scenario.yaml")


def _write_rows(frame: pd.DataFrame, out: Path) -> None:
    """Write sweep rows to ``out`` (.parquet or .csv) atomically."""
    table = frame.copy()
    for column in ("reply", "history", "think_time_s", "user", "start_s"):
        # numbers mixed with ranges or distributions: store as text
        if table[column].map(lambda v: isinstance(v, (str, tuple, list))).any():
            table[column] = table[column].map(lambda v: None if v is None else str(v))
    with atomic_output(out) as tmp:
        if out.suffix.lower() == ".parquet":
            table.to_parquet(tmp, index=False)
        else:
            table.to_csv(tmp, index=False)
