"""The reproduction script of published experiments (bench/published/reproduce_llmd_37.py): how it
reads llm-d's report and per-stage CSV, joins them with predicted stages and judges the targets.
The reproduction itself (minutes of simulation) is the script's job, not a test's; its figures
are in bench/published/REPORT.md."""

from __future__ import annotations

import importlib.util
import sys

import pandas as pd
import pytest

from kvroute.sim.routing.epp_config import read_endpoint_picker_config
from tests.support.paths import PUBLISHED, ROOT

SCRIPT = ROOT / "bench" / "published" / "reproduce_llmd_37.py"
NAMES = ("precise-scheduling", "default-scheduling", "load-scheduling", "random-scheduling")


@pytest.fixture(scope="module")
def rp():
    spec = importlib.util.spec_from_file_location("reproduce_llmd_37", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault(spec.name, module)  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def _published_file(name):
    path = PUBLISHED / name
    if not path.exists():
        pytest.skip(f"{path} is absent (published files live in ../shared/published)")
    return path


def test_report_gives_the_workload_and_four_picker_configs(rp, tmp_path):
    report = rp.read_report(_published_file("llm-d-37-capacity-report.md").read_text())
    assert "num_groups: 83" in report.workload_yaml and "rate: 20" in report.workload_yaml
    assert tuple(report.epp_yaml) == NAMES
    kinds = {}
    for name, text in report.epp_yaml.items():
        (tmp_path / f"{name}.yaml").write_text(text)
        config = read_endpoint_picker_config(tmp_path / f"{name}.yaml")
        kinds[name] = ([(type(s).__name__, w) for s, w in config.scorers], config.picker)
    assert [w for _, w in kinds["precise-scheduling"][0]] == [2.0, 1.0, 1.0]
    assert [w for _, w in kinds["default-scheduling"][0]] == [1.0, 1.0, 2.0]
    assert [w for _, w in kinds["load-scheduling"][0]] == [1.0, 1.0]
    assert kinds["random-scheduling"] == ([], "random")


def test_published_csv_gives_nine_stages_of_four_policies(rp):
    table = rp.read_published(_published_file("llm-d-37-capacity-results.csv"))
    assert len(table) == 36
    assert sorted(table["qps"].unique()) == [3.0, 4.0, 5.0, 6.0, 8.0, 10.0, 12.0, 15.0, 20.0]
    first = table[table["qps"] == 3.0]
    assert list(first["experiment"]) == list(NAMES)
    assert first.set_index("experiment").loc["load-scheduling", "ttft_mean_s"] == 1.443
    assert table.set_index(["experiment", "qps"]).loc[("default-scheduling", 20.0), "ttft_p90_s"] == 43.568


def test_report_without_a_picker_block_is_an_error(rp):
    text = "```yaml\nload: {type: constant}\ndata: {type: shared_prefix}\n```\n"
    with pytest.raises(ValueError, match=r"no \*\*precise-scheduling\*\* EndpointPickerConfig block"):
        rp.read_report(text)


def _published(rows):
    cols = ["experiment", "qps", "output_toks_per_s", "requests_per_s", "ttft_mean_s", "ttft_p90_s", "itl_mean_s"]
    return pd.DataFrame(rows, columns=cols)


def _predicted(rows):
    cols = ["experiment", "rate", "output_throughput", "achieved_rate", "ttft_mean", "ttft_p90", "itl_mean"]
    return pd.DataFrame(rows, columns=cols)


def test_join_pairs_stages_drops_the_warmup_and_gives_ratios(rp):
    pub = _published([("precise-scheduling", 3.0, 2000.0, 3.0, 0.2, 0.3, 0.020)])
    pred = _predicted([("precise-scheduling", 9.0, 1.0, 9.0, 9.0, 9.0, 9.0),  # warm-up: no published row
                       ("precise-scheduling", 3.0, 2500.0, 3.0, 0.1, 0.6, 0.026)])
    joined = rp.join_stages(pub, pred)
    assert len(joined) == 1
    row = joined.iloc[0]
    assert (row["output tok/s ratio"], row["TTFT mean ratio"], row["TTFT p90 ratio"]) == (1.25, 0.5, 2.0)
    assert row["ITL mean ratio"] == pytest.approx(1.3)
    with pytest.raises(ValueError, match="no predicted stage for precise-scheduling at 3 QPS"):
        rp.join_stages(pub, pred.iloc[:1])


def test_targets_on_a_two_stage_ladder(rp):
    # published: precise flat, the others more than double at 4 QPS; predicted: the same order,
    # but load never doubles (a miss) and every policy's throughput is 30% high at 3 QPS.
    pub, pred = [], []
    for name, (t3, t4) in zip(NAMES, [(0.1, 0.1), (0.2, 0.5), (1.0, 5.0), (2.0, 9.0)]):
        pub += [(name, 3.0, 1000.0, 3.0, t3, t3, 0.02), (name, 4.0, 1000.0, 4.0, t4, t4, 0.02)]
    for name, (t3, t4) in zip(NAMES, [(0.1, 0.1), (0.2, 0.5), (1.0, 1.5), (2.0, 4.5)]):
        pred += [(name, 3.0, 1300.0, 3.0, t3, t3, 0.02), (name, 4.0, 1000.0, 4.0, t4, t4, 0.03)]
    found = {t.name.split(",")[0]: t for t in rp.targets(rp.join_stages(_published(pub), _predicted(pred)))}
    assert rp.knee(pd.Series([0.2, 0.3, 0.5], index=[3.0, 4.0, 5.0])) == 5.0
    assert rp.knee(pd.Series([0.1, 0.1], index=[3.0, 4.0])) is None
    order = found["order of the four policies by mean TTFT"]
    assert (order.passed, order.detail) == (True, "right at every stage")
    k = found["stage where mean TTFT first exceeds 2x its low-load value"]
    assert not k.passed
    assert k.detail == ("published vs predicted: precise none vs none; default 4 QPS vs 4 QPS; "
                        "load 4 QPS vs none; random 4 QPS vs 4 QPS")
    tput = found["output throughput within 25%"]
    assert (tput.passed, tput.detail.split(";")[0]) == (False, "4 of 8 stage rows inside")
    assert tput.detail.endswith("outside: precise@3, default@3, load@3, random@3")
    assert not found["mean TTFT within 2x"].passed  # load at 4 QPS: 1.5 / 5.0 = 0.3
    assert not found["ITL mean within 30%"].passed  # 0.03 / 0.02 = 1.5 at 4 QPS


def test_swapped_pairs_name_the_stage_and_both_gaps(rp):
    pub = [(n, 3.0, 1.0, 3.0, t, t, 0.02) for n, t in zip(NAMES, (0.1, 0.2, 1.0, 2.0))]
    pred = [(n, 3.0, 1.0, 3.0, t, t, 0.02) for n, t in zip(NAMES, (0.1, 0.2, 4.0, 2.0))]
    pairs = rp.swapped_pairs(rp.join_stages(_published(pub), _predicted(pred)))
    assert pairs == [(3.0, "load-scheduling", "random-scheduling", 1.0, -0.5)]


def test_pod_metrics_sample_the_last_step_value_on_a_grid(rp):
    # one worker: 0 waiting over [0, 0.25), 4 waiting over [0.25, 0.5); KV 10% then 50%.
    series = pd.DataFrame({"worker": [0, 0], "start": [0.0, 0.25], "end": [0.25, 0.5],
                           "vllm:num_requests_waiting": [0, 4], "vllm:kv_cache_usage_perc": [0.1, 0.5]})
    got = rp.pod_metrics(series, every=0.1)  # instants 0, 0.1, 0.2, 0.3, 0.4
    assert (got["wait max"], got["kv max"]) == (4, 50.0)
    assert got["wait mean"] == pytest.approx(1.6) and got["kv mean"] == pytest.approx(26.0)


def _two_stage_run():
    # stage 0 (3 QPS): requests 0-2, sent 0-2 s, done by 5 s; stage 1 (6 QPS): requests 3-4, 10-14 s
    stages = pd.DataFrame({"stage": [1, 0], "rate": [6.0, 3.0], "requests": [2, 3]})  # any row order
    records = pd.DataFrame({"request_id": [0, 1, 2, 3, 4], "worker": [0, 1, 0, 0, 0],
                            "arrival": [0.0, 1.0, 2.0, 10.0, 11.0], "finish": [4.0, 5.0, 3.0, 12.0, 14.0]})
    return stages, records


def test_stage_spans_run_from_first_send_to_last_finish(rp):
    stages, records = _two_stage_run()
    assert rp.stage_spans(records, stages) == {3.0: (0.0, 5.0), 6.0: (10.0, 14.0)}


def test_stage_kv_peaks_give_the_lowest_and_highest_workers_peak_per_stage(rp):
    stages, records = _two_stage_run()
    series = pd.DataFrame({"worker": [0, 1, 0, 1, 0, 1], "start": [1.0, 1.0, 4.5, 6.0, 11.0, 13.0],
                           "vllm:kv_cache_usage_perc": [0.25, 0.5, 0.75, 0.9, 0.6, 0.1]})
    # stage 3 QPS: worker 0 peaks at 75 % (its step at 4.5 s), worker 1 at 50 % (the 6 s step is
    # after the stage's last finish); stage 6 QPS: 60 % and 10 %
    assert rp.stage_kv_peaks(series, rp.stage_spans(records, stages)) == {3.0: (50.0, 75.0), 6.0: (10.0, 60.0)}


def test_worker_requests_count_a_stages_requests_per_worker_none_included(rp):
    stages, records = _two_stage_run()
    assert rp.worker_requests(records, stages, 3.0) == [2, 1]
    assert rp.worker_requests(records, stages, 6.0) == [2, 0]


def test_the_v051_variant_sets_the_index_parameters_on_the_prefix_scorer_only(rp, tmp_path):
    text = rp.read_report(_published_file("llm-d-37-capacity-report.md").read_text()).epp_yaml["default-scheduling"]
    path = tmp_path / "v051.yaml"
    path.write_text(rp.v051_config(text))
    config = read_endpoint_picker_config(path)
    assert [(type(s).__name__, w) for s, w in config.scorers] == [
        ("QueueScorer", 1.0), ("KVCacheUtilizationScorer", 1.0), ("PrefixCacheScorer", 2.0)]
    prefix = config.scorers[2][0]
    assert (prefix.block_tokens, prefix.lru_capacity, prefix.max_blocks) == (64, 31250, 64)
    assert config.picker == "max"


def test_a_report_written_without_evidence_says_so_and_prints_no_nan(rp):
    stages = (3.0, 4.0, 5.0, 6.0, 8.0, 10.0, 12.0, 15.0, 20.0)
    pub = [(n, q, 1000.0, q, 0.1 * (i + 1), 0.2 * (i + 1), 0.02) for i, n in enumerate(NAMES) for q in stages]
    pred = [(n, q, 1100.0, q, 0.1 * (i + 1), 0.2 * (i + 1), 0.04) for i, n in enumerate(NAMES) for q in stages]
    joined = rp.join_stages(_published(pub), _predicted(pred))
    res = rp.Results(joined, rp.targets(joined), _predicted(pred), {n: 1.0 for n in NAMES}, 472_000, 7209,
                     {"step_cost": {"decode_attn_s": 4e-8}, "parallel": {"kv_bytes_per_token_per_rank": 81920}},
                     {}, {}, {}, {}, (0.5, 0.5))
    text = rp.render(res)
    assert "nan" not in text.lower()
    assert "*Written with `--no-evidence`: the evidence runs were not gathered" in text
    assert "`decode_attn_s = 0`) was not gathered (`--no-evidence`)" in text
    assert "tokens; LRU 31,250; no auto-tuning): not gathered in this run (`--no-evidence`)." in text


def test_the_v051_variant_leaves_a_cache_tracking_scorer_alone(rp):
    text = rp.read_report(_published_file("llm-d-37-capacity-report.md").read_text()).epp_yaml["precise-scheduling"]
    assert rp.yaml.safe_load(rp.v051_config(text)) == rp.yaml.safe_load(text)
