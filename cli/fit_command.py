"""Command line: ``kvroute calibrate fit``, a profile fitted to one or more measured sweeps.

Registered on the ``kvroute calibrate`` group by :mod:`kvroute.cli.calibrate_commands`; heavy
imports stay inside the command. The fit itself is :mod:`kvroute.calibrate.calibration.fit`.
"""

from __future__ import annotations

import json
from pathlib import Path

import click

from kvroute.cli.signals import stops_on_sigterm
from kvroute.cli.values import Choice, Number, check_values
from kvroute.traces.inputs import MAX_RUNS, SECONDS, SEED, Num
from kvroute.traces.outputs import atomic_output, check_output, write_text_atomic


FIT_VALUES = {
    "api_server_count": Num(integer=True, minimum=1, maximum=1024),
    "client_busy": Num(minimum=0.0, maximum=1024.0),  # processes
    "api_contention": Num(minimum=0.0, maximum=100.0),
    "client_core": Num(integer=True, minimum=-1, maximum=65535),
}
"""Rules of ``kvroute calibrate fit``'s host-model options."""


def _prefill_step_s(cost, info):
    """``step_s(prompt_len, cached)``: the fitted time of the last step of one prefill alone (its
    last chunk of at most ``max_num_batched_tokens`` new tokens), s."""
    from kvroute.sim.engine.scheduler_output import prefill_pairs

    budget = info.max_num_batched_tokens

    def step_s(prompt_len: int, cached: int) -> float:
        new = max(1, prompt_len - cached)
        last = new - budget * ((new - 1) // budget)
        return cost.step_time(last, 1, prefill_pairs(prompt_len - last, last), 0)

    return step_s


def left_out_summary(notes: list[str], meta: dict) -> str:
    """What the fit left out, counted by reason (numbers in a reason count as one), and whether
    the sweep says it was interrupted, e.g. ``"left out: 12 x request failed or sent no
    token, 3 x a stream had fewer than N tokens; meta.json status 'complete'"``."""
    import collections
    import re

    reasons = collections.Counter()
    for note in notes:
        head, sep, rest = note.partition("): ") if note.startswith("exp ") and "): " in note else note.partition(": ")
        text = (rest if sep and note.startswith("exp ") else note).split("; left out")[0]
        reasons[re.sub(r"\d+(\.\d+)?", "N", text).strip()] += 1
    left = (", ".join(f"{n} x {reason}" for reason, n in reasons.most_common())
            if reasons else "none")
    status = meta.get("status")
    said = (f"the sweep was interrupted (meta.json status {status!r})" if status == "interrupted"
            else f"meta.json status {status!r}" if status else "meta.json gives no status")
    return f"left out: {left}; {said}"


FIGURE_FORMATS = ("png", "pdf", "svg")
"""``kvroute.sim.study.figure_style.FIGURE_FORMATS`` (repeated so the calibrate commands' help
imports no numpy; ``tests/sim/study/test_more_figures.py`` checks they agree)."""


def _figure_formats(ctx, param, value):
    """``--figure-format``: ``figure_style.parse_figure_formats`` (one line naming the flag)."""
    from kvroute.sim.study.figure_style import parse_figure_formats

    try:
        return parse_figure_formats(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc), ctx=ctx, param=param) from None


@click.command("fit")
@click.argument("run_dirs", metavar="RUN_DIR...", nargs=-1, required=True,
                type=click.Path(exists=True, file_okay=False))
@click.option("--out", "out_path", default=None, type=click.Path(dir_okay=False),
              help="Profile JSON to write, with <stem>.fit.png and <stem>.fit_points.csv beside it (the profile "
                   "alone with --base-profile); RUN_DIR is then left untouched (default RUN_DIR/profile.json and "
                   "RUN_DIR/fit_points.csv; required with several RUN_DIRs).")
@click.option("--name", default=None, help="Profile name (default: the output file's stem).")
@click.option("--report", default=None, type=click.Path(dir_okay=False),
              help="The fit's figure: .png, .pdf or .svg (default: beside the profile, <stem>.fit.png); "
                   "--figure-format adds the other formats beside it.")
