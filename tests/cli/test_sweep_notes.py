"""The notes under a sweep's tables (``kvroute.cli.sweep_notes``): ``compare``'s failure, KV-turnover
and same-routing notes, naming the grid points they concern."""

import html
import json
import math

import pandas as pd
from click.testing import CliRunner

from kvroute.cli.main import cli
from kvroute.cli.sweep_notes import sweep_notes

ADVICE = " (a prompt must be shorter than max_model_len: raise --max-model-len or shorten the prompts)"
TOO_LONG = "This model's maximum context length is 2000 tokens. However, your prompt contains 3000 input tokens."


def _row(workers, policy, run_seed=0, failed=0, reason=None, evictions=0, digest="d", **counts):
    """A sweep row with what the notes read: 100 requests on workers of 50 blocks each (49 cacheable)."""
    return {"workers": workers, "policy": policy, "run_seed": run_seed, "status": "ok", "num_requests": 100,
            "failed": float(failed), "rejected": counts.get("rejected", failed), "not_sent": counts.get("not_sent", 0),
            "timed_out": counts.get("timed_out", 0), "failed_request": 7 if failed else math.nan,
            "failed_reason": reason if failed else None, "num_evictions": evictions,
            "cacheable_blocks": 49 * workers, "route_digest": f"{digest}{workers}"}


def test_notes_name_the_grid_points_of_each_failure_turnover_and_routing():
    rows = pd.DataFrame([
        _row(2, "round_robin", failed=5, reason=TOO_LONG, evictions=98 * 3, digest="same"),
        _row(2, "kv_aware", failed=5, reason=TOO_LONG, evictions=98 * 2, digest="same"),  # 2.0 and 3.0 times
        _row(4, "round_robin", failed=5, reason=TOO_LONG, evictions=196 * 1.5),
        _row(4, "kv_aware", evictions=195),  # 195 < the 196 blocks held: not turned over
        _row(8, "round_robin", failed=1, reason="timed out: no full reply 60 s after it was sent", rejected=0,
             timed_out=1),
        _row(8, "kv_aware", digest="other"),
    ])
    assert sweep_notes(rows) == [
        f"Note: 5 of 100 requests failed (one round of each grid point with workers=2 or with workers=4, "
        f"policy=round_robin); e.g. request 7: {TOO_LONG}{ADVICE}",
        "Note: 1 of 100 requests failed (one round of each grid point with workers=8, policy=round_robin); e.g. "
        "request 7: timed out: no full reply 60 s after it was sent",
        "Note: the KV cache turned over: per run (mean over rounds) the workers evicted 2.0 to 3.0 times the blocks "
        "they can cache in at workers=2 (vLLM keeps one block of each worker back); and 1.5 times at workers=4, "
        "policy=round_robin. Hit rates and TTFT then depend on KV memory (try --kv-blocks or --workers); --show "
        "num_evictions,cacheable_blocks tables both, and `kvroute compare --time-series` on a point draws each "
        "worker's KV use over time.",
        "Note: kv_aware routed every request to the worker round_robin chose at workers=2 or 4, in every round, so"
        " their rows differ in nothing but the name (`kvroute policies` gives each one's rule and "
        "thresholds).",
    ]


def test_points_alike_in_every_round_make_one_note_for_the_whole_grid():
    rows = pd.DataFrame([_row(w, p, run_seed=s, failed=50, reason=TOO_LONG) for w in (2, 4) for p in ("a", "b")
                         for s in (0, 1)])
    assert sweep_notes(rows) == [
        f"Warning: 100 of 200 requests (50 %) failed (the 2 rounds of each grid point), so the tables' latencies "
        f"there are of the 100 served only; e.g. request 7: {TOO_LONG}{ADVICE}",
        "Note: b routed every request to the worker a chose at every grid point, in every round, so their rows "
        "differ in nothing but the name (`kvroute policies` gives each one's rule and thresholds).",
    ]
    rows.loc[(rows["run_seed"] == 1) & (rows["policy"] == "b"), "route_digest"] = "moved"  # alike in round 0 only
    rows.loc[rows["policy"] == "a", "failed"] = 100.0  # a's requests all rejected; the other round-0 half not sent
    rows.loc[rows["policy"] == "a", ["rejected", "not_sent"]] = [50, 50]
    assert sweep_notes(rows) == [
        f"Warning: every request was rejected (the 2 rounds of each grid point with policy=a), so none was served "
        f"and the tables hold no latencies there: 100 rejected by the engine, e.g. request 7: {TOO_LONG}{ADVICE}; "
        "the other 100 were not sent, their parent request having been rejected",
        f"Warning: 100 of 200 requests (50 %) failed (the 2 rounds of each grid point with policy=b), so the tables' "
        f"latencies there are of the 100 served only; e.g. request 7: {TOO_LONG}{ADVICE}",
    ]


def _trace(path):
    """Six short requests, request 3's prompt 3,000 tokens: over a max_model_len of 2,000."""
    with open(path, "w") as fh:
        for i in range(6):
            n = 3000 if i == 3 else 600
            fh.write(json.dumps({"timestamp": 10.0 * i, "input_length": n, "output_length": 8,
                                 "hash_ids": list(range(i * 100, i * 100 + math.ceil(n / 512)))}) + "\n")
    return path


