"""Tables (tabulate) and the /metrics parser (prometheus_client): the hand-written ones' output."""

from __future__ import annotations

import math

from kvroute.calibrate.live.client import MetricsSnapshot, parse_prometheus
from kvroute.sim.study.experiment import tabulate_rows


def test_table_layout_is_the_hand_written_one():
    rows = [["metric", "round_robin", "Δ vs round_robin"],
            ["TTFT mean (s)", "0.231 ± 0.008", "-1.7%"],
            ["preemptions", "0.000", ""]]
    assert tabulate_rows(rows).splitlines() == [
        "metric           round_robin  Δ vs round_robin",
        "-------------  -------------  ----------------",
        "TTFT mean (s)  0.231 ± 0.008             -1.7%",
        "preemptions            0.000",
    ]


PAGE = """# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 2.0
vllm:num_requests_running{engine="1",model_name="m"} 1.0
# TYPE vllm:prefix_cache_hits counter
vllm:prefix_cache_hits_total{engine="0",model_name="a \\"quoted\\" name"} 64.0
vllm:prefix_cache_hits_created{engine="0",model_name="a \\"quoted\\" name"} 1.7e+09
vllm:e2e_request_latency_seconds_bucket{engine="0",le="+Inf",model_name="m"} 3.0
"""


def test_prometheus_samples_names_labels_values():
    assert parse_prometheus(PAGE) == [
        ("vllm:num_requests_running", {"engine": "0", "model_name": "m"}, 2.0),
        ("vllm:num_requests_running", {"engine": "1", "model_name": "m"}, 1.0),
        ("vllm:prefix_cache_hits_total", {"engine": "0", "model_name": 'a "quoted" name'}, 64.0),
        ("vllm:prefix_cache_hits_created", {"engine": "0", "model_name": 'a "quoted" name'}, 1.7e9),
        ("vllm:e2e_request_latency_seconds_bucket", {"engine": "0", "le": "+Inf", "model_name": "m"}, 3.0),
    ]


def test_prometheus_malformed_lines_are_skipped_not_fatal():
    page = PAGE + "this is not { a sample\nvllm:num_preemptions_total NaN\n"
    samples = parse_prometheus(page)
    assert len(samples) == 6
    assert samples[-1][0] == "vllm:num_preemptions_total" and math.isnan(samples[-1][2])
    assert MetricsSnapshot.from_text(page).get("vllm:num_requests_running") == 3.0
