"""From the raw rows of a sweep to observations: a measured time and the engine steps behind it.

- **TTFT** (``cold``, ``cached``; a ``cached`` experiment's warm request counts as ``cold``):
  the client's time to first token of one request alone on the engine; steps from
  :func:`~kvroute.calibrate.calibration.steps.prefill_steps`. The engine's own share (queue + prefill time
  from ``/metrics``) is kept beside it, when the server exported it.
- **ITL** (``decode``): the step time of B requests decoding together at context L. Source
  ``"engine"``: the server's mean inter-token latency over the experiment
  (``vllm:inter_token_latency_seconds`` sum / count; every gap of every stream, at mean context
  ``L + T/2``). Source ``"stream"``: from the client's per-token arrival times, the median over
  the B streams of each stream's mean gap inside the window where all B decode.
- **ITL** (``mixed``): the step that runs B decodes and an arriving cold prompt together.
  Engine source: the prompt's prefill time (scheduled to first token) from ``/metrics``; stream
  source: the decode streams' gap that ends with the prompt's first token.

``itl_source="auto"`` takes the engine's numbers where the server exported them. On a small
machine the API server may not keep up with the token rate of a large decode batch and then
delivers tokens in bursts: the stream's per-token times then show the API server's pace, not the
engine's steps (seen on the 2-core CPU box at B >= 8 with the tiny model's ~1.5 ms steps).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

import numpy as np
import pandas as pd

from kvroute.traces.inputs import JSON_DECODER, SECONDS, DuplicateKeyError, InputError, describe
from kvroute.calibrate.calibration.sweep_files import EXPERIMENT_COLUMNS, REQUEST_COLUMNS, TEXT_COLUMNS
from kvroute.calibrate.live.client import ServerInfo, kv_blocks_alike
from kvroute.calibrate.calibration.steps import Step, decode_context, decode_step, mixed_steps, prefill_steps
from kvroute.sim.engine.config import EngineConfig

TTFT_KINDS = ("cold", "cached")
ITL_KINDS = ("decode", "mixed")


@dataclass(frozen=True, slots=True)
class Observation:
    """One measured time and the steps that explain it.

    Attributes:
        exp_id: experiment (hold-out splits keep an experiment's observations together).
        kind: ``cold``, ``cached``, ``decode`` or ``mixed``.
        measured_s: client-side time: TTFT for ``cold``/``cached``, a step gap for the others, s.
        steps: the engine steps the simulator's scheduler runs for it.
        engine_s: the engine's own share from ``/metrics`` (queue + prefill for TTFT), s; NaN
            when unknown.
        overhead_s: ``measured_s - engine_s`` for TTFT (API-server time), s; NaN otherwise.
        desc: experiment parameters for reports (prompt_len, prefix_len, batch, context, ...).
    """

    exp_id: int
    kind: str
    measured_s: float
    steps: tuple[Step, ...]
    engine_s: float = math.nan
    overhead_s: float = math.nan
    desc: dict = field(default_factory=dict)

    @property
    def metric(self) -> str:
        """``"ttft"`` or ``"itl"``."""
        return "ttft" if self.kind in TTFT_KINDS else "itl"

    @property
    def config(self) -> tuple:
        """The experiment's shape without its repetition: repetitions of one configuration are
        held out together and compared by their median."""
        d = self.desc
        if self.kind in TTFT_KINDS:
            return (self.kind, d.get("prompt_len"), d.get("prefix_len"))
        if self.kind == "decode":
            return (self.kind, d.get("batch"), d.get("context_len"))
        return (self.kind, d.get("batch"), d.get("context_len"), d.get("prefill_len"))


def load_sweep(run_dir: str | Path) -> tuple[dict, list[ServerInfo], pd.DataFrame, pd.DataFrame]:
    """Read a sweep's ``meta.json``, ``requests.csv`` and ``experiments.csv`` (or their Parquet
    copies when the CSV files are gone).

    Returns:
        ``(meta, servers, requests, experiments)``; the DataFrames may be empty.

    Raises:
        FileNotFoundError: no ``meta.json`` or ``requests.csv`` in ``run_dir``.
        InputError (a ValueError): ``meta.json`` is not JSON, not an object, or a server entry
            is invalid, or a numeric column of the tables holds something else; the message
            names the file (and line or field).
    """
    d = Path(run_dir)

    def table(stem: str, numbers: tuple[str, ...]) -> pd.DataFrame | None:
        csv, pq = d / f"{stem}.csv", d / f"{stem}.parquet"
        if csv.is_file() and csv.stat().st_size > 0:
            return _numeric(pd.read_csv(csv), numbers, csv, first_line=2)
        if pq.is_file():
            return _numeric(pd.read_parquet(pq), numbers, pq)
        return None

    req = table("requests", REQUEST_NUMBERS)
    if not (d / "meta.json").is_file() or req is None:
        raise FileNotFoundError(
            f"{d} holds no sweep (meta.json and requests.csv or .parquet); run 'kvroute calibrate measure' first"
        )
    where = str(d / "meta.json")
    try:
        meta = JSON_DECODER.decode((d / "meta.json").read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise InputError(f"not valid JSON: {exc.msg} (column {exc.colno})", where, exc.lineno) from None
    except DuplicateKeyError as exc:  # json would keep the last value silently
        raise InputError(exc.reason, where, None, exc.field) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"cannot read it: {exc}", where) from None
    except ValueError as exc:  # an int of over 4300 digits; nested too deep
        raise InputError(f"not valid JSON: {' '.join(str(exc).split(';')[0].split())}", where) from None
    if type(meta) is not dict:
        raise InputError(f"expected a JSON object, got {describe(meta)}", where)
    entries = meta.get("servers") or []
    if type(entries) is not list:
        raise InputError(f"expected a list of servers, got {describe(entries)}", where, None, "servers")
    servers = [ServerInfo.from_dict(s, f"{where}: servers[{i}]") for i, s in enumerate(entries)]
    exp = table("experiments", EXPERIMENT_NUMBERS)
    return meta, servers, req, exp if exp is not None else pd.DataFrame()


SAME_ENGINE = ("model", "block_size", "num_gpu_blocks", "max_num_batched_tokens", "max_num_seqs", "max_model_len",
               "enable_prefix_caching", "long_prefill_token_threshold")
"""``ServerInfo`` fields that must agree between sweeps pooled by :func:`load_sweeps`: each one
exactly, except ``num_gpu_blocks``, which may differ by ``client.KV_BLOCKS_TOLERANCE`` (servers
restarted between the sweeps find a few blocks more or less, as servers started one after
another in one sweep do)."""


def load_sweeps(run_dirs) -> tuple[dict, list[ServerInfo], pd.DataFrame, pd.DataFrame]:
    """Several sweeps of one arrangement, pooled as one (:func:`load_sweep` of each).

    Sweeps taken on the same servers at different times scatter differently (the host's load,
    which server won the cores): pooling them averages that out of one fit. The second sweep's
    experiment ids are offset past the first's (and so on), so experiments stay apart; a
    ``sweep`` column (0, 1, ...) says where each row came from. The meta data is the first
    sweep's, with ``finished`` of the last and ``sweeps`` listing every folder.

    Args:
        run_dirs: sweep folders (one or more).

    Returns:
        ``(meta, servers, requests, experiments)`` as :func:`load_sweep` gives them.

    Raises:
        FileNotFoundError, InputError: as :func:`load_sweep`, for the folder at fault.
        InputError: no folder, a folder given twice or a copy of the first sweep (same start
            time), or sweeps of different engines (model, block size, token budget, block counts
            more than ``client.KV_BLOCKS_TOLERANCE`` apart, ...) or of a different number of servers;
            names the folder and the field.
    """
    dirs = [Path(d) for d in run_dirs]
    if not dirs:
        raise InputError("no sweep folder given", "calibrate fit")
    seen = {}
    for d in dirs:
        if d.resolve() in seen:
            raise InputError(f"given twice (also as {seen[d.resolve()]}): its rows would count double", str(d))
        seen[d.resolve()] = d
    meta, servers, req, exp = load_sweep(dirs[0])
    if len(dirs) == 1:
        return meta, servers, req, exp
    reqs, exps = [req.assign(sweep=0)], [exp.assign(sweep=0)] if len(exp) else []
    offset = _next_exp_id(req, exp)
    starts = {meta.get("started"): dirs[0]}
    for k, d in enumerate(dirs[1:], start=1):
        m, s, r, e = load_sweep(d)
        where = str(d / "meta.json")
        if m.get("started") is not None and m.get("started") in starts:
            raise InputError(f"the same sweep as {starts[m['started']]} (both started {m['started']}): its rows would "
                             "count double", where, None, "started")
        starts[m.get("started")] = d
        if len(m.get("urls") or []) != len(meta.get("urls") or []):
            raise InputError(f"{len(m.get('urls') or [])} servers, where {dirs[0]} has {len(meta.get('urls') or [])}: "
                             "pool sweeps of one arrangement only", where, None, "urls")
        if s and servers:
            for name in SAME_ENGINE:
                a, b = getattr(servers[0], name), getattr(s[0], name)
                if a != b and not (name == "num_gpu_blocks" and kv_blocks_alike(a, b)):
                    raise InputError(f"{name} {b!r}, where {dirs[0]} has {a!r}: pool sweeps of one engine only",
                                     where, None, f"servers[0].{name}")
        reqs.append(r.assign(sweep=k, exp_id=r["exp_id"] + offset))
        if len(e):
            exps.append(e.assign(sweep=k, exp_id=e["exp_id"] + offset))
        offset += _next_exp_id(r, e)
    pooled = dict(meta, finished=m.get("finished"), sweeps=[str(d) for d in dirs])
    return pooled, servers, pd.concat(reqs, ignore_index=True), (pd.concat(exps, ignore_index=True) if exps
                                                                  else pd.DataFrame())


def _next_exp_id(req: pd.DataFrame, exp: pd.DataFrame) -> int:
    """One past the largest experiment id of a sweep's tables (0 when both are empty)."""
    ids = [int(t["exp_id"].max()) for t in (req, exp) if len(t) and "exp_id" in t and t["exp_id"].notna().any()]
    return max(ids, default=-1) + 1