def test_sweep_prints_and_reports_the_failures_and_the_policies_that_routed_alike(tmp_path):
    out = tmp_path / "grid.parquet"
    result = CliRunner().invoke(cli, ["sweep", "--trace", str(_trace(tmp_path / "t.jsonl")), "--max-model-len",
                                      "2000,50000", "--workers", "1,2", "--policies", "round_robin,kv_aware",
                                      "--rounds", "2", "--no-progress", "--out", str(out)], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    failure = (f"Warning: 2 of 12 requests (17 %) failed (the 2 rounds of each grid point with max_model_len=2000), "
               f"so the tables' latencies there are of the 10 served only; e.g. request 3: {TOO_LONG}{ADVICE}")
    routing = ("Note: kv_aware routed every request to the worker round_robin chose at workers=1, in every round, so "
               "their rows differ in nothing but the name (`kvroute policies` gives each one's rule and thresholds).")
    notes = [line for line in result.output.splitlines() if line.startswith(("Note:", "Warning:"))]
    assert notes[:2] == [failure, routing]
    report = (tmp_path / "grid.report.html").read_text()
    assert html.escape(failure) in report and html.escape(routing) in report
    rows = pd.read_parquet(out)
    short = rows[rows["max_model_len"] == 2000]
    assert (short["failed"] == 1).all() and (short["rejected"] == 1).all() and (short["failed_request"] == 3).all()
    assert (short["failed_reason"] == TOO_LONG).all()
    assert rows[rows["max_model_len"] == 50000]["failed_request"].isna().all()


def test_sweep_names_the_points_where_the_kv_cache_turned_over(tmp_path):
    out = tmp_path / "grid.parquet"
    result = CliRunner().invoke(cli, ["sweep", "--chats", "8", "--turns", "3", "--workers", "1", "--kv-blocks",
                                      "300,100000", "--policies", "round_robin", "--rounds", "2", "--no-progress",
                                      "--out", str(out)], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    rows = pd.read_parquet(out)
    assert rows["cacheable_blocks"].tolist() == [299, 299, 99999, 99999]
    times = rows["num_evictions"].iloc[:2].mean() / 299
    assert times >= 1 and (rows["num_evictions"].iloc[2:] == 0).all()
    assert (f"Note: the KV cache turned over: per run (mean over rounds) the workers evicted {times:.1f} times the "
            "blocks they can cache in at kv_blocks=300 (vLLM keeps one block of each worker back). Hit rates and "
            "TTFT then depend on KV memory (try --kv-blocks or --workers); --show num_evictions,cacheable_blocks "
            "tables both, and `kvroute compare --time-series` on a point draws each worker's KV use over "
            "time.\n") in result.output


def _rate_row(rate, policy, peak, seed=0):
    """A run of 64 sessions at ``rate`` whose peak in flight was ``peak``."""
    return {**_row(2, policy, run_seed=seed, digest=f"{policy}{rate}"), "request_rate": rate, "num_sessions": 64,
            "peak_sessions": peak}


def test_rate_note_names_the_rates_from_which_every_session_was_in_flight():
    peaks = {"round_robin": {0.5: 30, 2: 64, 4: 64, 16: 64}, "kv_aware": {0.5: 20, 2: 64, 4: 63, 16: 64}}
    rows = pd.DataFrame([_rate_row(r, p, peaks[p][r], s) for r in (0.5, 2, 4, 16) for p in peaks for s in (0, 1)])
    # kv_aware's 2/s reached 64 but its 4/s did not: the rate still changed the concurrency there
    assert sweep_notes(rows) == [
        "Note: the request rate stopped raising the load at request_rate=2 or 4, policy=round_robin or with "
        "request_rate=16: every run there had all 64 sessions in flight at once (peak_sessions = num_sessions), so "
        "a higher rate only starts them sooner and adds no concurrency. To load the workers further, sweep --chats "
        "without --request-rate (every session at once; --plot-load draws it), e.g. --chats 64,128,256."]
    below = rows.assign(peak_sessions=rows["peak_sessions"].clip(upper=63))
    assert sweep_notes(below) == []  # the peak still rose with the rate
    one_rate = rows[rows["request_rate"] == 16]
    assert sweep_notes(one_rate) == []  # no rate swept


def test_sweep_plots_load_against_a_chats_list_and_reports_it(tmp_path):
    out = tmp_path / "grid.parquet"
    small = ["sweep", "--turns", "2", "--workers", "2", "--policies", "round_robin", "--rounds", "1",
             "--executor", "sequential", "--no-progress"]
    result = CliRunner().invoke(cli, [*small, "--chats", "2,4", "--plot-load", str(tmp_path / "c.png"),
                                      "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "c.png").stat().st_size > 10_000
    page = (tmp_path / "grid.report.html").read_text()
    assert "output throughput against the number of sessions" in page and page.count("data:image/png") == 1
    both = CliRunner().invoke(cli, [*small, "--chats", "2,4", "--request-rate", "1,2", "--plot-load",
                                    str(tmp_path / "b.png")])
    assert both.exit_code != 0
    assert ("Error: --plot-load: the rows sweep both request_rate and chats: hold one fixed (one --request-rate, "
            "or one --chats) to draw the load curve against the other") in both.output