@click.option("--figure-format", "figure_formats", default="png", show_default=True, callback=_figure_formats,
              help="Formats of the fit's figure, comma list of png, pdf, svg (vector for papers).")
@click.option("--holdout", type=Number(Num(minimum=0.0, maximum=1.0, below=True)), default=0.25, show_default=True, help="Share of experiments held out.")
@click.option("--seed", type=Number(SEED), default=0, show_default=True, help="Seed of the hold-out split.")
@click.option("--overhead", type=Choice(["auto", "metrics", "fit"]), default="auto", show_default=True,
              help="API-server time from the server's /metrics or fitted.")
@click.option("--loss", type=Choice(["linear", "soft_l1", "huber", "cauchy"]), default="soft_l1",
              show_default=True, help="linear: NNLS; else a robust least_squares refinement.")
@click.option("--itl-source", type=Choice(["auto", "engine", "stream"]), default="auto", show_default=True,
              help="Decode and mixed step times from the server's histograms or the client's streams.")
@click.option("--per-token-overhead/--no-per-token-overhead", default=True, show_default=True,
              help="Fit the per-prompt-token part of the API-server time.")
@click.option("--folds", type=Number(Num(integer=True, minimum=0, maximum=1000)), default=4, show_default=True, help="Cross-validation folds (0: none).")
@click.option("--bootstrap", type=Number(Num(integer=True, minimum=0, maximum=MAX_RUNS)), default=100, show_default=True,
              help="Refits on resampled configurations, kept in the profile as the coefficients' uncertainty (0: none).")
@click.option("--bursts/--no-bursts", default=True, show_default=True,
              help="Fit the front-end queue and host-contention terms to the sweep's bursts, if it has any.")
@click.option("--api-server-count", type=Number(FIT_VALUES["api_server_count"]), default=1, show_default=True,
              help="API processes per server during the sweep (vLLM --api-server-count).")
@click.option("--client-busy", type=Number(FIT_VALUES["client_busy"]), default=1.0, show_default=True,
              help="Processes of the measuring client on the servers' host, busy while responses stream "
                   "(1; 0 when it ran elsewhere).")
@click.option("--engine-spin", type=Number(SECONDS), default=1.0, show_default=True,
              help="Seconds an engine's core stays busy after its last step (vLLM's shared-memory queue "
                   "busy-polls for 1 s; 0: busy only while it has work).")
@click.option("--stream-baseline/--no-stream-baseline", default=True, show_default=True,
              help="Count the API processes and the client, which streamed while the decode steps were timed, in "
                   "those steps' contention baseline (host.baseline_stream_busy); off: engines only, as before.")
@click.option("--api-cores", type=Choice(["spare", "own"]), default="spare", show_default=True,
              help="Where the sweep's servers ran their API processes (kvroute serve --api-cores): own: each on its "
                   "engine's core, so the host model counts load per core (host.api_on_engine_core) and the API "
                   "process's work beside a busy engine takes twice as long (host.api_contention 1); spare: the "
                   "whole host's load stretches every engine.")
@click.option("--api-contention", type=Number(FIT_VALUES["api_contention"]), default=1.0, show_default=True,
              help="With --api-cores own: how much longer the API process's work takes while its engine, on the "
                   "same core, has requests (host.api_contention; 1: fair sharing of the core, 0: not at all). "
                   "Stated, not fitted: closed-loop TTFT under kv-aware routing depends strongly on it "
                   "(docs/design/timing-and-host-model.md).")
@click.option("--front-end-split/--no-front-end-split", default=True, show_default=True,
              help="When the sweep timed its requests in the engine (measure --kv-events), put the part of the "
                   "unloaded front end that comes after the engine's step after it (overheads.post_engine_s); off: "
                   "keep all of the front end before the engine, as for a sweep without events.")
@click.option("--base-profile", default=None,
              help="Keep this profile's step costs and overheads (shipped name or JSON file) and fit only the "
                   "burst terms to RUN_DIR (e.g. a sweep of bursts alone).")
