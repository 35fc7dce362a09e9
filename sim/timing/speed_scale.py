"""A profile rescaled to the host's speed of the day, from speed probes.

A host (a shared CPU machine, a cloud GPU) can run the same model at another speed from one day
or machine to the next, and not uniformly: the attention part of a step can slow far more than
the rest, so a profile's prediction is off by a factor that grows with the prompt (measured:
docs/log/2026-12-05-speed-scale.md). One factor on every predicted time cannot follow that; a
factor per group of the step-cost coefficients can:

- ``step``: what every step pays whatever it holds (``step_overhead_s``, ``weight_load_s``,
  ``per_request_s``);
- ``token``: the linear layers' time per batched token (``per_token_s``);
- ``attention``: prefill and decode attention (``prefill_attn_s``, ``decode_attn_s``).

The factors are fitted to speed probes by ``kvroute.calibrate.validation.probe.speed_scale``
(which simulates the probe); :func:`scaled_profile` applies them to a profile and to its fit's
bootstrap samples.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from kvroute.sim.timing.profile import CoefficientUncertainty, Profile

SPEED_GROUPS: dict[str, tuple[str, ...]] = {
    "step": ("step_overhead_s", "weight_load_s", "per_request_s"),
    "token": ("per_token_s",),
    "attention": ("prefill_attn_s", "decode_attn_s"),
}
"""The step-cost coefficients (``kvroute.sim.timing.cost_model.StepCost`` fields) each factor scales."""

POORLY_DETERMINED_LOG_SD = 0.2
"""A factor whose log standard error (the probes' own scatter carried through the fit) exceeds
this (about +-22 % at one sd) is named as poorly determined by the probes: with one long request
per server the per-step and per-token costs trade against each other."""

FACTOR_BOUNDS = (0.1, 10.0)
"""The factors a fit may give: a host 10x faster or slower than its profile is not a drift but
another machine, and the probe's answer is clipped to say so."""


@dataclass(frozen=True, slots=True)
class SpeedScale:
    """Factors on a profile's step-cost groups (module doc): 2.0 means twice as slow.

    Attributes:
        step, token, attention: the factors (> 0).
        source: how they were obtained, for reports.
        residual: the fit's root-mean-square relative error over the probe times it used (0.05:
            5 %); NaN when given by hand.
        clipped: names of the factors left on a bound of :data:`FACTOR_BOUNDS`.
        log_sd: per factor, the standard error of its log (the probe means' sampling error
            carried through the fit's Jacobian, grown by the fit's misfit beyond it); {} when
            given by hand; inf when the probes do not determine it.
        tied: groups of factors fitted as one (e.g. ``(("step", "token"),)`` when the probes
            could not tell the per-step from the per-token cost); () when each was its own.

    Raises:
        ValueError: a factor not finite and > 0.
    """

    step: float = 1.0
    token: float = 1.0
    attention: float = 1.0
    source: str = "none"
    residual: float = math.nan
    clipped: tuple[str, ...] = ()
    log_sd: dict = dataclasses.field(default_factory=dict)
    tied: tuple[tuple[str, ...], ...] = ()

    def __post_init__(self) -> None:
        for name in SPEED_GROUPS:
            value = getattr(self, name)
            if not (value > 0 and math.isfinite(value)):
                raise ValueError(f"speed factor {name} must be finite and > 0, got {value!r}")

    def factors(self) -> dict[str, float]:
        """``{"step": ..., "token": ..., "attention": ...}``."""
        return {name: getattr(self, name) for name in SPEED_GROUPS}

    def poorly_determined(self) -> tuple[str, ...]:
        """The factors whose log standard error exceeds :data:`POORLY_DETERMINED_LOG_SD`."""
        return tuple(name for name in SPEED_GROUPS if self.log_sd.get(name, 0.0) > POORLY_DETERMINED_LOG_SD)

    def describe(self) -> str:
        """One line: the factors (with their log standard errors when known), the fit's
        residual, any bound hit and any factor the probes leave poorly determined."""
        def one(names: tuple[str, ...]) -> str:
            sd = self.log_sd.get(names[0])
            notes = (["one factor: the probes cannot tell them apart"] if len(names) > 1 else []) \
                + ([] if sd is None else [f"log sd {sd:.2f}"])
            return f"{' and '.join(names)} x{getattr(self, names[0]):.3f}" + (f" ({'; '.join(notes)})" if notes else "")

        grouped = list(self.tied)
        grouped += [(name,) for name in SPEED_GROUPS if not any(name in g for g in self.tied)]
        grouped.sort(key=lambda g: list(SPEED_GROUPS).index(g[0]))
        text = ", ".join(one(g) for g in grouped)
        if math.isfinite(self.residual):
            text += f"; the probe times fitted within {100 * self.residual:.1f} % (rms)"
        if self.clipped:
            text += f"; on a bound of {FACTOR_BOUNDS}: {', '.join(self.clipped)}"
        if self.poorly_determined():
            text += (f"; poorly determined by the probes (log sd above {POORLY_DETERMINED_LOG_SD:g}, from their "
                     f"scatter and the fit's misfit): {', '.join(self.poorly_determined())}; more probe requests "
                     "per server (a larger --speed-probes N) narrow the scatter, and a quieter host the misfit")
        return text

    def to_dict(self) -> dict:
        """The factors, ``source``, ``residual`` (None when NaN), ``clipped``, ``log_sd`` (None
        for an undetermined factor) and ``tied``."""
        return {**self.factors(), "source": self.source,
                "residual": None if math.isnan(self.residual) else self.residual, "clipped": list(self.clipped),
                "log_sd": {k: (v if math.isfinite(v) else None) for k, v in self.log_sd.items()},
                "tied": [list(group) for group in self.tied]}


def scaled_profile(profile: Profile, scale: SpeedScale) -> Profile:
    """``profile`` with each step-cost group multiplied by its factor, the same factors applied to
    the matching fields of its bootstrap samples (so that drawn profiles keep the day's speed),
    named ``"<name> x probe"`` and with ``raw["speed_scale"]`` saying how."""
    factor_of = {field: getattr(scale, group) for group, fields in SPEED_GROUPS.items() for field in fields}
    step_cost = dataclasses.replace(profile.step_cost, **{f: getattr(profile.step_cost, f) * k
                                                          for f, k in factor_of.items()})
    uncertainty = profile.uncertainty
    if uncertainty is not None and uncertainty.samples:
        ks = [factor_of.get(name.removeprefix("step_cost."), 1.0) if name.startswith("step_cost.") else 1.0
              for name in uncertainty.fields]
        uncertainty = CoefficientUncertainty(uncertainty.fields,
                                             tuple(tuple(v * k for v, k in zip(row, ks)) for row in uncertainty.samples),
                                             uncertainty.relative_range, uncertainty.method)
    raw = {**profile.raw, "speed_scale": scale.to_dict()}
    return dataclasses.replace(profile, name=f"{profile.name} x probe", step_cost=step_cost, uncertainty=uncertainty,
                               raw=raw)
