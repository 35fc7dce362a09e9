"""The notes under a sweep's tables that the numbers alone do not say: requests that failed, a KV
cache that turned over, policies that routed alike, a request rate past which every session was
already in flight. The first three are ``kvroute compare``'s
(``kvroute.cli.run_notes``), each naming the grid points it concerns, and read the sweep's rows
(``kvroute.sim.study.sweep.run_scenario``: its counters and ``EXAMPLE_COLUMNS``), not records,
which a sweep does not keep."""

from __future__ import annotations

import math

import pandas as pd

from kvroute.cli.run_notes import (KV_MEMORY_ADVICE, failure_text, named_as_tables,
                                   same_routing_text, turnover)
from kvroute.sim.cluster.metrics import alike_by_point
from kvroute.sim.study.sweep import group_columns, row_failures


def sweep_notes(frame: pd.DataFrame) -> list[str]:
    """The notes of a sweep's rows (``sweep.sweep``'s frame): one per distinct failure of its grid
    points (:func:`failure_notes`), then the turnover, the same-routing and the request-rate
    (:func:`rate_note`) notes, where they apply.
    Rows of runs that could not run (``status = failed``) are left out: the sweep names those."""
    ok = frame[frame["status"] == "ok"] if "status" in frame else frame
    if ok.empty:
        return []
    fields = group_columns(frame)
    grid = _Grid(fields, _points(frame, fields))
    notes = [note for note in (*failure_notes(ok, grid), turnover_note(ok, grid), same_routing_note(ok, grid),
                               rate_note(ok, grid)) if note]
    return named_as_tables(notes, frame["policy"].unique()) if "policy" in frame else notes


class _Grid:
    """A sweep's grid points and how to name a set of them.

    Args:
        fields: the scenario fields that vary (``sweep.group_columns``).
        points: every point, a tuple of its ``fields``' values, in grid order (repeats allowed).
    """

    def __init__(self, fields: list[str], points: list[tuple]) -> None:
        self.fields = fields
        self.points = list(dict.fromkeys(points))
        self.values = [list(dict.fromkeys(p[i] for p in self.points)) for i in range(len(fields))]

    def cover(self, points: list[tuple]) -> list[list[list]]:
        """``points`` (some of the grid's, none repeated) as products of field values: per block,
        per field, the values it takes, in grid order."""
        blocks = [[[v] for v in p] for p in points]
        merged = True
        while merged:  # join the blocks alike in every field but one, until none are, the last (innermost) first
            merged = False
            for i in reversed(range(len(self.fields))):
                joined: dict[tuple, list[list]] = {}
                for block in blocks:
                    key = tuple(tuple(vs) for j, vs in enumerate(block) if j != i)
                    if key in joined:
                        joined[key][i] += block[i]
                        merged = True
                    else:
                        joined[key] = [list(vs) for vs in block]
                blocks = list(joined.values())
        return [[[v for v in values if v in vs] for vs, values in zip(block, self.values)] for block in blocks]

    def name(self, block: list[list]) -> str:
        """A block of :meth:`cover` as ``"workers=4, speedup=1 or 4"``, leaving out a field at every
        value of the grid; "" for the whole grid."""
        return ", ".join(f"{field}={' or '.join(_text(v) for v in vs)}"
                         for field, vs, values in zip(self.fields, block, self.values) if len(vs) < len(values))

    def without(self, field: str) -> _Grid:
        """The grid of the other fields: each point without its ``field``."""
        i = self.fields.index(field)
        return _Grid(self.fields[:i] + self.fields[i + 1:], [p[:i] + p[i + 1:] for p in self.points])

    def where(self, points: list[tuple]) -> list[str]:
        """``points`` named compactly (:meth:`cover`, :meth:`name`); [] for every point of the grid."""
        names = [self.name(block) for block in self.cover(points)]
        return [] if "" in names else names


def _points(frame: pd.DataFrame, fields: list[str]) -> list[tuple]:
    """Each row's grid point: its values of ``fields`` (None for a missing value)."""
    return [tuple(None if isinstance(v, float) and math.isnan(v) else v for v in values)
            for values in frame[fields].itertuples(index=False, name=None)]


def _text(value) -> str:
    """A field's value as a grid point names it: ``4`` for 4.0, ``none`` for a missing value."""
    return "none" if value is None else f"{value:g}" if isinstance(value, float) else str(value)


def failure_notes(ok: pd.DataFrame, grid: _Grid) -> list[str]:
    """``run_notes.failure_text`` per distinct failure: the failed requests of each grid point over
    its rounds, the points that failed alike in one note naming them. ``ok``: the rows of the
    runs that ran."""
    totals: dict[tuple, list] = {}  # point -> [Failures over its rounds, rounds]
    for point, row in zip(_points(ok, grid.fields), ok.to_dict("records")):
        total = totals.setdefault(point, [None, 0])
        failed = row_failures(row)
        total[0] = failed if total[0] is None else total[0] + failed
        total[1] += 1
    alike: dict[tuple, list[tuple]] = {}  # (Failures, rounds) -> its points
    for point, (failed, rounds) in totals.items():
        if failed.failed:
            alike.setdefault((failed, rounds), []).append(point)
    notes = []
    for (failed, rounds), points in alike.items():
        where = " or with ".join(grid.where(points))
        scope = (f"the {rounds} rounds of" if rounds > 1 else "one round of") + " each grid point" + (
            f" with {where}" if where else "")
        notes.append(failure_text(failed, scope, "the tables' latencies there are",
                                  "the tables hold no latencies there"))
    return notes


