"""Speed probes: the same small requests timed on every server, before and after live rounds, to
measure how far the host's speed moved (``kvroute.sim.timing.drift``).

A probe sends, on each server in turn and from a reset prefix cache, ``reps`` cold prompts of
``PROBE_PROMPT_TOKENS`` random token ids one at a time, each asking for ``PROBE_OUTPUT_TOKENS``
tokens, and keeps every request's client TTFT and mean inter-token gap. One request at a time,
so the probe times the host's speed, not the model's handling of load.
"""

from __future__ import annotations

import math

from kvroute.sim.timing.drift import NO_DRIFT, Drift, probe_drift

PROBE_PROMPT_TOKENS, PROBE_OUTPUT_TOKENS, PROBE_REPS = 2048, 32, 3
"""The probe's prompt length and outputs (tokens) and its requests per server."""

PROBE_QUANTITIES = ("ttft_s", "itl_s")
"""What a probe times per request: the client's TTFT and the mean inter-token gap, s."""


async def probe_samples(urls: list[str], seed: int, reps: int = PROBE_REPS, model: str | None = None,
                        warn=lambda msg: None) -> dict[str, list[float]]:
    """Time the probe on every server (module doc).

    Args:
        urls: server base URLs.
        seed: seeds the prompts' token ids (``calibrate measure``'s cold prompts).
        reps: requests per server.
        model: served model name; None: each server's only model.
        warn: called with a one-line message for a request that failed or returned < 2 tokens.

    Returns:
        ``{"ttft_s": [...], "itl_s": [...]}``: one value per successful request, s.
    """
    import numpy as np

    from kvroute.calibrate.calibration.measure import PromptFactory
    from kvroute.calibrate.live.client import VllmClient

    prompts = PromptFactory(np.random.default_rng(seed))
    out: dict[str, list[float]] = {q: [] for q in PROBE_QUANTITIES}
    for url in urls:
        async with VllmClient(url, model) as client:
            await client.probe()
            await client.reset_prefix_cache()
            for _ in range(reps):
                res = await client.complete(prompts.unique(PROBE_PROMPT_TOKENS), PROBE_OUTPUT_TOKENS)
                times = res.token_times
                if res.error or len(times) < 2:
                    warn(f"speed probe on {url}: {res.error or 'fewer than two tokens'}")
                    continue
                out["ttft_s"].append(float(times[0]))
                out["itl_s"].append(float((times[-1] - times[0]) / (len(times) - 1)))
    return out


def median(samples: dict[str, list[float]]) -> dict[str, float]:
    """Per quantity, the median of a probe's samples (NaN without any)."""
    import statistics

    return {q: statistics.median(v) if v else math.nan for q, v in samples.items()}


def drifts(before: dict[str, list[float]] | None, after: dict[str, list[float]] | None,
           reference: dict[str, list[float]] | None = None) -> dict[str, Drift]:
    """Per probe quantity (``"ttft"``, ``"itl"``), the drift over the live rounds between the
    probes ``before`` and ``after`` them, against ``reference`` (the probe right after
    calibrating) when given (``kvroute.sim.timing.drift.probe_drift``); {} without both probes."""
    if not before or not after:
        return {}
    out = {}
    for q in PROBE_QUANTITIES:
        d = probe_drift(before.get(q), after.get(q), (reference or {}).get(q))
        if d is not NO_DRIFT and "no usable probe" not in d.source:
            out[q.removesuffix("_s")] = d
    return out