REQUEST_NUMBERS = tuple(c for c in REQUEST_COLUMNS if c not in TEXT_COLUMNS)
EXPERIMENT_NUMBERS = tuple(c for c in EXPERIMENT_COLUMNS if c not in TEXT_COLUMNS)
"""Numeric columns of a sweep's tables (the columns ``kvroute.calibrate.calibration.sweep_files``
lists, less its ``TEXT_COLUMNS``); an empty cell is a missing value."""


def _numeric(df: pd.DataFrame, numbers: tuple[str, ...], where: Path, first_line: int | None = None) -> pd.DataFrame:
    """``df`` with every column of ``numbers`` it has as numbers, its ``token_times`` checked.

    Raises:
        InputError: a cell that is neither empty nor a number, or a ``token_times`` cell that is
            not finite numbers (:func:`token_times`); names the file, the line (for a CSV file
            whose first data row is on ``first_line``) and the column.
    """
    if "token_times" in df:
        for i, text in enumerate(df["token_times"]):
            try:
                token_times(text)
            except ValueError as exc:
                raise InputError(str(exc), str(where), None if first_line is None else first_line + i,
                                 "token_times") from None
    for col in numbers:
        if col not in df:
            continue
        if not pd.api.types.is_numeric_dtype(df[col]):
            values = pd.to_numeric(df[col], errors="coerce")
            bad = np.flatnonzero((df[col].notna() & values.isna()).to_numpy())
            if len(bad):
                i = int(bad[0])
                raise InputError(f"expected a number, got {df[col].iloc[i]!r}", str(where),
                                 None if first_line is None else first_line + i, col)
            df[col] = values
        if col.endswith("_s"):  # times: finite and within SECONDS' bound (NaN: not measured)
            times = df[col].to_numpy(float)
            bad = np.flatnonzero(np.isinf(times) | (np.abs(np.nan_to_num(times)) > SECONDS.maximum))
            if len(bad):
                i = int(bad[0])
                raise InputError(f"must be a finite number of seconds within +-{SECONDS.maximum:g}, got "
                                 f"{float(times[i])!r}", str(where),
                                 None if first_line is None else first_line + i, col)
    df.attrs["source"] = str(where)
    return df


