"""Global sensitivity of a scenario's headline metrics to its uncertain inputs (Morris screening).

Each uncertain input is a :class:`Factor`: a name, a stated range ``[low, high]`` and
``apply(scenario, profile, value) -> (scenario, profile)``. Morris's method of elementary effects
(Morris 1991, *Technometrics* 33(2); the radial-free trajectory design and the mu* measure of
Campolongo, Cariboni & Saltelli 2007, as implemented by SALib's ``sample.morris`` and
``analyze.morris``) moves one factor at a time along ``trajectories`` random paths through a grid of
``levels`` levels per factor. For every factor and every output:

- ``mu_star``: mean absolute change of the output when the factor crosses its whole range (the
  output's units; SALib scales each step to the full range), the ranking measure;
- ``mu``: the same with signs (``mu ~ mu_star`` or ``-mu_star``: a monotone effect);
- ``sigma``: spread of the effects (non-linearity, interactions with other factors);
- ``mu_star_conf``: bootstrap half-width of ``mu_star``'s 95 % interval.

Every point is simulated for each policy on the same seeds ``scenario.seed .. + rounds - 1``
(common random numbers), and its outputs averaged over those rounds: the headline metrics per
policy and, for every other policy, its relative change against the first.

**Adding a factor.** :data:`FACTOR_GROUPS` maps a group name to a builder
``builder(scenario, profile, ranges) -> list[Factor]`` (an empty list when the group does not
apply); :func:`default_factors` calls every builder in order. A new uncertain input is one
builder added to that dict (and, when its range is an option, one field of :class:`Ranges`).
From Python, any list of :class:`Factor` can be passed to :func:`run_sensitivity` instead.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Callable

import numpy as np
import pandas as pd

from kvroute.sim.cluster.cluster import REPLAY_MODES, simulate
from kvroute.sim.study.executors import interrupts_as_keyboard, run_tasks
from kvroute.sim.timing.cost_model import StepCost
from kvroute.sim.cluster.metrics import SUMMARY_METRICS, ServiceClass, summarize
from kvroute.sim.routing import DEFAULT_POLICIES
from kvroute.sim.timing.profile import Profile
from kvroute.sim.cluster.metrics import SHARE_METRICS
from kvroute.sim.study.scenario import Scenario
from kvroute.sim.timing.uncertainty import PRIOR_RANGE, coefficient, with_coefficients
from kvroute.traces.format import Trace
from kvroute.traces.generators import SEED_CHAT_REPLY, SEED_CHAT_USER
from kvroute.traces.lengths import Dist, parse_dist

HEADLINE_METRICS: tuple[str, ...] = ("time_to_complete_s", "later_ttft_mean_s", "later_ttft_p90_s", "hit_rate")
"""Metrics every policy reports (``SUMMARY_METRICS`` keys)."""

SHORT_LABELS: dict[str, str] = {"time_to_complete_s": "time to complete (s)", "later_ttft_mean_s": "later TTFT mean (s)",
                                 "later_ttft_p90_s": "later TTFT p90 (s)", "hit_rate": "hit rate"}
"""Column labels of the tables and plots (later = turns >= 2)."""

EXECUTORS = ("local", "sequential")

Apply = Callable[[Scenario, Profile, float], "tuple[Scenario, Profile]"]


@dataclass(frozen=True)
class Factor:
    """One uncertain input.

    Attributes:
        name: unique name (e.g. ``"step_cost.per_token_s"``).
        low, high: the stated range, in the factor's own units (``low < high``).
        apply: ``apply(scenario, profile, value) -> (scenario, profile)`` sets the input to
            ``value``; it must not mutate its arguments (both are frozen dataclasses).
        unit: unit of ``low``/``high`` for tables (``"s"``, ``"x"`` for a multiplier, ...).
        source: where the range comes from (``"bootstrap 95 %"``, ``"±20 % of the prior"``, ...).

    Raises:
        ValueError: ``low >= high`` or a bound is not finite.
    """

    name: str
    low: float
    high: float
    apply: Apply = field(compare=False, repr=False)
    unit: str = ""
    source: str = ""

    def __post_init__(self) -> None:
        if not (math.isfinite(self.low) and math.isfinite(self.high) and self.low < self.high):
            raise ValueError(f"factor {self.name!r}: need finite low < high, got [{self.low}, {self.high}]")


@dataclass(frozen=True, slots=True)
class Ranges:
    """The stated ranges of the default factors.

    Attributes:
        prior_range: relative half-width of a step-cost coefficient or overhead mean that has no
            fitted uncertainty (derived priors): ``[(1 - r) c, (1 + r) c]``.
        coverage: central share of a measured coefficient's bootstrap samples used as its range.
        jitter_cv: absolute range of the per-request overhead's coefficient of variation (when
            the profile has no fitted one).
        kv_range: relative half-width of the KV capacity (``num_gpu_blocks``).
        arrival_spread_s: absolute range of the start spread of the requests sent at their
            timestamps (roots in closed loop), s.
        reply_median_range: relative half-width of a lognormal reply stop point's median.
        reply_cv: absolute range of that lognormal's coefficient of variation.
        user_sd: absolute range of the standard deviation of user-message tokens (seed-chat; the
            mean stays the scenario's), tokens.
    """

    prior_range: float = PRIOR_RANGE
    coverage: float = 0.95
    jitter_cv: tuple[float, float] = (0.0, 0.6)
    kv_range: float = 0.1
    arrival_spread_s: tuple[float, float] = (0.0, 0.02)
    reply_median_range: float = 0.3
    reply_cv: tuple[float, float] = (0.25, 1.5)
    user_sd: tuple[float, float] = (0.0, 20.0)

    def __post_init__(self) -> None:
        if not 0.0 < self.prior_range < 1.0:
            raise ValueError(f"prior_range must be in (0, 1), got {self.prior_range}")
        if not 0.0 < self.kv_range < 1.0:
            raise ValueError(f"kv_range must be in (0, 1), got {self.kv_range}")
        if not 0.0 < self.coverage < 1.0:
            raise ValueError(f"coverage must be in (0, 1), got {self.coverage}")
        if not 0.0 < self.reply_median_range < 1.0:
            raise ValueError(f"reply_median_range must be in (0, 1), got {self.reply_median_range}")
        for name in ("jitter_cv", "arrival_spread_s", "reply_cv", "user_sd"):
            lo, hi = getattr(self, name)
            if not 0.0 <= lo < hi:
                raise ValueError(f"{name} range must satisfy 0 <= low < high, got ({lo}, {hi})")


# --------------------------------------------------------------------------------------------
# Factor builders
# --------------------------------------------------------------------------------------------


def _set_coefficient(name: str) -> Apply:
    def apply(scenario: Scenario, profile: Profile, value: float) -> tuple[Scenario, Profile]:
        return scenario, with_coefficients(profile, {name: value})
    return apply


def _coefficient_factor(name: str, profile: Profile, ranges: Ranges, fallback: str) -> Factor | None:
    """A coefficient's factor: its bootstrap range if the profile has one, else the stated
    relative range around it; None when the range is empty (a zero coefficient)."""
    value = coefficient(profile, name)
    unc = profile.uncertainty
    band = unc.interval(name, value, ranges.coverage) if unc is not None else None
    if band is not None and unc.samples:
        source = f"bootstrap {100 * ranges.coverage:g} %"
    elif band is not None:
        source = f"±{100 * unc.relative_range:g} % (profile)"
    else:
        band, source = fallback_band(value, ranges.prior_range), fallback
    if band is None or not band[0] < band[1]:
        return None
    return Factor(name, band[0], band[1], _set_coefficient(name), "s" if name.endswith("_s") else "", source)


def fallback_band(value: float, r: float) -> tuple[float, float] | None:
    """``[(1 - r) value, (1 + r) value]``, or None for a zero value."""
    return (value * (1 - r), value * (1 + r)) if value > 0 else None


def step_cost_factors(scenario: Scenario, profile: Profile, ranges: Ranges) -> list[Factor]:
    """One factor per non-zero step-cost coefficient."""
    out = [_coefficient_factor(f"step_cost.{k}", profile, ranges, f"±{100 * ranges.prior_range:g} % (stated)")
           for k in StepCost.__dataclass_fields__]
    return [f for f in out if f is not None]


def overhead_factors(scenario: Scenario, profile: Profile, ranges: Ranges) -> list[Factor]:
    """The API-server and gateway means (and per-token growth), and the jitter CV."""
    out = [_coefficient_factor(f"overheads.{k}", profile, ranges, f"±{100 * ranges.prior_range:g} % (stated)")
           for k in ("api_server_s", "api_server_per_token_s", "gateway_s")]
    jitter = _coefficient_factor("overheads.jitter_cv", profile, ranges, "")
    if jitter is None or jitter.source == "":
        lo, hi = ranges.jitter_cv
        jitter = Factor("overheads.jitter_cv", lo, hi, _set_coefficient("overheads.jitter_cv"), "",
                        "stated range")
    return [f for f in out if f is not None] + [jitter]


def _scale_kv(scenario: Scenario, profile: Profile, value: float) -> tuple[Scenario, Profile]:
    engine = replace(profile.engine, num_gpu_blocks=max(2, int(round(profile.engine.num_gpu_blocks * value))))
    memory = profile.memory
    if memory is not None:
        # NOTE: workers sharing a GPU re-derive their blocks from the memory rule: fewer bytes
        # per block give the same relative change there.
        memory = replace(memory, kv_bytes_per_block=max(1, int(round(memory.kv_bytes_per_block / value))))
    return scenario, replace(profile, engine=engine, memory=memory)


def kv_capacity_factors(scenario: Scenario, profile: Profile, ranges: Ranges) -> list[Factor]:
    """KV capacity as a multiplier of ``num_gpu_blocks``."""
    r = ranges.kv_range
    return [Factor("kv_capacity", 1 - r, 1 + r, _scale_kv, "x", f"±{100 * r:g} % of num_gpu_blocks")]


def _set_spread(scenario: Scenario, profile: Profile, value: float) -> tuple[Scenario, Profile]:
    return replace(scenario, arrival_spread_s=value), profile


def start_spread_factors(scenario: Scenario, profile: Profile, ranges: Ranges) -> list[Factor]:
    """The uniform start spread of the requests sent at their timestamps (``arrival_spread_s``)."""
    lo, hi = ranges.arrival_spread_s
    return [Factor("arrival_spread_s", lo, hi, _set_spread, "s", "stated range")]


def _reply_dist(scenario: Scenario) -> Dist:
    reply = scenario.reply
    if reply is None:
        return parse_dist(SEED_CHAT_REPLY if scenario.workload == "seed-chat" else "uniform:50:300")
    if isinstance(reply, tuple):
        return parse_dist(f"uniform:{reply[0]}:{reply[1]}")
    return parse_dist(reply)


def workload_factors(scenario: Scenario, profile: Profile, ranges: Ranges) -> list[Factor]:
    """Where replies stop and how long user turns are (generated workloads only: none for a
    trace file or an inference-perf ``workload_config``, whose lengths are given).

    A lognormal reply stop point (the seed-chat default) varies its median by
    ``±reply_median_range`` and its CV over ``reply_cv``; other reply distributions are left
    alone. Seed-chat user messages become ``normal:MEAN:SD`` with the scenario's mean and SD over
    ``user_sd``. The seed-chat default was fitted to the lab's run (docs/reference/seed-study-fit.md), so these ranges state
    how far that fit might be off.
    """
    if scenario.trace_file is not None or scenario.workload_config is not None:
        return []
    factors = []
    reply = _reply_dist(scenario)
    if reply.kind == "lognormal":
        median = reply.params[0]
        r = ranges.reply_median_range

        def set_median(sc: Scenario, pr: Profile, value: float) -> tuple[Scenario, Profile]:
            current = _reply_dist(sc)
            return replace(sc, reply=f"lognormal:{value:g}:{current.params[1]:g}"), pr

        def set_cv(sc: Scenario, pr: Profile, value: float) -> tuple[Scenario, Profile]:
            current = _reply_dist(sc)
            return replace(sc, reply=f"lognormal:{current.params[0]:g}:{value:g}"), pr

        factors.append(Factor("reply.median_tokens", (1 - r) * median, (1 + r) * median, set_median, "tokens",
                              f"±{100 * r:g} % of the workload's median"))
        factors.append(Factor("reply.cv", *ranges.reply_cv, set_cv, "", "stated range"))
    if scenario.workload == "seed-chat":
        user = parse_dist(SEED_CHAT_USER if scenario.user is None else scenario.user)

        def set_user_sd(sc: Scenario, pr: Profile, value: float, mean: float = user.mean) -> tuple[Scenario, Profile]:
            return replace(sc, user=f"normal:{mean:g}:{value:g}"), pr

        factors.append(Factor("user_tokens.sd", *ranges.user_sd, set_user_sd, "tokens", "stated range"))
    return factors


FactorBuilder = Callable[[Scenario, Profile, Ranges], "list[Factor]"]

FACTOR_GROUPS: dict[str, FactorBuilder] = {
    "step_cost": step_cost_factors,
    "overheads": overhead_factors,
    "kv_capacity": kv_capacity_factors,
    "start_spread": start_spread_factors,
    "workload": workload_factors,
}
"""The default factor groups, in table order. Extension point: add ``name: builder`` here."""


def base_profile(scenario: Scenario) -> Profile:
    """The scenario's profile with its ``max_model_len`` and ``kv_blocks`` overrides applied
    (``Scenario.base_profile``, as ``Scenario.spec`` takes it)."""
    return scenario.base_profile()


def default_factors(scenario: Scenario, profile: Profile | None = None, ranges: Ranges = Ranges(),
                    groups: list[str] | None = None) -> list[Factor]:
    """Every factor of ``groups`` (default: all of :data:`FACTOR_GROUPS`) for the scenario.

    Raises:
        ValueError: an unknown group (listing the valid ones).
    """
    profile = profile or base_profile(scenario)
    groups = list(FACTOR_GROUPS) if groups is None else groups
    check_groups(groups)
    return [f for g in groups for f in FACTOR_GROUPS[g](scenario, profile, ranges)]


def check_groups(groups: list[str]) -> None:
    """Refuse a name that is not one of :data:`FACTOR_GROUPS`.

    Raises:
        ValueError: naming the unknown groups and listing the valid ones.
    """
    unknown = [g for g in groups if g not in FACTOR_GROUPS]
    if unknown:
        raise ValueError(f"unknown factor group(s) {', '.join(unknown)}; valid groups: {', '.join(FACTOR_GROUPS)}")


# --------------------------------------------------------------------------------------------
# Running
# --------------------------------------------------------------------------------------------


def output_names(policies: list[str], metrics: tuple[str, ...] = HEADLINE_METRICS) -> list[str]:
    """Output columns: ``"<policy>:<metric>"`` per policy, then ``"<policy> vs <first>:<metric>"``
    (relative change, percent; for a share, ``SHARE_METRICS``, percentage points, as ``kvroute
    compare`` gives it) per later policy."""
    names = [f"{p}:{m}" for p in policies for m in metrics]
    names += [f"{p} vs {policies[0]}:{m}" for p in policies[1:] for m in metrics]
    return names


@dataclass(frozen=True, slots=True)
class _Point:
    scenario: Scenario
    profile: Profile
    policies: tuple[str, ...]
    rounds: int
    slo: ServiceClass
    closed_loop: bool | None
    trace: Trace | None


def evaluate(point: _Point) -> dict[str, float]:
    """Outputs of one point: each policy's headline metrics averaged over the rounds, and the
    changes of the averages against the first policy (percent; percentage points for a share)."""
    s = point.scenario
    # A generated workload draws its lengths per round (the same draws for every policy).
    traces = [point.trace if point.trace is not None else s.trace(r) for r in range(point.rounds)]
    means: dict[str, dict[str, float]] = {}
    for policy in point.policies:
        spec = s.spec(point.profile, policy=policy, closed_loop=point.closed_loop)
        rows = [summarize(simulate(traces[r], spec, seed=s.seed + r), point.slo) for r in range(point.rounds)]
        means[policy] = {m: float(np.mean([row[m] for row in rows])) for m in HEADLINE_METRICS}
    out = {f"{p}:{m}": means[p][m] for p in point.policies for m in HEADLINE_METRICS}
    first = point.policies[0]
    for p in point.policies[1:]:
        for m in HEADLINE_METRICS:
            base = means[first][m]
            if m in SHARE_METRICS:
                out[f"{p} vs {first}:{m}"] = 100.0 * (means[p][m] - base)
            else:
                out[f"{p} vs {first}:{m}"] = 100.0 * (means[p][m] - base) / base if base else math.nan
    return out


@dataclass
class SensitivityResult:
    """What :func:`run_sensitivity` found.

    Attributes:
        factors: the factors, in design order.
        policies: the policies (the first is the baseline of the change outputs).
        outputs: output column names (:func:`output_names`).
        samples: one row per design point: the factors' values and every output.
        indices: one row per (output, factor): ``mu``, ``mu_star``, ``sigma``, ``mu_star_conf``
            and ``rank`` (1 = largest ``mu_star`` for that output).
        base: every output at the unperturbed scenario, mean over ``noise_rounds`` seeds.
        noise: every output's standard deviation over those seeds (the seed-to-seed noise a
            ``mu_star`` should be read against).
        settings: trajectories, levels, rounds, seed, executor and the scenario.
    """

    factors: list[Factor]
    policies: list[str]
    outputs: list[str]
    samples: pd.DataFrame
    indices: pd.DataFrame
    base: dict[str, float]
    noise: dict[str, float]
    settings: dict[str, Any]

    def ranking(self, output: str) -> list[str]:
        """Factor names by decreasing ``mu_star`` for ``output``."""
        sel = self.indices[self.indices["output"] == output].sort_values("rank")
        return list(sel["factor"])

    def noise_line(self, output: str) -> float:
        """The seed noise of ``output``: its sd over the seeds of the unperturbed scenario, in the
        output's unit (the tornado's dashed line); NaN when unknown (one noise round)."""
        return self.noise.get(output, math.nan)

    def within_noise(self, output: str, factor: str) -> bool:
        """Whether ``factor``'s effect on ``output`` is within the seed noise
        (:func:`within_noise` of its mu*, its ``mu_star_conf`` and :meth:`noise_line`): the table's
        ``?`` and the tornado's hatched bar."""
        row = self.indices[(self.indices["output"] == output) & (self.indices["factor"] == factor)].iloc[0]
        return within_noise(row["mu_star"], row["mu_star_conf"], self.noise_line(output))

    def marked_indices(self) -> pd.DataFrame:
        """``indices`` with a ``within_noise`` column (:func:`within_noise` of each row: the
        tables' ``?`` and the tornado's hatched bars), as ``indices.csv`` and the JSON give them."""
        return self.indices.assign(within_noise=[
            within_noise(row["mu_star"], row["mu_star_conf"], self.noise_line(row["output"]))
            for row in self.indices.to_dict("records")])

    def _cell(self, output: str, row) -> str:
        """A table cell: the signed mu* (:func:`_signed`), with ``?`` when within the seed noise."""
        noisy = within_noise(row["mu_star"], row["mu_star_conf"], self.noise_line(output))
        return _signed(row["mu"], row["mu_star"]) + (NOISE_MARK if noisy else "")

    def table(self, measure: str = "mu_star") -> pd.DataFrame:
        """``measure`` as a factor x output table (factors in design order)."""
        wide = self.indices.pivot(index="factor", columns="output", values=measure)
        return wide.loc[[f.name for f in self.factors], self.outputs]

    def format_table(self, group: str | None = None) -> str:
        """Text tables, one per policy (and per change), rows = factors with their ranges,
        cells = ``mu_star`` signed by ``mu`` (``~`` when the effects' signs disagree, |mu| < mu*/2),
        ending in ``?`` when the effect is within the seed noise (:meth:`within_noise`)."""
        blocks = []
        groups = list(dict.fromkeys(o.split(":")[0] for o in self.outputs))
        for g in groups if group is None else [group]:
            cols = [o for o in self.outputs if o.split(":")[0] == g]
            change = " vs " in g
            header = ["factor", "range"] + [_label(o.split(":")[1], change) for o in cols]
            rows = [header]
            rows.append(["at the base point", "(seed sd)"]
                        + [f"{_fmt(self.base[o])} ({_fmt(self.noise[o])})" for o in cols])
            for f in self.factors:
                cells = [f.name, f"{_fmt(f.low)}..{_fmt(f.high)} {f.unit}".rstrip()]
                for o in cols:
                    row = self.indices[(self.indices["output"] == o) & (self.indices["factor"] == f.name)].iloc[0]
                    cells.append(self._cell(o, row))
                rows.append(cells)
            widths = [max(len(r[c]) for r in rows) for c in range(len(header))]
            lines = [f"{g}{' (change: %, pp for a share)' if change else ''}: mu* per factor (effect of crossing its range)"]
            for k, r in enumerate(rows):
                lines.append("  ".join([r[0].ljust(widths[0]), r[1].ljust(widths[1])]
                                       + [r[c].rjust(widths[c]) for c in range(2, len(r))]))
                if k == 0:
                    lines.append("  ".join("-" * w for w in widths))
            blocks.append("\n".join(lines))
        return "\n\n".join(blocks)

    def report_tables(self) -> list:
        """:meth:`format_table`'s tables for ``report.html`` (``kvroute.sim.study.report.Table``):
        one per policy and per change, a row per factor with its range, then a cell per output
        showing the signed ``mu_star`` (``?`` within the seed noise, as the printed table) and carrying ``data-mu-star``, ``data-mu``, ``data-sigma``
        and ``data-conf`` (``indices.csv``'s values); the first row holds the base point and the
        seed sd (``data-value``, ``data-sd``). Then the factors with their ranges and sources."""
        from kvroute.sim.study.report import Cell, Table

        tables = []
        for g in dict.fromkeys(o.split(":")[0] for o in self.outputs):
            cols = [o for o in self.outputs if o.split(":")[0] == g]
            change = " vs " in g
            rows = [["at the base point", "(seed sd)",
                     *(Cell(f"{_fmt(self.base[o])} ({_fmt(self.noise[o])})",
                            {"value": self.base[o], "sd": self.noise[o]}) for o in cols)]]
            for f in self.factors:
                cells: list = [f.name, f"{_fmt(f.low)}..{_fmt(f.high)} {f.unit}".rstrip()]
                for o in cols:
                    row = self.indices[(self.indices["output"] == o) & (self.indices["factor"] == f.name)].iloc[0]
                    cells.append(Cell(self._cell(o, row),
                                      {"mu-star": row["mu_star"], "mu": row["mu"], "sigma": row["sigma"],
                                       "conf": row["mu_star_conf"]}))
                rows.append(cells)
            header = ["factor", "range", *(_label(o.split(":")[1], change) for o in cols)]
            tables.append(Table(f"{g}{' (change: %, pp for a share)' if change else ''}: mu* per factor (effect of crossing its range; "
                                f"+ raises the output, - lowers it, ~ mixed signs; {NOISE_MARK} {NOISE_RULE})", header, rows,
                                table_id=f"sensitivity-{g.replace(' ', '-')}"))
        tables.append(Table("Factors: the range each input was varied over, and where the range comes from",
                            ["factor", "low", "high", "unit", "source"],
                            [[f.name, Cell(_fmt(f.low), {"value": f.low}), Cell(_fmt(f.high), {"value": f.high}),
                              f.unit, f.source] for f in self.factors], table_id="sensitivity-factors"))
        return tables

    def to_dict(self) -> dict:
        """A JSON-ready dict: settings, factors (with ranges and sources), base, noise, indices
        (:meth:`marked_indices`, each row's ``within_noise`` a bool)."""
        return {
            "settings": self.settings,
            "policies": self.policies,
            "factors": [{"name": f.name, "low": f.low, "high": f.high, "unit": f.unit, "source": f.source}
                        for f in self.factors],
            "base": {k: _num(v) for k, v in self.base.items()},
            "noise_sd": {k: _num(v) for k, v in self.noise.items()},
            "indices": [{k: (_num(v) if isinstance(v, float) else v) for k, v in row.items()}
                        for row in self.marked_indices().to_dict("records")],
        }

    def scenario_text(self) -> str:
        """The scenario in one line, from :attr:`settings` (``"seed-chat: 64 chats x 6 turns |
        4 workers | profile a6000-qwen2.5-7b"``; a trace file is named by its path)."""
        label = self.settings.get("scenario") or {}
        sizes = f"{label.get('chats', '?')} chats x {label.get('turns', '?')} turns"
        source = str(label["trace_file"]) if label.get("trace_file") else f"{label.get('workload', '?')}: {sizes}"
        return f"{source} | {label.get('workers', '?')} workers | profile {self.settings.get('profile', '?')}"

    def figure(self, outputs: list[str] | None = None, top: int | None = None, scenario: str = ""):
        """Tornado plot: per output, a horizontal bar of ``mu_star`` per factor, largest on top,
        red when the factor raises the output (``mu > mu*/2``), blue when it lowers it
        (``mu < -mu*/2``), grey when the signs disagree; the whisker is ``mu_star_conf`` (clipped
        at 0); the dashed line is the seed noise (:meth:`noise_line`), and a bar whose effect is
        within it (:meth:`within_noise`: its whisker reaches the line; the tables' ``?``) is
        hatched.

        Args:
            outputs: outputs to plot, one panel each, a row per policy and per change (default:
                every output a factor moved: a metric no factor moved for any policy, such as a
                hit rate no input changes, loses its column, and an output no factor moved for
                one policy (kv_aware's hit rate) its panel; the title counts those left out,
                whose panels would hold no bar).
            top: show only the ``top`` factors of each panel.
            scenario: the run in one line (default :meth:`scenario_text`); the title names it and
                the policies (``figure_style.scenario_title``).

        Returns:
            A bare matplotlib ``Figure`` (no pyplot state: a notebook shows it with ``display``
            and its backend is left alone). The mu* axes are linear: a tornado ranks the factors,
            and a factor a decade below the largest is one a measurement need not pin down.
        """
        from matplotlib.figure import Figure
        from matplotlib.patches import Patch
        from matplotlib.ticker import MaxNLocator

        from kvroute.sim.study.figure_style import TITLE_WIDTH, figure_title, interval_errors, scenario_title

        left_out = 0
        metrics = HEADLINE_METRICS
        unmoved: set[str] = set()  # panels kept in the grid's place but not drawn
        if not outputs:
            moved = set(self.indices.loc[self.indices["mu_star"].fillna(0.0) > 0, "output"])
            metrics = tuple(m for m in HEADLINE_METRICS if m in {o.split(":")[1] for o in moved}) or HEADLINE_METRICS
            outputs = [o for o in self.outputs if o.split(":")[1] in metrics]
            unmoved = {o for o in outputs if o not in moved} if moved else set()
            left_out = len(self.outputs) - len(outputs) + len(unmoved)
        ncols = min(len(metrics), len(outputs))
        nrows = math.ceil(len(outputs) / ncols)
        n = len(self.factors) if top is None else min(top, len(self.factors))
        # two panels wide at least, so one column still holds the title and the legend's four entries
        fig = Figure(figsize=(4.4 * max(ncols, 2), 1.6 + 0.32 * n * nrows + 0.9 * nrows))
        axes = np.atleast_2d(fig.subplots(nrows, ncols, squeeze=False))
        for ax, out in zip(axes.flat, outputs):
            if out in unmoved:
                fig.delaxes(ax)
                continue
            sel = self.indices[self.indices["output"] == out].sort_values("mu_star").tail(n)
            colors = [TORNADO_COLORS["raises"] if m > 0.5 * s else TORNADO_COLORS["lowers"] if m < -0.5 * s
                      else TORNADO_COLORS["mixed"] for m, s in zip(sel["mu"], sel["mu_star"])]
            mu_star = sel["mu_star"].to_numpy(float)
            conf = sel["mu_star_conf"].to_numpy(float)
            bars = ax.barh(sel["factor"], mu_star, xerr=interval_errors(mu_star, mu_star - conf, mu_star + conf),
                           color=colors, capsize=2)
            noise = self.noise_line(out)
            for bar, star, c in zip(bars, mu_star, conf):
                if within_noise(star, c, noise):
                    bar.set(hatch=NOISE_HATCH, edgecolor="white", linewidth=0)
            if not math.isnan(noise):
                ax.axvline(noise, color="k", ls="--", lw=0.8)
            group, metric = out.split(":")
            change = " vs " in group
            ax.set_title(f"{group}\n{_label(metric, change)}", fontsize=9)
            ax.set_xlabel(f"mu* ({_mu_unit(metric, change)})", fontsize=8)
            ax.set_xlim(left=0)
            # at most five ticks: a panel is 4.4 inches less its factor names, too narrow for 0.005 steps
            ax.xaxis.set_major_locator(MaxNLocator(nbins=4, steps=[1, 2, 2.5, 5, 10]))
            ax.tick_params(axis="y", labelsize=7)
            ax.tick_params(axis="x", labelsize=7)
        for ax in list(axes.flat)[len(outputs):]:
            fig.delaxes(ax)
        handles = [Patch(color=TORNADO_COLORS["raises"], label="raises the output"),
                   Patch(color=TORNADO_COLORS["lowers"], label="lowers it"),
                   Patch(color=TORNADO_COLORS["mixed"], label="mixed signs"),
                   _noise_legend_entry(),
                   Patch(facecolor=TORNADO_COLORS["mixed"], edgecolor="white", linewidth=0, hatch=NOISE_HATCH,
                         label="within the seed noise (whisker reaches the line; ? in the tables)")]
        fig.legend(handles=handles, loc="lower center", ncol=5 if ncols > 2 else 3, fontsize=8)
        what = (f"Morris mu* per input ({self.settings['trajectories']} trajectories, {self.settings['levels']} "
                f"levels, {self.settings['rounds']} round(s) per point): mean |change| of the output across the "
                "input's range" + (f" ({left_out} output(s) no factor moved left out)" if left_out else ""))
        width = int(TITLE_WIDTH * fig.get_figwidth() / 11)  # TITLE_WIDTH fits 11 inches
        figure_title(fig, scenario_title(scenario or self.scenario_text(), self.policies, what, width))
        fig.tight_layout(rect=(0, 0.05, 1, 1))
        return fig

    def plot(self, path=None, outputs: list[str] | None = None, top: int | None = None, scenario: str = ""):
        """:meth:`figure`, written to ``path`` when given (its suffix picks the format: .png,
        .pdf, .svg).

        Returns:
            The matplotlib ``Figure``.
        """
        fig = self.figure(outputs, top, scenario)
        if path is not None:
            fig.savefig(path, dpi=90)
        return fig


