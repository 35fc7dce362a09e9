"""A run's predictions as a ``vllm bench serve --save-result --save-detailed`` result JSON.

Dashboards and scripts built on ``vllm bench serve`` read its result file; writing a simulated
run in the same shape lets them show predictions beside measurements. Field names and
definitions follow vLLM 0.32's ``vllm/benchmarks/serve.py``: the setup keys of ``main()``
(``date``, ``endpoint_type``, ``backend``, ``label``, ``model_id``, ``tokenizer_id``,
``num_prompts``, ``request_rate``, ``burstiness``, ``max_concurrency``), ``benchmark()``'s
``result`` dict (``duration`` ... ``rtfx``) and ``process_one_metric``'s
``mean_/median_/std_/p<P>_<metric>_ms`` keys; ``calculate_metrics`` gives the rules: TPOT per
request ``(latency - ttft) / (output_len - 1)`` when ``output_len > 1`` (0 for goodput
otherwise); ITL pooled over every gap of the successful requests; a failed request has output
length 0 and is left out of the latency statistics; ``max_concurrent_requests`` counts requests
active in each whole second.

Differences, stated: times are simulated seconds (``start_times`` on the simulation clock);
``itls`` per request are its inter-token gaps when the run kept per-token times
(``ClusterSpec.record_series``, ``--time-series``) and empty lists otherwise (the ITL statistics
use the run's pooled gaps either way, as vLLM does); ``max_output_tokens_per_s`` is None;
``generated_texts`` are empty strings; ``queue_times`` are the client's waits.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from datetime import datetime

import numpy as np

from kvroute.sim.cluster.metrics import RunResult, ServiceClass

PERCENTILES = (50, 90, 99)
"""Percentiles written, as ``vllm bench serve --metric-percentiles 50,90,99``."""

PERCENTILE_METRICS = ("ttft", "tpot", "itl", "e2el")
"""Metrics given percentiles, as ``--percentile-metrics ttft,tpot,itl,e2el``."""


def vllm_bench_result(run: RunResult, slo: ServiceClass, model_id: str, label: str,
                      request_rate: float | None = None, burstiness: float = 1.0,
                      date: datetime | None = None) -> dict:
    """The result JSON (a dict) ``vllm bench serve --save-result --save-detailed`` would write.

    Args:
        run: one simulated run (records in request-id order).
        slo: goodput bounds; ``request_goodput`` counts requests with TTFT and TPOT within them.
        model_id: the served model's name (``model_id`` and ``tokenizer_id``).
        label: the run's label (kvroute: the policy).
        request_rate: requests per second of the load, or None for ``"inf"`` (a burst/trace).
        burstiness: vLLM's gamma shape (1.0: Poisson).
        date: the ``date`` key's time (default: now), formatted ``%Y%m%d-%H%M%S`` as vLLM does.

    Returns:
        A JSON-ready dict (times in s in the lists, ms in the statistics; lengths in tokens;
        NaN never appears).
    """
    df = run.records
    ok = (df["status"] == "ok").to_numpy()
    done = df[ok]
    starts = df["arrival"].to_numpy(float)
    ttft = done["ttft"].to_numpy(float)
    e2e = done["e2e"].to_numpy(float)
    out_lens = np.where(ok, df["output_tokens"].to_numpy(int), 0)
    n_out = done["output_tokens"].to_numpy(int)
    tpots = np.where(n_out > 1, (e2e - ttft) / np.maximum(n_out - 1, 1), 0.0)
    duration = float(done["finish"].max() - starts.min()) if len(done) else 0.0
    per_s = (lambda x: x / duration) if duration > 0 else (lambda x: 0.0)
    good = int(((ttft <= slo.ttft_s) & (tpots <= slo.tpot_s)).sum())
    total_in = int(done["prompt_tokens"].sum())
    total_out = int(n_out.sum())
    result: dict = {
        "date": (date or datetime.now()).strftime("%Y%m%d-%H%M%S"),
        "endpoint_type": "kvroute-sim",
        "backend": "kvroute-sim",
        "label": label,
        "model_id": model_id,
        "tokenizer_id": model_id,
        "num_prompts": len(df),
        "request_rate": "inf" if request_rate is None else request_rate,
        "burstiness": burstiness,
        "max_concurrency": None,
        "duration": duration,
        "completed": int(ok.sum()),
        "failed": int((~ok).sum()),
        "total_input_tokens": total_in,
        "total_output_tokens": total_out,
        "request_throughput": per_s(int(ok.sum())),
        "request_goodput": per_s(good),
        "output_throughput": per_s(total_out),
        "total_token_throughput": per_s(total_in + total_out),
        "input_lens": [int(v) for v in df["prompt_tokens"]],
        "output_lens": [int(v) for v in out_lens],
        "ttfts": [float(v) if o else 0.0 for v, o in zip(df["ttft"], ok)],
        "itls": _itls(run, ok),
        "latencies": [float(v) if o else 0.0 for v, o in zip(df["e2e"], ok)],
        "start_times": [float(v) for v in starts],
        "queue_times": [float(v) for v in df["client_wait"]],
        "generated_texts": [""] * len(df),
        "errors": ["" if o else str(e or "failed") for e, o in zip(df["error"], ok)],
        "max_output_tokens_per_s": None,
        "max_concurrent_requests": _max_concurrent(starts[ok], e2e),
        "rtfx": 0.0,
    }
    values = {"ttft": ttft, "tpot": tpots[n_out > 1], "itl": np.asarray(run.itl, float), "e2el": e2e}
    for name in PERCENTILE_METRICS:
        x = values[name] if len(values[name]) else np.zeros(1)  # vLLM: np.mean(values or 0)
        result[f"mean_{name}_ms"] = float(np.mean(x)) * 1000
        result[f"median_{name}_ms"] = float(np.median(x)) * 1000
        result[f"std_{name}_ms"] = float(np.std(x)) * 1000
        for p in PERCENTILES:
            result[f"p{p}_{name}_ms"] = float(np.percentile(x, p)) * 1000
    return result


def _max_concurrent(starts: np.ndarray, latencies: np.ndarray) -> int:
    """Most requests active in one whole second since the first start (vLLM's bucketing)."""
    if not len(starts):
        return 0
    t0 = float(starts.min())
    seconds = int(math.ceil(float((starts + latencies).max()) - t0)) + 1
    counts = np.zeros(seconds, dtype=int)
    for s, lat in zip(starts, latencies):
        counts[int(s - t0):int(s + lat - t0) + 1] += 1
    return int(counts.max())


def _itls(run: RunResult, ok: np.ndarray) -> list[list[float]]:
    """Each record's inter-token gaps, s, from ``run.tokens``; empty lists without token times
    and for failed requests."""
    df = run.records
    if run.tokens is None:
        return [[] for _ in range(len(df))]
    tokens = run.tokens.sort_values(["request_id", "token"], kind="stable")
    ids, starts = np.unique(tokens["request_id"].to_numpy(), return_index=True)
    gaps = dict(zip(ids.tolist(), np.split(tokens["time"].to_numpy(float), starts[1:])))
    return [np.diff(gaps[rid]).tolist() if o and rid in gaps else []
            for rid, o in zip(df["request_id"].tolist(), ok)]


def result_filenames(policies: Iterable[str]) -> dict[str, str]:
    """``{spec: "vllm-bench-<name>.json"}`` for each policy spec: its name as tables and legends
    show it (``figure_style.short_names``: a config file's path cut to its file name or Markdown
    block), with ``:``, ``,``, ``=`` and any other character but letters, digits, ``-``, ``_``
    and ``.`` made ``_``."""
    from kvroute.sim.study.figure_style import short_names

    return {spec: "vllm-bench-" + "".join(c if c.isalnum() or c in "-_." else "_" for c in name) + ".json"
            for spec, name in short_names(policies).items()}