def engine_config(info: ServerInfo) -> EngineConfig:
    """The simulator's engine settings for a measured server (async scheduling as the server
    reported it, or its release's default; off when unknown)."""
    flags = ({"async_scheduling": bool(getattr(info, "async_scheduling", None))}
             if "async_scheduling" in EngineConfig.__dataclass_fields__ else {})
    return EngineConfig(
        block_size=info.block_size,
        num_gpu_blocks=max(info.num_gpu_blocks, 2),
        max_num_batched_tokens=info.max_num_batched_tokens,
        max_num_seqs=info.max_num_seqs,
        max_model_len=info.max_model_len,
        long_prefill_token_threshold=info.long_prefill_token_threshold,
        **flags,
    )


def token_times(text) -> np.ndarray:
    """A ``token_times`` cell of a sweep's requests: each output token's arrival, s after the
    send (space-separated); empty for an empty or missing cell.

    Raises:
        ValueError: an entry that is not a finite number (the message quotes it).
    """
    if not isinstance(text, str) or not text.strip():
        return np.zeros(0)
    try:
        times = np.array(text.split(), float)
    except ValueError:
        bad = next(x for x in text.split() if not _is_number(x))
        raise ValueError(f"expected space-separated seconds, got {bad!r}") from None
    if not np.isfinite(times).all():
        raise ValueError(f"expected finite seconds, got {float(times[~np.isfinite(times)][0])!r}")
    return times


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _f(x) -> float:
    try:
        v = float(x)
    except (TypeError, ValueError):
        return math.nan
    return v