NOISE_MARK = "?"
"""Ends a table's mu* cell whose effect is within the seed noise (:func:`within_noise`)."""

NOISE_HATCH = "////"
"""The tornado's hatching of a bar whose effect is within the seed noise."""

NOISE_RULE = ("within the seeds' noise: mu* less its 95% interval (mu* - conf) is at most the seeds' sd, "
              "the tornado's dashed line (its bar hatched, its whisker reaching the line)")
""":func:`within_noise` in words, for the printed notes and the report's captions."""


def within_noise(mu_star: float, conf: float, noise_sd: float) -> bool:
    """Whether an effect is within the seed noise, the one rule of the tables' ``?`` and the
    tornado's hatching: the low end of mu*'s 95 % interval, ``mu_star - conf`` (clipped at 0, as
    the tornado's whisker), is at most ``noise_sd``, the output's sd over the seeds of the
    unperturbed scenario (the tornado's dashed line), so the effect cannot be told from the
    seeds' own spread.

    Args:
        mu_star: the effect's mu*, in the output's unit (percentage points for a change).
        conf: SALib's ``mu_star_conf`` (95 % bootstrap half-width), same unit; NaN counts as 0.
        noise_sd: the seeds' sd of the output, same unit; NaN (one noise round: unknown) gives
            False.

    Returns:
        False for a mu* of exactly 0 (no factor value changed the output: no effect, not noise)
        or NaN, and where the noise is unknown.
    """
    if math.isnan(noise_sd) or math.isnan(mu_star) or mu_star == 0:
        return False
    low = max(mu_star - (0.0 if math.isnan(conf) else conf), 0.0)
    return low <= noise_sd


