"""Model uncertainty: profiles drawn from their coefficients' uncertainty.

A measured profile carries bootstrap refits of its coefficients (``step_cost_uncertainty``,
written by ``kvroute calibrate fit``); a draw is one of those coefficient vectors, so the draws
keep the coefficients' correlations (a higher ``per_token_s`` comes with a lower
``step_overhead_s`` when both explain the same steps) and never go negative. A derived prior has
no fit to resample: each uncertain coefficient is drawn independently and uniformly in a stated
relative range around its value (:data:`PRIOR_RANGE`, ±20 % by default). A measured profile's
fitted host contention, which the bootstrap does not refit, is drawn uniformly in the range its
burst fit allows, up to what the data asked for when the fit left it on its bound
(:func:`term_ranges`).
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from kvroute.sim.timing.cost_model import StepCost
from kvroute.sim.timing.profile import CoefficientUncertainty, Profile

PRIOR_RANGE = 0.2
"""Default relative half-width of a derived prior's step-cost coefficients and API-server time."""

PRIOR_FIELDS = tuple(f"step_cost.{k}" for k in StepCost.__dataclass_fields__) + ("overheads.api_server_s",)
"""Coefficients a stated relative range covers when a profile has no fitted uncertainty."""


def profile_uncertainty(profile: Profile, prior_range: float = PRIOR_RANGE) -> CoefficientUncertainty:
    """The profile's fitted uncertainty, or else ``prior_range`` around every :data:`PRIOR_FIELDS`
    coefficient (derived priors, and measured profiles fitted before uncertainty was recorded).

    Raises:
        ValueError: ``prior_range`` outside ``[0, 1)``.
    """
    if profile.uncertainty is not None:
        return profile.uncertainty
    return CoefficientUncertainty(PRIOR_FIELDS, relative_range=prior_range,
                                  method=f"stated range: each coefficient uniform in ±{100 * prior_range:g} %")


def coefficient(profile: Profile, name: str) -> float:
    """The profile's value of ``"step_cost.<field>"`` or ``"overheads.<field>"``."""
    section, _, key = name.partition(".")
    return float(getattr(profile.step_cost if section == "step_cost" else profile.overheads, key))


def with_coefficients(profile: Profile, values: dict[str, float]) -> Profile:
    """``profile`` with the named coefficients replaced (names as :func:`coefficient`).

    Raises:
        ValueError: an unknown name, or a negative value (from ``StepCost``).
    """
    cost, over, host = {}, {}, {}
    for name, value in values.items():
        section, _, key = name.partition(".")
        target = {"step_cost": (cost, StepCost), "overheads": (over, type(profile.overheads))}.get(section)
        if section == "host" and profile.host is not None:
            target = (host, type(profile.host))
        if target is None or key not in target[1].__dataclass_fields__:
            raise ValueError(f"unknown coefficient {name!r} (step_cost.<name>, overheads.<name> or, with a host "
                             "section, host.<name>)")
        target[0][key] = float(value)
    return replace(profile, step_cost=replace(profile.step_cost, **cost) if cost else profile.step_cost,
                   overheads=replace(profile.overheads, **over) if over else profile.overheads,
                   host=replace(profile.host, **host) if host else profile.host)


def draw_profiles(profile: Profile, n: int, rng: np.random.Generator,
                  prior_range: float = PRIOR_RANGE) -> list[Profile]:
    """``n`` profiles drawn from the profile's coefficient uncertainty.

    With bootstrap samples: ``n`` of them, without replacement while ``n`` does not exceed their
    number (with replacement beyond). With a relative range r: each coefficient independently
    uniform in ``[(1 - r) c, (1 + r) c]``.

    Args:
        profile: the central profile.
        n: draws (>= 1).
        rng: the run's seeded generator.
        prior_range: the relative range used when the profile has no fitted uncertainty.

    Raises:
        ValueError: ``n < 1``.
    """
    if n < 1:
        raise ValueError(f"the number of drawn profiles must be >= 1, got {n}")
    unc = profile_uncertainty(profile, prior_range)
    if unc.samples:
        rows = rng.choice(len(unc.samples), size=n, replace=n > len(unc.samples))
        drawn = [with_coefficients(profile, dict(zip(unc.fields, unc.samples[i]))) for i in rows]
    else:
        r = float(unc.relative_range)
        base = np.array([coefficient(profile, f) for f in unc.fields])
        factors = rng.uniform(1 - r, 1 + r, size=(n, len(unc.fields)))
        drawn = [with_coefficients(profile, dict(zip(unc.fields, base * row))) for row in factors]
    ranges = term_ranges(profile)
    if not ranges:
        return drawn
    names = sorted(ranges)
    values = rng.uniform([ranges[k][0] for k in names], [ranges[k][1] for k in names], size=(n, len(names)))
    return [with_coefficients(p, dict(zip(names, row))) for p, row in zip(drawn, values)]


def term_ranges(profile: Profile) -> dict[str, tuple[float, float]]:
    """The ranges the profile's fitted host terms allow, drawn uniformly by :func:`draw_profiles`
    (the bootstrap refits only the step costs and overheads): ``host.contention`` in the burst
    fit's ``provenance.fit.bursts.contention_interval``, its upper end raised to what the data
    asked for when the fit left it on its bound (``fit_notes.at_bound``, written by
    ``kvroute.calibrate.calibration.walls``). Empty without a host section or such an interval."""
    if profile.host is None or not isinstance(profile.raw, dict):
        return {}
    fit = (profile.raw.get("provenance") or {}).get("fit") or {}
    interval = (fit.get("bursts") or {}).get("contention_interval") if isinstance(fit, dict) else None
    if not (isinstance(interval, list) and len(interval) == 2
            and all(isinstance(v, (int, float)) and np.isfinite(v) and v >= 0 for v in interval)):
        return {}
    low, high = float(min(interval)), float(max(interval))
    for wall in ((profile.raw.get("fit_notes") or {}).get("at_bound") or []):
        asked = wall.get("asked_for") if isinstance(wall, dict) else None
        if wall.get("term") == "host.contention" and isinstance(asked, (int, float)) and np.isfinite(asked):
            high = max(high, float(asked))
    return {"host.contention": (low, high)} if high > low else {}