@click.option("--client-core", "client_core", type=Number(FIT_VALUES["client_core"]), default=-1, show_default=True,
              help="With --api-cores own: the server (0, 1, ...: server i of kvroute serve runs on core i, unless "
                   "another serve's engines held cores then: serve prints each server's core) whose "
                   "core the measuring client was pinned to (calibrate measure --client-cores): the client's load "
                   "then slows that server's steps alone (host.client_core). -1: the client floated.")
@check_values(rules={**FIT_VALUES, "engine_spin": SECONDS})
@stops_on_sigterm
def fit_cmd(run_dirs, out_path, name, report, holdout, seed, overhead, loss, itl_source, per_token_overhead, folds,
            bootstrap, bursts, api_server_count, client_busy, engine_spin, stream_baseline, api_cores, api_contention,
            client_core, front_end_split, base_profile, figure_formats=("png",)):
    """Fit the step-cost model to a sweep in RUN_DIR and write a profile JSON and the fit's figure.

    Several RUN_DIRs (sweeps of the same servers, taken one after another) are pooled into one
    fit: each sweep's scatter from the host's load of the moment then weighs less."""
    from kvroute.calibrate.calibration.engine_split import (alone, apply_post_engine, correct_sweep_stamps, describe,
                                                            post_engine_time)
    from kvroute.calibrate.calibration.step_end import StampCorrection
    from kvroute.calibrate.calibration.fit import cap_admission, fit, plot_report, profile_document
    from kvroute.calibrate.calibration.observations import (build_observations, engine_config, load_sweeps,
                                                            observations_frame)
    from kvroute.sim.timing.profile import load_profile, profile_from_dict
    from kvroute.sim.timing.vllm_versions import kv_event_stamp

    if report is not None and Path(report).suffix.lower().lstrip(".") not in FIGURE_FORMATS:
        raise click.BadParameter(f"{report} must end in {', '.join('.' + f for f in FIGURE_FORMATS)}",
                                 param_hint="'--report'")
    if len(run_dirs) > 1 and out_path is None:
        raise click.UsageError("several RUN_DIRs: give --out (the profile is not written into one of them)")
    if client_core >= 0 and api_cores != "own":
        raise click.BadParameter("needs --api-cores own (the client shares a server's core only where each "
                                 "server's processes keep to their own core)", param_hint="'--client-core'")
    run_dir = run_dirs[0] if len(run_dirs) == 1 else " + ".join(run_dirs)
    try:
        meta, servers, req, exp = load_sweeps(run_dirs)
    except (FileNotFoundError, ValueError) as exc:
        raise click.ClickException(str(exc))
    if not servers:
        raise click.ClickException(f"{run_dirs[0]}/meta.json names no server")
    if client_core >= len(meta.get("urls") or servers):
        raise click.BadParameter(f"server {client_core} of a sweep of {len(meta.get('urls') or servers)} server(s) "
                                 "(0, 1, ...)", param_hint="'--client-core'")
    info = servers[0]
    out = Path(out_path) if out_path else Path(run_dir) / "profile.json"
    # before the work: the profile, the fit's figures and its points (tens of kB to a few MB)
    check_output(out, 4 << 20, "--out" if out_path else "RUN_DIR")
    if report is not None:
        check_output(report, 1 << 20, "--report")
    stamp = kv_event_stamp(info.vllm_version, info.async_scheduling)
    if base_profile is not None:
        _refuse_fit_options_with_a_base_profile()
        _fit_bursts_only(base_profile, run_dir, out, name or out.stem, meta, req, exp, api_server_count, client_busy,
                         engine_spin, stream_baseline, api_cores == "own", api_contention, client_core, stamp, info)
        return
    try:
        obs, notes = build_observations(req, exp, engine_config(info), itl_source)
    except KeyError as exc:  # a column build_observations reads but does not list as needed
        raise click.ClickException(f"{req.attrs.get('source', run_dir)}: lacks the column {exc} (calibrate measure writes it)")
    for n in notes[:8]:
        click.echo(f"note: {n}", err=True)
    if len(notes) > 8:
        click.echo(f"note: ... {len(notes) - 8} more left out", err=True)
    try:
        result = fit(obs, holdout, seed, overhead, loss, per_token_overhead, folds, bootstrap)
    except ValueError as exc:
        raise click.ClickException(f"{run_dir}: {exc}; {left_out_summary(notes, meta)}")
    name = name or out.stem
    doc = profile_document(result, info, meta, name, _model_doc(info.model_root))
    step_s = _prefill_step_s(result.cost, info)
    split = correction = None
    if front_end_split:  # KV-event stamps moved to each request's prefill step end first (step_end)
        rows, how = correct_sweep_stamps(req, stamp, step_s)
        split = post_engine_time(rows)
        correction = StampCorrection.of(stamp, how[alone(rows)]) if how is not None else None
    if split is not None:
        apply_post_engine(doc, split, stamp, correction)
    # after the front-end split took the part after the engine out, before the bursts' fit loads the
    # document as a profile (which refuses an admission above its API-server term)
    cap_admission(doc["overheads"])
    burst_text = (_fit_bursts(doc, meta, req, exp, api_server_count, client_busy, engine_spin, stream_baseline,
                              api_cores == "own", api_contention, client_core, stamp, step_s) if bursts else None)
    try:  # the simulator must accept what is written: checked before writing it
        profile_from_dict(json.loads(json.dumps(doc)), str(out))
    except ValueError as exc:
        raise click.ClickException(f"the fit of {run_dir} gives no valid profile, so nothing is written: {exc}")
    out.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(out, json.dumps(doc, indent=2) + "\n")
    load_profile(out)
    png = Path(report) if report else out.with_name(f"{out.stem}.fit.{figure_formats[0]}")
    figures = plot_report(result, png, f"profile {name}: {info.model} on {info.hardware}, vLLM {info.vllm_version}",
                          figure_formats)
    frame = observations_frame(obs)
    frame["predicted_s"] = result.predicted_s
    frame["held_out"] = result.held_out
    # NOTE: with --out, everything goes under it and RUN_DIR (measurements) is left untouched.
    points = Path(run_dir) / "fit_points.csv" if out_path is None else out.with_name(out.stem + ".fit_points.csv")
    with atomic_output(points) as tmp:
        frame.to_csv(tmp, index=False)
    click.echo("one request at a time:\n" + result.summary() + "\n"
               + (describe(split, doc["overheads"], correction) if front_end_split
                  else "front end: all of it before the engine (--no-front-end-split)"))
    if burst_text:
        click.echo(burst_text)
    click.echo(f"profile {out}\nreport  {', '.join(str(path) for path in figures)}\npoints  {points}")


