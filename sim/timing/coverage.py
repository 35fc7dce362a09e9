"""Whether a run stayed inside what its profile measured.

A measured profile's step costs come from a calibration sweep of bounded shapes: prompts up to
some length, decode batches up to some size. A run beyond them extrapolates the fitted cost
model (attention cost grows with context, and a CPU or GPU kernel can change regime past the
lengths the sweep tried), so its prediction rests on an input nobody measured. ``calibrate fit``
writes the sweep's bounds into the profile (``provenance.fit.measured_range``); this module
compares a run's records with them and says what lies outside, in one line for the report.

Derived priors (``provenance.kind == "derived"``) have no such bounds: their whole step cost is
stated, which the CLI says separately.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True, slots=True)
class MeasuredRange:
    """The shapes a calibration sweep measured.

    Attributes:
        sequence_tokens: longest sequence whose step costs were timed: a prompt's prefill
            (cold, after a cached prefix, or mixed with decodes) or a decode context, tokens.
        decode_batch: most requests decoding together in a timed step.
    """

    sequence_tokens: int
    decode_batch: int

    def to_dict(self) -> dict:
        """The profile JSON form (``provenance.fit.measured_range``)."""
        return {"sequence_tokens": self.sequence_tokens, "decode_batch": self.decode_batch}

    @classmethod
    def of_profile(cls, raw: dict) -> "MeasuredRange | None":
        """The range recorded in a profile document, or None (priors, older profiles)."""
        doc = ((raw.get("provenance") or {}).get("fit") or {}).get("measured_range")
        if not isinstance(doc, dict):
            return None
        try:
            return cls(int(doc["sequence_tokens"]), int(doc["decode_batch"]))
        except (KeyError, TypeError, ValueError):
            return None


def measured_range(descs: list[tuple[str, dict]]) -> MeasuredRange:
    """The range of a sweep from its observations' ``(kind, desc)`` pairs
    (``kvroute.calibrate.calibration.observations.Observation``): TTFT kinds give
    ``prompt_len``, decode and mixed kinds ``context_len`` (plus ``prefill_len``) and ``batch``.
    Missing fields count as 0."""
    seq, batch = 0, 0
    for kind, d in descs:
        if kind in ("cold", "cached"):
            seq = max(seq, int(d.get("prompt_len") or 0))
        else:
            seq = max(seq, int(d.get("context_len") or 0), int(d.get("prefill_len") or 0))
            batch = max(batch, int(d.get("batch") or 0))
    return MeasuredRange(seq, batch)


def outside_note(name: str, measured: MeasuredRange | None, longest_sequence: int, peak_in_flight: int) -> str:
    """One line naming what a run did beyond the profile's measured range, or ``""``.

    Args:
        name: the profile's name.
        measured: its range (None: nothing to say).
        longest_sequence: the run's longest prompt plus output, tokens. Its steps reach one
            token less: the last output token is sampled, never computed (as a sweep extended
            with ``--longest N`` times a cold prompt of ``N - 1`` tokens with one output).
        peak_in_flight: most requests in flight on one worker, capped at ``max_num_seqs`` by
            the caller (an upper bound of its decode batch).
    """
    if measured is None:
        return ""
    beyond = []
    outside = longest_sequence - 1 > measured.sequence_tokens
    if outside:
        beyond.append(f"sequences reach {longest_sequence:,} tokens, its sweep timed up to "
                      f"{measured.sequence_tokens:,}")
    if measured.decode_batch and peak_in_flight > measured.decode_batch:
        beyond.append(f"up to {peak_in_flight} requests could decode together on one worker (in flight there, at "
                      f"most max_num_seqs), its sweep decoded batches of up to {measured.decode_batch}")
    if not beyond:
        return ""
    fix = (f" (`kvroute calibrate measure --longest {longest_sequence}` times such sequences)"
           if outside else "")
    return (f"Note: beyond what {name} measured: {'; '.join(beyond)}. The step costs there are the fitted "
            f"model extrapolated, not measured{fix}.")


def run_note(profile, runs, peak: int | None = None) -> str:
    """:func:`outside_note` for a run's records: the longest served sequence (prompt plus output
    tokens of requests with status ``ok``) and the peak in flight on one worker, capped at the
    engine's ``max_num_seqs``, against ``profile``'s measured range.

    Args:
        profile: a :class:`~kvroute.sim.timing.profile.Profile`.
        runs: per-request rows (``kvroute.sim.cluster.metrics.RECORD_COLUMNS``): one DataFrame, or a
            list of them, one per simulated run (rounds overlap in time, so each is counted
            apart unless its rows carry ``policy``/``round``/``seed`` columns).
        peak: the peak in flight when the caller has it, else :func:`peak_in_flight` per run.
    """
    frames = [runs] if hasattr(runs, "columns") else list(runs)
    measured = MeasuredRange.of_profile(profile.raw)
    served = [f[f["status"] == "ok"] for f in frames]
    served = [f for f in served if not f.empty]
    if measured is None or not served:
        return ""
    longest = max(int((f["prompt_tokens"] + f["output_tokens"]).max()) for f in served)
    if peak is None:
        peak = max(peak_in_flight(f) for f in frames)
    return outside_note(profile.name, measured, longest, min(peak, profile.engine.max_num_seqs))


def peak_in_flight(records) -> int:
    """Most requests sent but not finished at once on one worker, over every policy and round.

    Args:
        records: per-request rows with ``worker``, ``arrival`` and ``finish`` (``first_token``
            where present), and ``policy``, ``round`` or ``seed`` where present (each group
            counted apart); times in s. A request never sent (``worker`` -1) is on no worker;
            one without a finish failed (refused at its send, or cut off by a dead server) and
            counts until its last known time: its first token, else its send. A timed-out
            request's finish is its timeout.
    """
    records = records[records["worker"] >= 0]
    keys = [k for k in ("policy", "round", "seed", "worker") if k in records.columns]
    peak = 0
    for _, g in records.groupby(keys):
        start = g["arrival"].to_numpy(float)
        end = g["finish"].to_numpy(float)
        if "first_token" in g:
            end = np.where(np.isnan(end), g["first_token"].to_numpy(float), end)
        end = np.where(np.isnan(end), start, end)
        start, end = start[np.isfinite(start)], end[np.isfinite(start)]
        if not len(start):
            continue
        # +1 at each send, -1 at each finish; a finish at the same instant as a send goes first
        times = np.concatenate([start, end])
        steps = np.concatenate([np.ones(len(start)), -np.ones(len(end))])
        order = np.lexsort((steps, times))
        peak = max(peak, int(np.cumsum(steps[order]).max()))
    return peak