TORNADO_COLORS = {"raises": "#b2182b", "lowers": "#2166ac", "mixed": "#999999"}
"""Bar colours of the tornado by the sign of the effect (ColorBrewer's RdBu ends and a grey):
darker than the policy palette (``figure_style.PALETTE``) so a bar is not read as a policy."""


def _noise_legend_entry():
    """The legend entry of the seed-noise line."""
    from matplotlib.lines import Line2D

    return Line2D([], [], color="k", ls="--", lw=0.8, label="seed noise (sd)")


def _mu_unit(metric: str, change: bool) -> str:
    """The unit of mu* for ``metric``: the output's own (s; share 0-1 for a hit rate), or for a
    change between policies percentage points (of a change in percent, or of a share)."""
    if change:
        return "pp" if metric in SHARE_METRICS else "percentage points of the change"
    if metric.endswith("_s"):
        return "s"
    if metric == "hit_rate" or metric.endswith("_share"):
        return "share, 0-1"
    return "the output's unit"


def _label(metric: str, change: bool) -> str:
    text = SHORT_LABELS.get(metric, SUMMARY_METRICS.get(metric, metric))
    if not change:
        return text
    return f"{text.replace(' (s)', '')} change {'pp' if metric in SHARE_METRICS else '%'}"


def _fmt(x: float) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    if x == 0:
        return "0"
    return f"{x:.3g}" if 1e-3 <= abs(x) < 1e4 else f"{x:.2e}"


