"""Length and time distributions (traces/lengths.py) and their use by the generators."""

import math

import numpy as np
import pytest

from kvroute.sim.cluster.cluster import ClusterSpec, simulate
from kvroute.sim.timing.profile import load_profile
from kvroute.traces.generators import builtin_workload, seed_chat, workload_rng
from kvroute.traces.lengths import parse_dist


def test_fixed_draws_are_exact_and_use_no_random_numbers():
    rng = np.random.default_rng(0)
    state = rng.bit_generator.state
    for text in ("128", "fixed:128", "uniform:128:128", 128):
        d = parse_dist(text)
        assert d.is_fixed and d.mean == 128
        assert d.draw_tokens(rng, 5).tolist() == [128] * 5
    assert rng.bit_generator.state == state
    assert parse_dist("fixed:128").draw_tokens(rng, 3, cap=100).tolist() == [100, 100, 100]


def test_seeded_draws_repeat_and_respect_cap_and_minimum():
    d = parse_dist("lognormal:90:1")
    a = d.draw_tokens(np.random.default_rng(3), 20000, cap=128)
    b = d.draw_tokens(np.random.default_rng(3), 20000, cap=128)
    assert a.tolist() == b.tolist()
    assert a.min() >= 1 and a.max() == 128
    sigma = math.sqrt(math.log(2.0))
    assert float(np.median(d.sample(np.random.default_rng(4), 20000))) == pytest.approx(90, rel=0.03)
    assert d.mean == pytest.approx(90 * math.sqrt(2))
    # Share at the cap: P(L >= 127.5) for L ~ lognormal(ln 90, sigma).
    from statistics import NormalDist
    expected = 1 - NormalDist().cdf(math.log(127.5 / 90) / sigma)
    assert (a == 128).mean() == pytest.approx(expected, abs=0.01)


@pytest.mark.parametrize("text, mean", [("uniform:64:128", 96.0), ("normal:200:10", 200.0), ("exponential:0.5", 0.5)])
def test_means_of_the_other_kinds(text, mean):
    d = parse_dist(text)
    assert d.mean == mean
    assert d.sample(np.random.default_rng(1), 40000).mean() == pytest.approx(mean, rel=0.02)


def test_uniform_token_draws_are_inclusive_integers():
    values = parse_dist("uniform:3:5").draw_tokens(np.random.default_rng(0), 3000)
    assert set(values.tolist()) == {3, 4, 5}


def test_empirical_resamples_the_file_and_names_bad_lines(tmp_path):
    path = tmp_path / "replies.csv"
    path.write_text("tokens\n10\n20 # a comment\n\n30\n")
    d = parse_dist(f"empirical:{path}")
    assert d.values == (10.0, 20.0, 30.0) and d.mean == 20.0
    assert set(d.draw_tokens(np.random.default_rng(0), 200).tolist()) == {10, 20, 30}
    path.write_text("10\nabc\n")
    with pytest.raises(ValueError, match=r"replies.csv:2: --reply-tokens: 'abc' is not a number"):
        parse_dist(f"empirical:{path}", "--reply-tokens")
    with pytest.raises(ValueError, match="cannot read empirical sample"):
        parse_dist(f"empirical:{tmp_path / 'missing.txt'}")
    # a form feed is no line break (str.splitlines counted it, shifting the line named), and a
    # file that is not UTF-8 is named (it read "'utf-8' codec can't decode byte 0xff")
    path.write_text("10\x0c\nabc\n")
    with pytest.raises(ValueError, match=r"replies.csv:2: --reply-tokens: 'abc' is not a number"):
        parse_dist(f"empirical:{path}", "--reply-tokens")
    path.write_bytes(b"10\n\xff\n")
    with pytest.raises(ValueError, match=r"^--reply-tokens: empirical sample .*replies.csv: not UTF-8 text \(byte 3\)$"):
        parse_dist(f"empirical:{path}", "--reply-tokens")


def test_empirical_first_value_is_kept_after_a_byte_order_mark_and_a_typo_is_no_header(tmp_path):
    """A byte-order mark (Excel's CSV) made the first value unreadable, and any unreadable first
    line was taken for a header and dropped: 500 of (500, 10, 10) was lost, and '5OO' too."""
    path = tmp_path / "replies.csv"
    path.write_bytes(b"\xef\xbb\xbf500\n10\n10\n")
    assert parse_dist(f"empirical:{path}").values == (500.0, 10.0, 10.0)
    path.write_bytes(b"\xef\xbb\xbfoutput_tokens\n10\n")
    assert parse_dist(f"empirical:{path}").values == (10.0,)
    path.write_text("5OO\n10\n")
    with pytest.raises(ValueError, match=r"replies.csv:1: --reply-tokens: '5OO' is not a number"):
        parse_dist(f"empirical:{path}", "--reply-tokens")


@pytest.mark.parametrize("text, message", [
    ("gamma:1:2", "unknown distribution 'gamma'"),
    ("uniform:9:3", "uniform low 9 > high 3"),
    ("lognormal:0:1", "median must be > 0"),
    ("lognormal:90", "lognormal takes 2 number"),
    ("fixed:nan", "must be a finite number >= 0"),
    ("uniform:1:inf", "must be a finite number >= 0"),
    ("-5", "must be a finite number >= 0"),
    ("many", "cannot read 'many'"),
])
def test_bad_text_is_a_clear_error(text, message):
    with pytest.raises(ValueError, match=message):
        parse_dist(text, "--reply-tokens")


