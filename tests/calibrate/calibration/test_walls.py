"""A fit that says when it hits a wall (kvroute.calibrate.calibration.walls): a synthetic fit with
a known answer, a term pinned at its bound reported with what the data asked for, and repeated
experiments that scatter by more than 2x named and resampled."""

from __future__ import annotations

import math

import numpy as np
import pytest

from kvroute.calibrate.calibration.fit import bootstrap_coefficients, fit, profile_document
from kvroute.calibrate.calibration.observations import Observation
from kvroute.calibrate.calibration.steps import COEFFICIENTS, decode_context, decode_step, design_row, prefill_steps
from kvroute.calibrate.calibration.walls import (Scatter, Wall, asked_beyond, burst_scatter, repeat_scatter,
                                                 scattered_configs)
from kvroute.sim.engine.config import EngineConfig

ENGINE = EngineConfig(block_size=32, num_gpu_blocks=65536, max_num_batched_tokens=2048, max_num_seqs=128,
                      max_model_len=32768)
API_S = 4e-3


def _observations(coef: dict[str, float], noise: float = 0.0, seed: int = 0, reps: int = 2) -> list[Observation]:
    """Cold prefills and decode steps timed by the linear step model with coefficients ``coef``
    (no weight floor; any sign, so the data can ask for a negative one), TTFT plus ``API_S``,
    times a lognormal factor of CV ``noise``."""
    rng = np.random.default_rng(seed)
    x = np.array([coef.get(k, 0.0) for k in COEFFICIENTS])
    f = (lambda: float(rng.lognormal(0, noise))) if noise else (lambda: 1.0)
    obs, e = [], 0
    for _ in range(reps):
        for L in (32, 64, 128, 256, 512, 1024, 2048, 4096, 8192):
            st = tuple(prefill_steps(ENGINE, L, 0))
            eng = float(design_row(list(st), None) @ x) * f()
            obs.append(Observation(e, "cold", eng + API_S, st, eng, API_S, dict(prompt_len=L, prefix_len=0)))
            e += 1
        for ctx in (128, 1024, 4096):
            for B in (1, 2, 4, 8, 16, 32, 64):
                st = (decode_step(B, B * decode_context(ctx, 32)),)
                t = float(design_row(list(st), None) @ x) * f()
                obs.append(Observation(e, "decode", t, st, t, math.nan, dict(batch=B, context_len=ctx)))
                e += 1
    return obs


KNOWN = {"step_overhead_s": 1.5e-3, "per_token_s": 1.0e-5, "per_request_s": 2.0e-5, "prefill_attn_s": 6.0e-9,
         "decode_attn_s": 2.0e-8}


def test_a_synthetic_fit_recovers_known_coefficients_and_reports_no_wall():
    """Without noise every coefficient exactly (the per-prompt-token admission term off: it is
    collinear with per_token_s on cold prompts alone); with 1 % noise the per-token and attention
    terms within 5 %; no term at a bound either way."""
    exact = fit(_observations(KNOWN), holdout=0.25, seed=0, overhead="metrics", loss="linear", folds=0,
                per_token_overhead=False)
    for k, want in KNOWN.items():
        assert getattr(exact.cost, k) == pytest.approx(want, rel=1e-6), k
    assert exact.walls == [] and "AT BOUND" not in exact.summary()
    noisy = fit(_observations(KNOWN, noise=0.01, seed=4), holdout=0.25, seed=0, overhead="metrics", loss="linear",
                folds=0, per_token_overhead=False)
    for k in ("per_token_s", "prefill_attn_s", "decode_attn_s"):
        assert getattr(noisy.cost, k) == pytest.approx(KNOWN[k], rel=0.05), k
    assert noisy.walls == []


def test_a_coefficient_the_data_want_negative_is_at_its_bound_with_the_asked_for_value():
    """The true per-request cost is -30 us (the steps shorten with each request: a term the model
    lacks). At the true other coefficients and that one on its bound 0, the refit without the
    bound gives -30 us (the data are exactly linear); the fit itself leaves it at 0 and names it,
    in its summary and the profile's fit_notes."""
    from kvroute.calibrate.calibration.walls import cost_walls
    from kvroute.sim.timing.cost_model import StepCost

    truth = dict(KNOWN, per_request_s=-3.0e-5)
    obs = _observations(truth)
    pinned = StepCost(**{k: max(truth.get(k, 0.0), 0.0) for k in COEFFICIENTS})
    (wall,) = cost_walls(obs, None, pinned, "metrics", per_token_overhead=False)
    assert (wall.term, wall.side, wall.bound, wall.value) == ("step_cost.per_request_s", "lower", 0.0, 0.0)
    assert wall.asked_for == pytest.approx(-3.0e-5, rel=1e-4)
    assert wall.loss_asked == pytest.approx(0.0, abs=1e-9) and wall.loss_at_bound > 1e-3
    res = fit(obs, holdout=0.25, seed=0, overhead="metrics", loss="linear", folds=0, per_token_overhead=False)
    assert res.cost.per_request_s == 0.0
    (found,) = [w for w in res.walls if w.term == "step_cost.per_request_s"]
    assert found.asked_for < 0  # at the fit's own weight floor the data still ask for less than 0
    assert "AT BOUND: step_cost.per_request_s = 0 on its lower bound 0" in res.summary()
    doc = profile_document(res, _info(), {}, "walls")
    (noted,) = [w for w in doc["fit_notes"]["at_bound"] if w["term"] == "step_cost.per_request_s"]
    assert noted["asked_for"] < 0 and noted["bound"] == 0.0