BASE_PROFILE_KEEPS = ("report", "figure_formats", "holdout", "seed", "overhead", "loss", "itl_source",
                      "per_token_overhead", "folds", "bootstrap", "bursts", "front_end_split")
"""``calibrate fit``'s options of the step-cost fit and its outputs, which ``--base-profile``
(the base's step costs kept, the burst terms alone fitted) has no use for."""


def _refuse_fit_options_with_a_base_profile() -> None:
    """Refuse, naming it, an option of :data:`BASE_PROFILE_KEEPS` given with ``--base-profile``.

    Raises:
        click.UsageError: one line naming the first such option given.
    """
    from click.core import ParameterSource

    ctx = click.get_current_context()
    for param in ctx.command.params:
        if param.name in BASE_PROFILE_KEEPS and ctx.get_parameter_source(param.name) not in (
                ParameterSource.DEFAULT, None):
            raise click.UsageError(f"{'/'.join(param.opts + param.secondary_opts)} does not apply with "
                                   "--base-profile, which keeps the base's step costs and fits the burst terms "
                                   "alone (and writes no figure)")


def _fit_bursts_only(base: str, run_dir, out: Path, name: str, meta: dict, req, exp, api_server_count: int,
                     client_busy: float, engine_spin: float, stream_baseline: bool = True,
                     own_cores: bool = False, api_contention: float = 1.0, client_core: int = -1,
                     stamp: str = "step_end", info=None) -> None:
    """Write ``base`` (its step costs and overheads) with burst terms fitted to RUN_DIR as ``name``;
    ``info`` (the sweep's first server) gives the token budget of the prefill step ends that the
    KV-event stamps of requests sent alone are moved to (:func:`_prefill_step_s` of the base's
    step costs).

    Raises:
        click.BadParameter: ``base`` is no profile.
        click.ClickException: RUN_DIR holds no bursts, or the profile made is not valid (nothing
            is written).
    """
    import copy

    from kvroute.sim.timing.profile import load_profile, profile_from_dict

    try:
        profile = load_profile(base)
    except (FileNotFoundError, ValueError) as exc:
        raise click.BadParameter(str(exc), param_hint="'--base-profile'") from exc
    doc = copy.deepcopy(profile.raw)
    doc["name"] = name
    doc.setdefault("provenance", {}).setdefault("fit", {})
    doc.setdefault("sources", {})
    doc["provenance"]["base_profile"] = (f"step costs and overheads of {base} ({doc['provenance'].get('date', '?')}); "
                                         f"front-end and host terms fitted to the bursts in {run_dir} "
                                         f"({meta.get('started')} - {meta.get('finished')})")
    step_s = _prefill_step_s(profile.step_cost, info) if info is not None else None
    text = _fit_bursts(doc, meta, req, exp, api_server_count, client_busy, engine_spin, stream_baseline, own_cores,
                       api_contention, client_core, stamp, step_s)
    if text is None:
        raise click.ClickException(f"{run_dir} holds no bursts to fit")
    try:  # the simulator must accept what is written: checked before writing it
        profile_from_dict(json.loads(json.dumps(doc)), str(out))
    except ValueError as exc:
        raise click.ClickException(f"the burst fit of {run_dir} gives no valid profile, so nothing is written: {exc}")
    out.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(out, json.dumps(doc, indent=2) + "\n")
    load_profile(out)
    click.echo(f"one request at a time: kept from {base}\n{text}\nprofile {out}")