def _signed(mu: float, mu_star: float) -> str:
    if math.isnan(mu_star):
        return "-"
    sign = "+" if mu > 0.5 * mu_star else "-" if mu < -0.5 * mu_star else "~"
    return f"{sign}{_fmt(mu_star)}" if mu_star else "0"


def _num(v) -> float | None:
    try:
        v = float(v)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(v) or math.isinf(v) else v


def run_sensitivity(
    scenario: Scenario,
    policies: list[str] | tuple[str, ...] = DEFAULT_POLICIES,
    factors: list[Factor] | None = None,
    ranges: Ranges = Ranges(),
    trajectories: int = 10,
    levels: int = 4,
    rounds: int = 1,
    seed: int = 0,
    noise_rounds: int = 5,
    profile: Profile | None = None,
    trace: Trace | None = None,
    closed_loop: bool | None = None,
    executor: str = "local",
    max_workers: int | None = None,
    progress: bool = False,
    slo: ServiceClass = ServiceClass(),
) -> SensitivityResult:
    """Morris screening of ``factors`` on ``scenario`` under each of ``policies``.

    Args:
        scenario: the scenario (its ``policy`` is ignored; ``policies`` are run).
        policies: policies; the first is the baseline of the change outputs.
        factors: the factors (default :func:`default_factors` with ``ranges``).
        ranges: stated ranges of the default factors.
        trajectories: Morris trajectories r; the design has ``r * (k + 1)`` points for k factors.
        levels: Morris grid levels p (even; 4 is the usual choice).
        rounds: seeds per point (``scenario.seed + 0 .. rounds - 1``, the same at every point).
        seed: seeds the Morris design and the bootstrap of ``mu_star_conf``.
        noise_rounds: seeds of the unperturbed scenario that give ``base`` and ``noise``.
        profile: the base profile (default: the scenario's, with its ``kv_blocks``).
        trace: a fixed trace (a file); default: the scenario's built-in workload, rebuilt
            whenever a factor changes the scenario.
        closed_loop: as ``ClusterSpec.closed_loop``; None: the scenario's ``replay`` (whose
            ``auto`` is closed loop for traces with sessions).
        executor: ``"local"`` (process pool) or ``"sequential"``.
        max_workers: processes of the pool (default: the CPU count).
        progress: a progress bar on stderr.
        slo: the service class of ``summarize`` (goodput is not an output, so rarely needed).

    Returns:
        A :class:`SensitivityResult`.

    Raises:
        ValueError: no policy, fewer than two factors, duplicate factor names, trajectories < 2,
            levels < 2 or odd, rounds or noise_rounds < 1, an unknown executor, or any simulation error.
    """
    from SALib.sample import morris as morris_sample

    policies = list(policies)
    _check_settings(policies, trajectories, levels, rounds, noise_rounds, executor)
    profile = profile or base_profile(scenario)
    closed_loop = REPLAY_MODES[scenario.replay] if closed_loop is None else closed_loop
    factors = default_factors(scenario, profile, ranges) if factors is None else list(factors)
    names = [f.name for f in factors]
    _check_factor_names(names)
    problem = {"num_vars": len(factors), "names": names, "bounds": [[f.low, f.high] for f in factors]}
    X = morris_sample.sample(problem, trajectories, num_levels=levels, seed=seed)
    unperturbed = _Point(scenario, profile, tuple(policies), rounds, slo, closed_loop, trace)
    noise_points = _noise_points(unperturbed, noise_rounds)
    points = _design_points(unperturbed, factors, X) + noise_points
    results = _evaluate_points(points, executor, max_workers, progress)
    outputs = output_names(policies)
    design = pd.DataFrame(X, columns=names)
    values = pd.DataFrame(results[: len(X)], columns=outputs)
    noise_frame = pd.DataFrame(results[len(X):], columns=outputs)
    rows = _morris_rows(problem, X, values, outputs, levels, seed)
    settings = {"scenario": scenario.label(), "profile": profile.name, "trajectories": trajectories, "levels": levels,
                "rounds": rounds, "noise_rounds": noise_rounds, "seed": seed, "executor": executor,
                "points": len(X), "ranges": asdict(ranges)}
    return SensitivityResult(factors, policies, outputs, pd.concat([design, values], axis=1), pd.DataFrame(rows),
                             {o: float(noise_frame[o].mean()) for o in outputs},
                             {o: float(noise_frame[o].std(ddof=1)) if noise_rounds > 1 else math.nan for o in outputs},
                             settings)