def _info():
    from kvroute.calibrate.live.client import ServerInfo

    return ServerInfo(url="http://x:1", model="m", model_root="/m", served_models=("m",), vllm_version="0.32.0",
                      max_model_len=32768, block_size=32, num_gpu_blocks=65536, enable_prefix_caching=True,
                      max_num_batched_tokens=2048, max_num_seqs=128, hardware="CPU", device="cpu")


def test_an_upper_bound_wall_reports_what_the_loss_asks_for():
    """A term whose loss is least at 9.6, fitted under a bound of 4: asked_beyond finds 9.6 (to
    the search's tolerance, 1 % of the bound) with the losses at both."""
    asked, at_bound, there = asked_beyond(lambda c: (c - 9.6) ** 2 + 1.0, 4.0)
    assert asked == pytest.approx(9.6, abs=0.04) and at_bound == pytest.approx(32.36) and there == pytest.approx(1.0, abs=2e-3)
    # a loss least inside the bound asks for the bound itself
    assert asked_beyond(lambda c: (c - 1.0) ** 2, 4.0) == (4.0, 9.0, 9.0)


def test_burst_contention_on_its_bound_is_named_with_the_asked_for_value():
    from kvroute.calibrate.calibration.bursts import CONTENTION_BOUND, burst_walls

    x = np.array([1e-3, 1e-4, 0.0, CONTENTION_BOUND])
    scale = np.array([5e-3, 1e-4, 1e-4])
    walls = burst_walls(lambda z: (z[3] - 9.6) ** 2, x, scale, objective=(CONTENTION_BOUND - 9.6) ** 2)
    by = {w.term: w for w in walls}
    assert by["host.contention"].asked_for == pytest.approx(9.6, abs=0.04) and by["host.contention"].side == "upper"
    assert by["frontend.per_step_s"].side == "lower" and by["frontend.per_step_s"].asked_for is None
    assert "frontend.per_request_s" not in by  # 0.2 of its range: inside
    assert burst_walls(lambda z: 0.0, np.array([1e-3, 1e-4, 1e-4, 1.0]), scale, objective=0.0) == []


def test_repeats_scattering_more_than_2x_are_named_and_widen_the_bootstrap():
    obs = _observations(KNOWN)
    # experiment 3 (cold, 256 tokens, first repetition) measured 3x slower: a stall
    slow = obs[3]
    obs[3] = Observation(slow.exp_id, slow.kind, slow.measured_s * 3, slow.steps, slow.engine_s * 3, slow.overhead_s,
                         slow.desc)
    (sc,) = repeat_scatter(obs)
    assert sc.config == ("cold", 256, 0) and sc.ratio == pytest.approx(3.0) and sc.experiments == 2 and scattered_configs(obs) == {("cold", 256, 0)}
    mask = np.ones(len(obs), bool)
    wide = bootstrap_coefficients(obs, mask, 40, 0, "metrics")
    kept = bootstrap_coefficients(obs, mask, 40, 0, "metrics", scatter_limit=None)
    # drawing the scattered configuration's experiments again spreads the refits further
    assert np.std(wide[:, 2]) > np.std(kept[:, 2])
    assert "SCATTER: ttft ('cold', 256, 0)" in fit(obs, 0.0, 0, "metrics", "linear", folds=0).summary()


def test_repeated_bursts_that_disagree_by_more_than_2x_are_named():
    from kvroute.calibrate.calibration.bursts import Burst

    def burst(exp_id, ttft):
        return Burst(exp_id, "burst", 1, 8, 256, 32, (0.0,) * 8, {"ttft_mean_s": ttft, "tpot_mean_s": 0.01})

    found = burst_scatter([burst(1, 0.1), burst(2, 0.25), burst(3, 0.12)])
    assert found == [Scatter("burst ttft_mean_s", ("burst", 1, 8, 256, 32, 0), 2.5, 3)]
    assert "differ by 2.5x" in found[0].describe()
    assert Wall("host.contention", 4.0, "upper", 4.0, 9.6, 50.3, 42.7).to_dict()["asked_for"] == 9.6