def _ok(row) -> bool:
    return not (isinstance(row.get("error"), str) and row.get("error"))


MEASUREMENT_ERROR = "measurement error"
"""How an ``error`` cell marks a request whose answer was whole but whose counts are impossible
(``kvroute.calibrate.live.stream``), and how :func:`mark_measurement_errors` marks such rows."""


def _column(df: pd.DataFrame, name: str) -> np.ndarray:
    if name not in df:
        return np.full(len(df), np.nan)
    return pd.to_numeric(df[name], errors="coerce").to_numpy(float)


def mark_measurement_errors(requests: pd.DataFrame) -> tuple[pd.DataFrame, str | None]:
    """Mark the request rows no real server can have produced as measurement errors.

    Impossible: more ``cached_tokens`` than the prompt's tokens (``prompt_len``, else the usage's
    ``prompt_tokens``), or more output tokens (``n_tokens``, or the ``token_times`` streamed)
    than the request's ``max_tokens``. Their ``error`` cell gets ``"measurement error: ..."``
    (rows already so marked by the live client are kept as they are), so every later rule leaves
    them out like a failed request.

    Returns:
        The table (a copy when a row was marked) and a summary note counting the rows marked by
        the client or here (None when there is none).
    """
    if requests.empty:
        return requests, None
    prompt = _column(requests, "prompt_len")
    prompt = np.where(np.isnan(prompt), _column(requests, "prompt_tokens"), prompt)
    cached = _column(requests, "cached_tokens")
    max_tokens = _column(requests, "max_tokens")
    output = _column(requests, "n_tokens")
    if "token_times" in requests:
        streamed = np.array([len(t.split()) if isinstance(t, str) else np.nan for t in requests["token_times"]])
        output = np.fmax(output, streamed)
    with np.errstate(invalid="ignore"):
        too_cached = cached > prompt
        too_long = output > max_tokens
    errors = requests["error"] if "error" in requests else pd.Series([None] * len(requests), index=requests.index)
    marked = errors.map(lambda e: isinstance(e, str) and e.startswith(MEASUREMENT_ERROR)).to_numpy(bool)
    new = (too_cached | too_long) & ~marked
    if new.any():
        requests = requests.copy()
        errors = errors.astype(object).copy()
        for i in np.flatnonzero(new):
            why = (f"{int(cached[i])} cached tokens for a {int(prompt[i])}-token prompt" if too_cached[i]
                   else f"{int(output[i])} output tokens for max_tokens {int(max_tokens[i])}")
            errors.iloc[i] = f"{MEASUREMENT_ERROR}: {why}"
        requests["error"] = errors
    count = int((marked | new).sum())
    if not count:
        return requests, None
    first = errors.iloc[int(np.flatnonzero(marked | new)[0])]
    return requests, (f"{count} request row(s) left out as measurement errors (counts no server can give: "
                      f"cached tokens above the prompt, or more tokens than max_tokens); first: {first}")


