"""The notes under a table about the profile a prediction rests on: inputs nobody measured
(a derived prior) and the API server and host a profile without front-end terms leaves out.
``kvroute compare``/``simulate`` and ``kvroute sweep`` print them alike."""

from __future__ import annotations


UNCERTAINTY_ADVICE = {
    "compare": "`--uncertainty 10` adds their share to the intervals",
    "sweep": "`kvroute compare --uncertainty 10` on one point adds their share to its intervals",
}
"""What :func:`unmeasured_note` advises by command; any other (``simulate``) is sent to ``compare``."""


def unmeasured_note(profile, fitted_seed_workload: bool = False, uncertainty: int = 0, command: str = "compare") -> str:
    """A note under the table when the prediction rests on inputs nobody measured (with the
    advice to draw ``--uncertainty`` profiles unless ``uncertainty`` already did; for a
    ``command`` without that option, ``simulate`` or ``sweep``, with ``compare``: on one point of
    a sweep)."""
    if (profile.raw.get("provenance") or {}).get("kind") != "derived":
        return ""
    advice = ("the `with model unc.` intervals include their share" if uncertainty else
              UNCERTAINTY_ADVICE.get(command, "`kvroute compare --uncertainty 10` adds their share to the intervals"))
    note = (f"Note: {profile.name} is a derived prior, not a measurement: absolute times rest on its stated step "
            f"costs and API-server time ({profile.overheads.api_server_s * 1000:.0f} ms). "
            f"{advice[0].upper() + advice[1:]}; `kvroute sensitivity` ranks them.")
    if fitted_seed_workload and profile.name == "a6000-qwen2.5-7b":
        note += (" On the lab's 6-turn run this prior predicts later-turn TTFT about 1.5x the measured value "
                 "(docs/reference/seed-study-fit.md).")
    return note


FRONTEND_NOTE_IN_FLIGHT = 8
"""Requests in flight on one worker from which a profile without front-end terms gets a note."""


def frontend_note(profile, peak: int | None, policy: str | None = None) -> str:
    """A note under the table when many requests (``peak``) were in flight on a worker: without a
    ``frontend`` section vLLM's API process is taken as unlimited, which bursts disprove; with
    one, its serial admission work per prompt token and the host contention that work feeds (or,
    with the API process on its engine's core, the stated ``host.api_contention``) are the terms
    closed-loop TTFT hangs on (docs/design/timing-and-host-model.md). ``peak`` None (a sweep, whose
    rows do not count it): said of the terms alone, for a profile without them. ``policy``: the
    policies that reached ``peak`` (when not every one did), named when given."""
    if peak is None:
        if profile.frontend is not None:
            return ""
        return f"Note: {_no_frontend_terms(profile, ' (many requests in flight on one worker)')}"
    if peak < FRONTEND_NOTE_IN_FLIGHT:
        return ""
    under = f" (under {policy})" if policy else ""
    if profile.frontend is not None:
        per_token = profile.frontend.per_prompt_token_s
        if per_token <= 0:
            return ""
        host = profile.host
        admits = (f"Note: up to {peak} requests were in flight on one worker{under}, and each server's API process admits "
                  f"them one after another, {1e6 * per_token:.2f} us per prompt token ({profile.name}'s "
                  "frontend.per_prompt_token_s), ")
        if host is not None and host.api_on_engine_core:
            return (admits + f"on its engine's core, taking {1 + host.api_contention:.2g} times as long while the "
                    f"engine has requests (host.api_contention {host.api_contention:.2g}, stated, not measured). "
                    "Closed-loop TTFT under a kv-aware router hangs on it: on the CPU reference the "
                    "kv_aware-vs-round_robin TTFT change was predicted +39 % with 0 and +13 % with 1, measured +25 % "
                    "(docs/design/timing-and-host-model.md).")
        contention = host.contention if host is not None else 0.0
        return (admits + "counting as a busy process on the host while it works "
                f"(host.contention {contention:.2g}). Closed-loop TTFT under a kv-aware router hangs on both: on the "
                "CPU reference one profile's kv_aware-vs-round_robin TTFT change was -31, +5 and +41 points off the "
                "measured one with contention 0, 2 and 4, and a fitted contention often sits at the fit's bound "
                "(docs/design/timing-and-host-model.md).")
    return f"Note: up to {peak} requests were in flight on one worker{under}, and {_no_frontend_terms(profile)}"


def _no_frontend_terms(profile, bursts: str = "") -> str:
    """What a profile without front-end terms leaves out, and how to measure it; ``bursts`` says
    what a burst is where no peak in flight is given."""
    return (f"{profile.name} has no front-end terms: vLLM's API process and the host's CPU are taken as unlimited, "
            f"where under bursts{bursts} they queue work (on the CPU reference, bursts of short replies took about "
            "twice the time such a profile predicts). Calibrate with the concurrency sweep (`kvroute calibrate "
            "measure`) to model them (docs/design/timing-and-host-model.md).")