def turnover_note(ok: pd.DataFrame, grid: _Grid) -> str:
    """``kvroute compare``'s turnover note for the grid points whose runs evicted, on average, at
    least ``run_notes.TURNOVER_NOTE`` times the blocks their workers can cache in: how many times
    over (the least and the most) in each set of such points. ``ok``: the rows of the runs that ran."""
    runs: dict[tuple, list[tuple[int, int]]] = {}  # point -> (evicted, held) of each of its runs
    for point, evicted, held in zip(_points(ok, grid.fields), ok["num_evictions"], ok["cacheable_blocks"]):
        runs.setdefault(point, []).append((int(evicted), int(held)))
    times = {point: turnover(sum(e for e, _ in counts) / len(counts), counts[0][1]) for point, counts in runs.items()}
    over = [point for point in grid.points if times.get(point) is not None]
    if not over:
        return ""
    parts = []
    for block in grid.cover(over):
        inside = [times[p] for p in over if all(v in vs for v, vs in zip(p, block))]
        low, high = f"{min(inside):.1f}", f"{max(inside):.1f}"
        parts.append((low if low == high else f"{low} to {high}", grid.name(block) or "every grid point"))
    (times_over, where), rest = parts[0], parts[1:]
    text = (f"Note: the KV cache turned over: per run (mean over rounds) the workers evicted {times_over} times the "
            f"blocks they can cache in at {where} (vLLM keeps one block of each worker back)")
    for k, (t, w) in enumerate(rest):
        text += f"{'; and' if k == len(rest) - 1 else ';'} {t} times at {w}"
    return (text + f". {KV_MEMORY_ADVICE}; --show num_evictions,cacheable_blocks tables both, and `kvroute compare "
            "--time-series` on a point draws each worker's KV use over time.")


def same_routing_note(ok: pd.DataFrame, grid: _Grid) -> str:
    """``kvroute compare``'s same-routing note for a sweep: a policy that routed every request to the
    worker an earlier policy chose, in every round of a grid point (equal ``route_digest``s),
    with the points where it did. ``ok``: the rows of the runs that ran."""
    if "policy" not in grid.fields:
        return ""
    places = grid.without("policy")
    others = places.fields
    runs = ((point, row["policy"], (row["run_seed"], row["route_digest"]))
            for point, row in zip(_points(ok, others), ok.to_dict("records")))
    pairs: dict[tuple[str, str], list[tuple]] = {}
    for point, alike in alike_by_point(runs).items():
        for pair in alike:
            pairs.setdefault(pair, []).append(point)
    alike = []
    for (policy, first), points in pairs.items():
        where = " and at ".join(places.where(points))
        alike.append((policy, first, f" at {where}" if where else " at every grid point" if others else ""))
    return same_routing_text(alike)


def saturated_points(ok: pd.DataFrame, grid: _Grid) -> list[tuple]:
    """The grid points from whose request rate on the rate raised no concurrency.

    Criterion: at a point's rate and at every higher rate swept with the same other settings,
    every run that ran had all its sessions in flight at once (``peak_sessions ==
    num_sessions``, ``sweep.sessions_in_flight``: each session had started before any ended).
    The peak cannot rise past the number of sessions, so from there a higher rate only starts
    them sooner. A rate whose peak reached it but a higher one's did not is left out (the rate
    still changed the concurrency there). [] when ``request_rate`` is not swept or the rows have
    no session counts (rows written before them).

    Args:
        ok: the rows of the runs that ran.
        grid: the sweep's grid (``request_rate`` in its fields to apply).

    Returns:
        The points (tuples of ``grid.fields``' values), in grid order.
    """
    if "request_rate" not in grid.fields or not {"peak_sessions", "num_sessions"} <= set(ok):
        return []
    full: dict[tuple, bool] = {}  # point -> every run of it had all its sessions in flight at once
    for point, peak, sessions in zip(_points(ok, grid.fields), ok["peak_sessions"], ok["num_sessions"]):
        full[point] = full.get(point, True) and peak == sessions
    i = grid.fields.index("request_rate")
    ranked = sorted((p for p in grid.points if p in full and p[i] is not None), key=lambda p: p[i], reverse=True)
    saturated, broken = [], set()  # broken: other settings where a higher rate fell short
    for point in ranked:  # highest rate first
        others = point[:i] + point[i + 1:]
        if others in broken or not full[point]:
            broken.add(others)
        else:
            saturated.append(point)
    return [p for p in grid.points if p in saturated]


def rate_note(ok: pd.DataFrame, grid: _Grid) -> str:
    """The note naming the request rates from which the rate added no load
    (:func:`saturated_points`), with how to load further: ``--chats``, sessions all at once
    (``--plot-load`` draws a ``--chats`` sweep too); "" when no point is saturated. ``ok``: the
    rows of the runs that ran."""
    points = saturated_points(ok, grid)
    if not points:
        return ""
    where = " or with ".join(grid.where(points)) or "every grid point"
    counts = {int(n) for p, n in zip(_points(ok, grid.fields), ok["num_sessions"]) if p in points}
    n = counts.pop() if len(counts) == 1 else None
    traced = "trace_file" in ok and ok["trace_file"].notna().any()
    more = ("use a trace with more sessions" if traced else
            "sweep --chats without --request-rate (every session at once; --plot-load draws it)"
            + (f", e.g. --chats {n},{2 * n},{4 * n}" if n else ""))
    return (f"Note: the request rate stopped raising the load at {where}: every run there had "
            f"{f'all {n}' if n else 'all its'} sessions in flight at once (peak_sessions = num_sessions), so a higher rate only starts them sooner and adds no "
            f"concurrency. To load the workers further, {more}.")
