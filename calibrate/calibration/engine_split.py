"""Where the unloaded front end sits: before the engine, or after its step.

A request alone on a server spends its TTFT in three parts: the API process admits it (parse,
tokenise, hand it to the engine core), the engine queues and prefills it, and the step's output
goes back through the API process (detokenise, one SSE chunk) to the client. The ``/metrics``
histograms give the middle part's length but not where it lies, so ``overheads.api_server_s``
(client TTFT minus the engine's queue and prefill time) holds the first and last parts together,
and the simulator used to place all of it before the engine. Under load that matters: a
request's turn at the engine then comes too late by the part that really follows the step, and
its token reaches the client too early by the same amount.

With the servers' KV-cache events the sweep times the end of each request's prefill step
(``engine_first_token_s`` in ``requests.csv``, :func:`kvroute.calibrate.calibration.measure.
engine_first_token`); the client's TTFT less that time is the part after the engine.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

ALONE_ROLES = ("cold", "warm", "cached")
"""Request rows of one request alone on its server whose TTFT the fit reads (the sweep's TTFT
observations)."""


@dataclass(frozen=True, slots=True)
class PostEngine:
    """Engine step end to the client's first token, one request at a time.

    Attributes:
        median_s: median over the requests, s.
        q25_s, q75_s: quartiles, s.
        num_requests: requests timed in the engine.
        num_alone: requests alone on their server with a TTFT (the timed ones among them).
    """

    median_s: float
    q25_s: float
    q75_s: float
    num_requests: int
    num_alone: int

    def to_dict(self) -> dict:
        """JSON-ready fields (six significant digits)."""
        return {"median_s": float(f"{self.median_s:.6g}"), "q25_s": float(f"{self.q25_s:.6g}"),
                "q75_s": float(f"{self.q75_s:.6g}"), "num_requests": self.num_requests,
                "num_alone": self.num_alone}


def post_engine_time(requests) -> PostEngine | None:
    """The part of the unloaded TTFT after the engine's step, from a sweep's request rows.

    Args:
        requests: ``requests.csv`` as a DataFrame (columns ``role``, ``error``, ``ttft_s`` and
            ``engine_first_token_s``; sweeps without KV events lack the last).

    Returns:
        A :class:`PostEngine` over the successful ``ALONE_ROLES`` rows timed in the engine, or
        None when none is (no KV events, or none arrived).
    """
    if "engine_first_token_s" not in requests.columns:
        return None
    alone = requests[requests["role"].isin(ALONE_ROLES) & requests["error"].isna()]
    ttft = alone["ttft_s"].to_numpy(float)
    engine = alone["engine_first_token_s"].to_numpy(float)
    ok = np.isfinite(ttft) & np.isfinite(engine)
    if not ok.any():
        return None
    post = ttft[ok] - engine[ok]
    q25, median, q75 = np.percentile(post, [25, 50, 75])
    return PostEngine(float(median), float(q25), float(q75), int(ok.sum()), len(alone))


def apply_post_engine(doc: dict, split: PostEngine) -> None:
    """Move ``split``'s median out of a profile document's ``overheads.api_server_s`` into
    ``overheads.post_engine_s`` (the unloaded TTFT predicted stays the same), with its
    provenance and source. When the median exceeds ``api_server_s`` (it is fitted separately,
    a line in prompt length), only ``api_server_s`` moves, and the provenance says so."""
    over = doc["overheads"]
    moved = min(split.median_s, over["api_server_s"])
    over["api_server_s"] = float(f"{over['api_server_s'] - moved:.6g}")
    over["post_engine_s"] = float(f"{moved:.6g}")
    fit = doc.setdefault("provenance", {}).setdefault("fit", {})
    fit["post_engine"] = {**split.to_dict(), **({"clipped_to_api_server_s": True} if moved < split.median_s else {})}
    doc.setdefault("sources", {})["overheads.post_engine_s"] = (
        f"median over {split.num_requests} requests alone on a server of the client's TTFT less the end of the "
        "engine step that finished the prefill (the KV-event batch that stored the prompt's last full block, "
        "vLLM KVEventBatch.ts); taken out of api_server_s")


def describe(split: PostEngine | None) -> str:
    """One line for the fit's report."""
    if split is None:
        return "front end: all of it before the engine (the sweep has no engine step times; measure --kv-events)"
    return (f"front end after the engine's step: median {1e3 * split.median_s:.2f} ms "
            f"(quartiles {1e3 * split.q25_s:.2f}-{1e3 * split.q75_s:.2f} ms, {split.num_requests} of "
            f"{split.num_alone} requests alone timed)")
