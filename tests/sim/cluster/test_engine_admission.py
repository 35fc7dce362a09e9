"""The engine admission paid inside the step that first schedules a request
(``Overheads.engine_admission_s`` / ``engine_admission_per_token_s``; issue 37, item 3).

Times are dyadic fractions, so every sum below is exact in floating point and the tests compare
with ``==``.
"""

import pytest

from kvroute.sim.cluster.cluster import ClusterSpec, simulate
from kvroute.sim.timing.profile import Overheads, profile_from_dict
from kvroute.traces.format import Trace
from kvroute.traces.inputs import InputError
from tests.sim.cluster.test_cluster import one

API_S, API_PER_TOKEN_S = 0.125, 2.0 ** -11
ADMIT_S, ADMIT_PER_TOKEN_S = 0.0625, 2.0 ** -12
STEP_S, PER_TOKEN_S = 2.0 ** -6, 2.0 ** -10
PROMPT = 64


def profile(admission: bool, **over):
    """Steps cost 1/64 s + 1/1024 s per batched token; 1/8 s + 1/2048 s per prompt token before
    the first step's forward, of which (with ``admission``) 1/16 s + 1/4096 s per prompt token
    is paid inside that step."""
    overheads = {"api_server_s": API_S, "api_server_per_token_s": API_PER_TOKEN_S, "gateway_s": 0.0, "jitter_cv": 0.0}
    if admission:
        overheads |= {"engine_admission_s": ADMIT_S, "engine_admission_per_token_s": ADMIT_PER_TOKEN_S}
    overheads |= over
    return profile_from_dict({
        "name": "admission",
        "engine": {"block_size": 16, "num_gpu_blocks": 1000, "max_num_batched_tokens": 2048, "max_num_seqs": 256},
        "step_cost": {"step_overhead_s": STEP_S, "weight_load_s": 0.0, "per_token_s": PER_TOKEN_S,
                      "per_request_s": 0.0, "prefill_attn_s": 0.0, "decode_attn_s": 0.0},
        "overheads": overheads,
    })


def run(records, admission: bool):
    spec = ClusterSpec(profile(admission), num_workers=1, arrival_spread_s=0.0, record_steps=True)
    return simulate(Trace(records, block_size=16), spec, seed=0)


def test_overheads_split_the_admission_off_the_time_before_the_engine():
    o = Overheads(api_server_s=API_S, api_server_per_token_s=API_PER_TOKEN_S, gateway_s=0.0,
                  engine_admission_s=ADMIT_S, engine_admission_per_token_s=ADMIT_PER_TOKEN_S)
    assert o.has_engine_admission and not Overheads().has_engine_admission
    assert o.mean_s(PROMPT) == API_S + API_PER_TOKEN_S * PROMPT == 0.15625
    assert o.engine_admission(PROMPT) == ADMIT_S + ADMIT_PER_TOKEN_S * PROMPT == 0.078125
    assert o.pre_engine_mean_s(PROMPT) == 0.078125


def test_a_request_alone_takes_the_same_time_either_way():
    alone = [one(0, PROMPT, 3)]
    before, split = run(alone, admission=False), run(alone, admission=True)
    for column in ("ttft", "e2e", "tpot"):
        assert split.records.iloc[0][column] == before.records.iloc[0][column]
    row = split.records.iloc[0]
    assert row["ttft"] == API_S + API_PER_TOKEN_S * PROMPT + STEP_S + PER_TOKEN_S * PROMPT  # 0.234375
    # vLLM's histograms count the admission in the prefill time (first scheduled to first token)
    assert row["prefill_time"] == STEP_S + PER_TOKEN_S * PROMPT + ADMIT_S + ADMIT_PER_TOKEN_S * PROMPT
    assert before.records.iloc[0]["prefill_time"] == STEP_S + PER_TOKEN_S * PROMPT


def test_new_requests_in_one_step_lengthen_it_by_each_admission():
    three = [one(rid, PROMPT, 2) for rid in range(3)]
    before, split = run(three, admission=False), run(three, admission=True)
    admission = ADMIT_S + ADMIT_PER_TOKEN_S * PROMPT
    step = STEP_S + PER_TOKEN_S * 3 * PROMPT
    for rid in range(3):  # one step schedules all three: each waits for the other two admissions too
        assert before.records.iloc[rid]["ttft"] == API_S + API_PER_TOKEN_S * PROMPT + step
        assert split.records.iloc[rid]["ttft"] == API_S + API_PER_TOKEN_S * PROMPT + step + 2 * admission
        assert split.records.iloc[rid]["prefill_time"] == step + 3 * admission
    # the decode step after it admits nobody and costs what it did
    assert split.records.iloc[0]["tpot"] == before.records.iloc[0]["tpot"] == STEP_S + PER_TOKEN_S * 3


def test_a_drawn_api_server_time_below_the_admission_leaves_nothing_before_the_engine():
    """Profiles drawn from a fit's uncertainty replace ``api_server_s`` alone; the time before
    the engine is then clipped at 0, not negative."""
    o = Overheads(api_server_s=0.03125, gateway_s=0.0, engine_admission_s=ADMIT_S)
    assert o.pre_engine_mean_s(PROMPT) == 0.0
    assert o.engine_admission(PROMPT) == ADMIT_S


def test_an_admission_larger_than_the_api_server_time_is_refused_naming_the_field():
    with pytest.raises(InputError, match=r"field 'overheads\.engine_admission_s'.*cannot exceed"):
        profile(True, engine_admission_s=0.25)
    with pytest.raises(InputError, match=r"field 'overheads\.engine_admission_per_token_s'.*cannot exceed"):
        profile(True, engine_admission_per_token_s=2.0 ** -10)