def _fit_bursts(doc: dict, meta: dict, req, exp, api_server_count: int, client_busy: float = 1.0,
                engine_spin: float = 1.0, stream_baseline: bool = True, own_cores: bool = False,
                api_contention: float = 1.0, client_core: int = -1, stamp: str = "step_end",
                step_s=None) -> str | None:
    """Add the front-end and host sections fitted to the sweep's bursts to ``doc``; returns the
    report text, or None when the sweep has no bursts. ``own_cores``: the servers ran their API
    processes on their engines' cores (``HostModel.api_on_engine_core``), whose work then takes
    ``1 + api_contention`` times as long beside a busy engine (``HostModel.api_contention``), and
    ``client_core`` names the server whose core the client shared (``HostModel.client_core``).
    ``stamp``: what the servers' KV-event stamps mark, moved to each request's prefill step end
    (``engine_split.correct_sweep_stamps``, with ``step_s`` for requests alone) before the
    bursts' ``engine_first_s`` is read; the counts go into ``provenance.fit.bursts``."""
    import math
    import os
    from dataclasses import replace

    from kvroute.calibrate.calibration.bursts import BURST_KINDS, fit_frontend, load_bursts, profile_sections
    from kvroute.calibrate.calibration.engine_split import correct_sweep_stamps
    from kvroute.calibrate.calibration.speed import fit_speed
    from kvroute.calibrate.calibration.step_end import StampCorrection
    from kvroute.sim.timing.profile import profile_from_dict

    # the bursts' engine_first_s reads each request's prefill step end: early KV-event stamps moved first
    req, how = correct_sweep_stamps(req, stamp, step_s)
    found, notes = load_bursts(req, exp)
    for n in notes[:4]:
        click.echo(f"note: {n}", err=True)
    if not found:
        return None
    host = meta.get("client_host") or {}
    servers = float(len(meta.get("urls") or [1]))
    # NOTE: the decode steps were timed while every server's API process streamed and the client
    # read: they count in those steps' baseline (HostModel.baseline_stream_busy).
    ff = fit_frontend(found, profile_from_dict(doc), int(host.get("cores") or os.cpu_count() or 1), servers,
                      api_server_count, client_busy=client_busy, engine_spin_s=engine_spin, refine_evals=40,
                      baseline_stream_busy=servers + client_busy if stream_baseline else 0.0,
                      api_on_engine_core=own_cores, api_contention=api_contention if own_cores else 0.0,
                      client_core=client_core)
    speed = fit_speed(req)
    if speed is not None:
        ff = replace(ff, host=replace(ff.host, engine_speed_sigma=speed.sigma, engine_speed_period_s=speed.period_s))
    sections = profile_sections(ff)
    doc["frontend"], doc["host"] = sections["frontend"], sections["host"]
    doc["provenance"]["fit"]["bursts"] = sections["burst_fit"]
    if how is not None:
        in_bursts = (req["kind"].isin(BURST_KINDS) & (req["role"] == "burst")).to_numpy(bool)
        doc["provenance"]["fit"]["bursts"]["kv_event_stamp_correction"] = StampCorrection.of(
            stamp, how[in_bursts]).to_dict()
    _add_burst_notes(doc, ff)
    text = ff.summary()
    if speed is not None:
        lo, hi = speed.interval_s
        doc["provenance"]["fit"]["bursts"]["engine_speed_period_interval_s"] = [lo, hi if hi != math.inf else None]
        doc["provenance"]["fit"]["bursts"]["engine_speed_method"] = speed.method
        if speed.method == "windows":
            doc["provenance"]["fit"]["bursts"]["engine_speed_client_lag_s"] = round(speed.lag_s, 6)
        shown = f"{lo:.3g}-{hi:.3g} s" if hi != math.inf else f"{lo:.3g} s to one factor per run"
        text += (f"\nengine-speed period: the bursts allow {shown} (likelihood-ratio interval); closed-loop TTFT "
                 "under kv-aware routing depends on it: compare predictions across that range")
    # NOTE: a base profile's own burst terms are replaced whole, their sources with them
    doc["sources"] = {k: v for k, v in doc["sources"].items() if not k.startswith(("frontend", "host."))}
    doc["sources"].update(sections["sources"])
    if host.get("loadavg_start") is not None:
        doc["provenance"]["client_host_loadavg"] = {k: host.get(k) for k in ("loadavg_start", "loadavg_end")}
    return text