def build_observations(
    requests: pd.DataFrame, experiments: pd.DataFrame, engine: EngineConfig, itl_source: str = "auto"
) -> tuple[list[Observation], list[str]]:
    """Observations of a sweep, and notes about rows left out (errors, unexpected cache hits,
    streams too short to show a steady window); impossible counts are measurement errors
    (:func:`mark_measurement_errors`, whose count is the first note).

    Args:
        requests, experiments: the sweep's tables (:func:`load_sweep`).
        engine: the measured engine's settings.
        itl_source: ``"auto"``, ``"engine"`` or ``"stream"`` (see the module doc).

    Raises:
        ValueError: the requests table lacks a required column, or a bad ``itl_source``.
    """
    if itl_source not in ("auto", "engine", "stream"):
        raise ValueError(f"itl_source must be 'auto', 'engine' or 'stream', got {itl_source!r}")
    need = {"exp_id", "kind", "role", "prompt_len", "prefix_len", "max_tokens", "ttft_s", "token_times", "t_send_s"}
    missing = need - set(requests.columns)
    if missing:
        where = requests.attrs.get("source", "the requests table")
        raise InputError(f"lacks the column(s) {', '.join(sorted(missing))} (calibrate measure writes them)", where)
    # a small scheduler replay per distinct experiment shape
    pf = lru_cache(maxsize=None)(lambda L, P: tuple(prefill_steps(engine, L, P)))
    mx = lru_cache(maxsize=None)(lambda B, L, P0, a, P: tuple(mixed_steps(engine, B, L, P0, a, P)))
    obs: list[Observation] = []
    requests, summary = mark_measurement_errors(requests)
    notes: list[str] = [] if summary is None else [summary]
    exp_by_id = {int(r["exp_id"]): r for _, r in experiments.iterrows()} if len(experiments) else {}

    for _, row in requests[requests["role"].isin(["cold", "warm", "cached"])].iterrows():
        if not _ok(row) or not (_f(row["ttft_s"]) > 0):
            notes.append(f"exp {row['exp_id']}: request failed or sent no token; left out")
            continue
        L, P = int(row["prompt_len"]), int(row["prefix_len"])
        cached, expected = _f(row.get("cached_tokens")), _f(row.get("expected_cached"))
        if not math.isnan(cached) and not math.isnan(expected) and cached != expected:
            notes.append(
                f"exp {row['exp_id']} ({row['role']}, {L} tokens): {int(cached)} cached tokens, expected "
                f"{int(expected)}; left out (was the prefix cache reset before the sweep?)"
            )
            continue
        eng = _f(row.get("engine_prefill_s")) + _f(row.get("engine_queue_s"))
        kind = "cached" if row["role"] == "cached" else "cold"
        obs.append(Observation(int(row["exp_id"]), kind, float(row["ttft_s"]), pf(L, P), eng,
                               float(row["ttft_s"]) - eng, dict(prompt_len=L, prefix_len=P)))

    dec = requests[requests["role"] == "decode"]
    for exp_id, grp in dec.groupby("exp_id"):
        kind = grp["kind"].iloc[0]
        if not all(_ok(r) for _, r in grp.iterrows()):
            notes.append(f"exp {exp_id} ({kind}): a request failed; left out")
            continue
        B = len(grp)
        tabs = [float(r["t_send_s"]) + token_times(r["token_times"]) for _, r in grp.iterrows()]
        plens = [int(r["prompt_len"]) for _, r in grp.iterrows()]
        if any(len(t) < 3 for t in tabs):
            notes.append(f"exp {exp_id} ({kind}): a stream had fewer than 3 tokens; left out")
            continue
        erow = exp_by_id.get(int(exp_id))
        itl_engine = _f(erow.get("itl_engine_s")) if erow is not None else math.nan
        T = int(grp["max_tokens"].iloc[0])
        if kind == "decode":
            use_engine = itl_source == "engine" or (itl_source == "auto" and itl_engine > 0)
            if use_engine and not itl_engine > 0:
                notes.append(f"exp {exp_id} (decode): the server exported no inter-token latency; left out")
                continue
            o = _decode_obs(int(exp_id), tabs, plens, B, itl_engine, T if use_engine else None)
        else:
            pfr = requests[(requests["exp_id"] == exp_id) & (requests["role"] == "prefill")]
            if pfr.empty or not _ok(pfr.iloc[0]) or not (_f(pfr.iloc[0]["ttft_s"]) > 0):
                notes.append(f"exp {exp_id} (mixed): the arriving prompt failed; left out")
                continue
            pf_engine = _f(pfr.iloc[0].get("engine_prefill_s"))
            use_engine = itl_source == "engine" or (itl_source == "auto" and pf_engine > 0)
            if use_engine and not pf_engine > 0:
                notes.append(f"exp {exp_id} (mixed): no prefill-time sample of the arriving prompt; left out")
                continue
            o = _mixed_obs(int(exp_id), tabs, plens, B, pfr.iloc[0], engine, mx, pf_engine if use_engine else None)
        if not isinstance(o, str) and not o.measured_s > 0:
            o = "the streams delivered its tokens in one burst (no measurable gap)"
        if isinstance(o, str):
            notes.append(f"exp {exp_id} ({kind}): {o}; left out")
        else:
            obs.append(o)
    return obs, notes


