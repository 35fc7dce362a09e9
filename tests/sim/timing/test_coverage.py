"""A run beyond its profile's measured shapes is named (``kvroute.sim.timing.coverage``), the fit records
the sweep's shapes, and ``calibrate measure --longest`` extends the sweep to reach them."""

import json

import pytest
from click.testing import CliRunner

from kvroute.calibrate.calibration.sweep_plan import SweepPlan
from kvroute.cli.main import cli
from kvroute.sim.timing.coverage import MeasuredRange, measured_range, outside_note
from kvroute.sim.timing.profile import load_profile



def test_measured_range_takes_prompts_of_ttft_kinds_and_contexts_and_batches_of_the_others():
    descs = [("cold", {"prompt_len": 16384}), ("cached", {"prompt_len": 10240, "prefix_len": 8192}),
             ("decode", {"batch": 64, "context_len": 4096}), ("decode", {"batch": 8, "context_len": 16448}),
             ("mixed", {"batch": 16, "context_len": 1024, "prefill_len": 1536})]
    assert measured_range(descs) == MeasuredRange(sequence_tokens=16448, decode_batch=64)
    assert measured_range([("cold", {"prompt_len": 512})]) == MeasuredRange(512, 0)


def test_measured_range_round_trips_through_a_profile_document():
    r = MeasuredRange(16448, 64)
    assert MeasuredRange.of_profile({"provenance": {"fit": {"measured_range": r.to_dict()}}}) == r
    assert MeasuredRange.of_profile({"provenance": {"kind": "derived"}}) is None
    assert MeasuredRange.of_profile({}) is None
    assert MeasuredRange.of_profile({"provenance": {"fit": {"measured_range": {"sequence_tokens": "x"}}}}) is None


def test_outside_note_names_each_excess_and_nothing_inside():
    r = MeasuredRange(16448, 64)
    assert outside_note("p", r, 16448, 64) == ""
    assert outside_note("p", r, 16449, 64) == ""  # its last token is sampled, not computed
    assert outside_note("p", r, 16450, 64).startswith("Note: beyond what p measured: sequences reach 16,450 tokens")
    assert outside_note("p", None, 10 ** 6, 10 ** 3) == ""
    long = outside_note("p", r, 27426, 6)
    assert long.startswith("Note: beyond what p measured: sequences reach 27,426 tokens, its sweep timed up to 16,448.")
    assert "decoded batches" not in long
    assert long.endswith("not measured (`kvroute calibrate measure --longest 27426` times such sequences).")
    wide = outside_note("p", r, 100, 65)
    assert "up to 65 requests could decode together on one worker (in flight there, at most max_num_seqs), its sweep decoded batches of up to 64." in wide
    assert "sequences reach" not in wide and "--longest" not in wide


def test_extended_plan_adds_longer_shapes_per_family():
    full = SweepPlan.preset("full")
    ext = full.extended(32768)
    assert ext.cold_lengths[-3:] == (16384, 24576, 32767)
    assert ext.cached_prefixes == (512, 2048, 8192, 30719)
    assert ext.decode_contexts == (128, 1024, 4096, 16384, 32704)
    assert ext.longest_sequence() == (32767, 32768)
    quick = SweepPlan.preset("quick")
    assert quick.extended(100) == quick  # every family already reaches 100 tokens
    with pytest.raises(ValueError, match="longest must be >= 2"):
        full.extended(1)


def test_shipped_measured_profiles_carry_their_sweeps_range():
    for name in ("cpu-tiny-qwen2", "cpu-tiny-qwen2-x2", "cpu-tiny-qwen2-x2-bursts"):
        r = MeasuredRange.of_profile(load_profile(name).raw)
        assert r is not None and r.sequence_tokens >= 4096 and r.decode_batch >= 16, name


def test_compare_notes_a_run_longer_than_the_profile_measured(tmp_path):
    doc = json.loads(json.dumps(load_profile("cpu-tiny-qwen2-x2").raw))
    doc["name"] = "narrow"
    doc["provenance"]["fit"]["measured_range"] = {"sequence_tokens": 1000, "decode_batch": 64}
    narrow = tmp_path / "narrow.json"
    narrow.write_text(json.dumps(doc))
    args = ["compare", "--chats", "4", "--turns", "2", "--rounds", "1", "--policies", "round_robin"]
    out = CliRunner().invoke(cli, args + ["--profile", str(narrow)], catch_exceptions=False).output
    assert "Note: beyond what narrow measured: sequences reach" in out
    assert "its sweep timed up to 1,000" in out
    inside = CliRunner().invoke(cli, args + ["--profile", "cpu-tiny-qwen2-x2"], catch_exceptions=False).output
    assert "beyond what" not in inside


def test_run_note_counts_overlapping_rounds_apart():
    import pandas as pd

    from kvroute.sim.timing.coverage import peak_in_flight, run_note

    profile = load_profile("cpu-tiny-qwen2-x2")  # measured: 16,384 tokens, batches of 64
    one = pd.DataFrame({"worker": [0] * 40, "arrival": [0.0] * 40, "finish": [1.0] * 40, "status": ["ok"] * 40,
                        "prompt_tokens": [100] * 40, "output_tokens": [10] * 40})
    assert peak_in_flight(one) == 40
    assert run_note(profile, [one, one]) == ""  # two rounds of 40 are not 80 at once
    assert "up to 80 requests could decode together on one worker" in run_note(profile, pd.concat([one, one]))
    longer = one.assign(prompt_tokens=20000)
    assert "sequences reach 20,010 tokens" in run_note(profile, [one, longer])