def _check_settings(policies: list[str], trajectories: int, levels: int, rounds: int, noise_rounds: int,
                    executor: str) -> None:
    """Raise ValueError for a setting :func:`run_sensitivity` cannot take, the first in this order:
    no policy, trajectories < 2, levels < 2 or odd, rounds or noise_rounds < 1, an unknown executor."""
    if not policies:
        raise ValueError("sensitivity needs at least one policy")
    if trajectories < 2:
        raise ValueError(f"trajectories must be >= 2, got {trajectories}")
    if levels < 2 or levels % 2:
        raise ValueError(f"levels must be even and >= 2, got {levels}")
    if rounds < 1 or noise_rounds < 1:
        raise ValueError(f"rounds and noise_rounds must be >= 1, got {rounds} and {noise_rounds}")
    if executor not in EXECUTORS:
        raise ValueError(f"unknown executor {executor!r}; valid executors: {', '.join(EXECUTORS)}")


def _check_factor_names(names: list[str]) -> None:
    """Raise ValueError for fewer than two factors or a name given twice."""
    if len(names) < 2:
        raise ValueError("Morris screening needs at least two factors")
    if len(set(names)) != len(names):
        raise ValueError(f"duplicate factor names: {names}")


def _design_points(unperturbed: _Point, factors: list[Factor], X: np.ndarray) -> list[_Point]:
    """One point per row of the Morris design ``X`` (one column per factor, in ``factors``
    order): the factors applied in turn to the unperturbed scenario and profile, the scenario's
    seed kept (every point runs the same seeds)."""
    scenario = unperturbed.scenario
    points = []
    for values in X:
        sc, pr = scenario, unperturbed.profile
        for f, v in zip(factors, values):
            sc, pr = f.apply(sc, pr, float(v))
        points.append(replace(unperturbed, scenario=replace(sc, seed=scenario.seed), profile=pr))
    return points