def _decode_obs(exp_id: int, tabs: list[np.ndarray], plens: list[int], B: int, itl_engine: float,
                engine_tokens: int | None):
    if engine_tokens is not None:
        # every gap a = 1..T-1 of every stream: the step producing arrival a reads L + a tokens
        ctx = sum(decode_context(L, engine_tokens / 2) for L in plens)
        return Observation(exp_id, "decode", itl_engine, (decode_step(B, ctx),), itl_engine, math.nan,
                           dict(batch=B, context_len=int(np.mean(plens)), mean_context=ctx / B, source="engine"))
    t_start = max(t[0] for t in tabs)
    t_end = min(t[-1] for t in tabs)
    slopes, ctx = [], 0.0
    for t, L in zip(tabs, plens):
        idx = np.nonzero((t >= t_start - 1e-9) & (t <= t_end + 1e-9))[0]
        if len(idx) < 3:
            return "fewer than 3 tokens of every stream fall in the window where all decode"
        j1, j2 = int(idx[0]), int(idx[-1])
        slopes.append((t[j2] - t[j1]) / (j2 - j1))
        ctx += decode_context(L, (j1 + 1 + j2) / 2)
    return Observation(exp_id, "decode", float(np.median(slopes)), (decode_step(B, ctx),), itl_engine, math.nan,
                       dict(batch=B, context_len=int(np.mean(plens)), mean_context=ctx / B, source="stream"))


def _mixed_obs(exp_id, tabs, plens, B, pfrow, engine, mx, pf_engine):
    t_pf = float(pfrow["t_send_s"]) + float(pfrow["ttft_s"])
    P = int(pfrow["prompt_len"])
    stars = []
    for t in tabs:
        a = int(np.argmin(np.abs(t - t_pf)))
        if a >= len(t) - 1:
            return "the decodes were not running when the prompt's first token came"
        if a < 1 and pf_engine is None:
            return "the prompt's first token came before the decodes' second"
        stars.append(max(a, 1))
    a_med = int(round(float(np.median(stars))))
    L = plens[0]
    P0 = L - engine.block_size
    steps = mx(B, L, P0, a_med, P)
    n = len(steps)
    desc = dict(batch=B, context_len=L, prefill_len=P, outputs_before=a_med)
    if pf_engine is not None:
        return Observation(exp_id, "mixed", pf_engine, steps, pf_engine, math.nan, {**desc, "source": "engine"})
    gaps = [t[a] - t[a - n] for t, a in zip(tabs, stars) if a - n >= 0]
    if not gaps:
        return "too few decode tokens before the prompt arrived"
    return Observation(exp_id, "mixed", float(np.median(gaps)), steps, math.nan, math.nan, {**desc, "source": "stream"})


def observations_frame(obs: list[Observation]) -> pd.DataFrame:
    """One row per observation (for reports): exp_id, kind, metric, measured_s, engine_s,
    overhead_s, the step sums (steps, tokens, reqs, pairs, ctx) and the descriptors."""
    rows = []
    for o in obs:
        rows.append(dict(
            exp_id=o.exp_id, kind=o.kind, metric=o.metric, measured_s=o.measured_s, engine_s=o.engine_s,
            overhead_s=o.overhead_s, steps=len(o.steps), tokens=sum(s.tokens for s in o.steps),
            reqs=sum(s.reqs for s in o.steps), pairs=sum(s.pairs for s in o.steps),
            ctx=sum(s.ctx for s in o.steps), **o.desc,
        ))
    return pd.DataFrame(rows)