def _add_burst_notes(doc: dict, ff) -> None:
    """The burst fit's terms at a bound and its repeated bursts that scatter, added to the
    profile's ``fit_notes`` (``kvroute.calibrate.calibration.walls``; a base profile's own burst
    notes replaced)."""
    notes = doc.setdefault("fit_notes", {})
    kept = [w for w in notes.get("at_bound", []) if not str(w.get("term", "")).startswith(("host.", "frontend."))]
    notes["at_bound"] = kept + [w.to_dict() for w in ff.walls]
    notes["burst_scatter"] = [s.to_dict() for s in ff.scatter[:20]]
    notes["num_burst_scattered"] = len(ff.scatter)


def _model_doc(root: str) -> dict:
    """Shapes from a local model directory's config.json, if there is one."""
    cfg = Path(root) / "config.json"
    if not cfg.is_file():
        return {}
    try:
        c = json.loads(cfg.read_text())
    except (OSError, ValueError):
        return {}
    keys = {"num_hidden_layers": "num_layers", "hidden_size": "hidden_size", "num_attention_heads": "num_attention_heads",
            "num_key_value_heads": "num_kv_heads", "intermediate_size": "intermediate_size", "vocab_size": "vocab_size",
            "torch_dtype": "dtype", "dtype": "dtype", "architectures": "architectures"}
    return {v: c[k] for k, v in keys.items() if k in c}