def _noise_points(unperturbed: _Point, noise_rounds: int) -> list[_Point]:
    """The unperturbed point on seeds ``scenario.seed + 0 .. noise_rounds - 1``, one round each
    (the result's ``base`` and ``noise``)."""
    scenario = unperturbed.scenario
    return [replace(unperturbed, scenario=replace(scenario, seed=scenario.seed + s), rounds=1)
            for s in range(noise_rounds)]


def _evaluate_points(points: list[_Point], executor: str, max_workers: int | None,
                     progress: bool) -> list[dict[str, float]]:
    """Every point's outputs (:func:`evaluate`), in the order of ``points``: in this process
    (``"sequential"``) or on a process pool of ``max_workers`` (default: one per CPU, at most one
    per point; ``kvroute.sim.study.executors.run_tasks``, so Ctrl-C or SIGTERM terminates the
    pool's processes at once); a progress bar of runs (design points and the base point's seeds)
    on stderr when ``progress``."""
    from kvroute.sim.study.progress import progress_bar

    results: list[dict[str, float] | None] = [None] * len(points)

    def done(i: int, outputs: dict[str, float]) -> None:
        results[i] = outputs
        bar.update()

    bar = progress_bar(len(points), "sensitivity", "run", enabled=progress)
    try:
        with interrupts_as_keyboard():
            run_tasks(evaluate, points, done, executor, max_workers=max_workers)
    finally:
        bar.close()
    return results


