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
        longest_sequence: the run's longest prompt plus output, tokens.
        peak_in_flight: most requests in flight on one worker, capped at ``max_num_seqs`` by
            the caller (an upper bound of its decode batch).
    """
    if measured is None:
        return ""
    beyond = []
    if longest_sequence > measured.sequence_tokens:
        beyond.append(f"sequences reach {longest_sequence:,} tokens, its sweep timed up to "
                      f"{measured.sequence_tokens:,}")
    if measured.decode_batch and peak_in_flight > measured.decode_batch:
        beyond.append(f"up to {peak_in_flight} requests shared one worker, its sweep decoded batches of up to "
                      f"{measured.decode_batch}")
    if not beyond:
        return ""
    fix = (f" (`kvroute calibrate measure --longest {longest_sequence}` times such sequences)"
           if longest_sequence > measured.sequence_tokens else "")
    return (f"Note: beyond what {name} measured: {'; '.join(beyond)}. The step costs there are the fitted "
            f"model extrapolated, not measured{fix}.")