def test_scaled_keeps_the_shape():
    assert parse_dist("lognormal:2:0.5").scaled(1000).params == (2000.0, 0.5)
    assert parse_dist("uniform:0:0.005").scaled(1000).params == (0.0, 5.0)
    # its text parses back to it (it read "fixed:2 x 1000", which parse_dist refused)
    for text in ("fixed:2", "uniform:0:0.005", "normal:1:0.5", "lognormal:2:0.5", "exponential:0.25"):
        scaled = parse_dist(text).scaled(1000)
        assert parse_dist(scaled.text).params == pytest.approx(scaled.params, rel=1e-12), text


def test_seed_chat_states_the_fixed_user_turn_it_drew():
    """Its metadata gave the user_words turn (199 tokens, first prompt 986) for --user-tokens 300."""
    params = seed_chat(num_chats=1, num_turns=2, user_tokens=300).metadata["params"]
    trace = seed_chat(num_chats=1, num_turns=2, user_tokens=300)
    assert (params["user_tokens_total"], params["first_input_tokens"], params["new_tokens_per_turn"]) == (304, 1091, 307)
    first, second = trace.records
    assert first.input_length == 1091 and second.input_length - first.input_length - first.output_length == 307
    assert seed_chat(num_chats=1, num_turns=2).metadata["params"]["first_input_tokens"] == 986  # the default


def test_fixed_seed_chat_gives_todays_trace_and_records():
    """Fixed lengths: the trace (and so every record) is today's, whatever the seed."""
    fixed = builtin_workload("seed-chat", 8, 3, seed=5, reply="fixed:128")
    assert fixed.records == seed_chat(num_chats=8, num_turns=3).records
    assert [r.input_length for r in fixed.records[::8]] == [986, 1316, 1646]
    spec = ClusterSpec(load_profile("a6000-qwen2.5-7b"), num_workers=2)
    a = simulate(fixed, spec, seed=1).records
    b = simulate(seed_chat(num_chats=8, num_turns=3), spec, seed=1).records
    assert a.equals(b)


def test_seed_chat_lengths_follow_their_distributions():
    trace = seed_chat(num_chats=200, num_turns=3, reply_tokens="lognormal:90:1", max_tokens=128,
                      user_tokens="uniform:180:210", think_time_ms="fixed:250", start_ms="uniform:0:10",
                      rng=np.random.default_rng(0))
    outputs = np.array([r.output_length for r in trace.records])
    assert outputs.max() == 128 and outputs.min() >= 1 and 80 < outputs.mean() < 95
    starts = {r.session_id: r.timestamp_ms for r in trace.records if r.turn == 1}
    assert all(0 <= v <= 10 for v in starts.values()) and len(set(starts.values())) == 200
    for rec in trace.records:
        if rec.parent is not None:
            parent = trace.records[rec.parent]
            new = rec.input_length - parent.input_length - parent.output_length
            assert 180 + 4 + 3 <= new <= 210 + 4 + 3  # user message + template + generation prompt
            assert rec.think_time_ms == 250.0 and rec.timestamp_ms == starts[rec.session_id]
        else:
            assert 784 + 180 + 4 + 3 <= rec.input_length <= 784 + 210 + 4 + 3


def test_random_lengths_need_a_generator():
    with pytest.raises(ValueError, match=r"reply_tokens is random \(lognormal:90:1\): pass rng"):
        seed_chat(num_chats=2, num_turns=2, reply_tokens="lognormal:90:1")


def test_builtin_workload_draws_per_seed_from_its_own_stream():
    a = builtin_workload("seed-chat", 8, 2, seed=0)
    b = builtin_workload("seed-chat", 8, 2, seed=0)
    c = builtin_workload("seed-chat", 8, 2, seed=1)
    assert a.records == b.records and a.records != c.records
    expected = parse_dist("lognormal:90:1").draw_tokens(workload_rng(0), 16, cap=128)
    assert [r.output_length for r in a.records] == expected.reshape(8, 2).T.ravel().tolist()


def test_agent_reply_and_new_tokens_accept_distributions():
    trace = builtin_workload("agent", 6, 4, "uniform:0:1", 3, "lognormal:40:0.5", max_tokens=60, user="fixed:300")
    assert max(r.output_length for r in trace.records) <= 60
    for rec in trace.records:
        if rec.parent is not None:
            parent = trace.records[rec.parent]
            assert rec.input_length - parent.input_length - parent.output_length == 300
            assert 0 <= rec.think_time_ms <= 1000


@pytest.mark.parametrize("text, largest", [("0.5", 0), ("0.7", 1), ("uniform:0:0.9", 0), ("uniform:0.2:0.8", 1),
                                           ("uniform:3:9.5", 9), ("normal:2.6:0", 3), ("exponential:0", 0),
                                           ("normal:5:1", math.inf), ("lognormal:90:1", math.inf)])
def test_largest_tokens_is_the_largest_draw_before_the_minimum(text, largest):
    dist = parse_dist(text, "reply")
    assert dist.largest_tokens == largest
    drawn = dist.draw_tokens(np.random.default_rng(0), 4000, minimum=0).max()
    assert drawn == largest if math.isfinite(largest) else drawn > 5