def _morris_rows(problem: dict[str, Any], X: np.ndarray, values: pd.DataFrame, outputs: list[str], levels: int,
                 seed: int) -> list[dict[str, Any]]:
    """One row per (output, factor), outputs in ``outputs`` order and factors in design order:
    SALib's Morris indices of that output's column of ``values`` (1,000 bootstrap resamples
    seeded ``seed``; all NaN when the column has a non-finite value) and the factor's rank."""
    from SALib.analyze import morris as morris_analyze

    names = problem["names"]
    rows = []
    for out in outputs:
        y = values[out].to_numpy(float)
        if not np.all(np.isfinite(y)):
            res = {k: [math.nan] * len(names) for k in ("mu", "mu_star", "sigma", "mu_star_conf")}
        else:
            res = morris_analyze.analyze(problem, X, y, num_levels=levels, num_resamples=1000, seed=seed,
                                         print_to_console=False)
        rank = _ranks(res["mu_star"])
        for i, name in enumerate(names):
            rows.append({"output": out, "factor": name, "mu": float(res["mu"][i]), "mu_star": float(res["mu_star"][i]),
                         "sigma": float(res["sigma"][i]), "mu_star_conf": float(res["mu_star_conf"][i]),
                         "rank": int(rank[i])})
    return rows


def _ranks(mu_star) -> np.ndarray:
    """Each factor's rank by ``mu_star``: 1 for the largest, ties in factor order, NaN last."""
    order = np.argsort(-np.nan_to_num(np.asarray(mu_star, float), nan=-1.0), kind="stable")
    rank = np.empty(len(order), int)
    rank[order] = np.arange(1, len(order) + 1)
    return rank
