"""llm-d's scorers as the field configures them: exact scores on hand-built states, the cache view
owned by the policy, and EndpointPickerConfig files."""

import os
from pathlib import Path

import pytest

from kvroute.sim.cluster.cluster import Cluster, ClusterSpec, simulate
from kvroute.sim.routing import KVEventIndex, MetricsScrape, RouteRequest, RouterView, make_policy, router_rng
from kvroute.sim.routing.approx_prefix import ApproxPrefixIndex
from kvroute.sim.routing.epp_config import read_endpoint_picker_config
from kvroute.sim.routing.epp_scorers import (KVCacheUtilizationScorer, PrecisePrefixCacheScorer, PrefixCacheScorer,
                                             QueueScorer, normalized)
from kvroute.sim.study.experiment import compare, format_table
from kvroute.sim.timing.profile import load_profile
from kvroute.traces import generators
from kvroute.traces.inputs import InputError


def rr(rid, hashes, tokens=None):
    return RouteRequest(rid, None, list(hashes), len(hashes) * 16 if tokens is None else tokens)


def view(n=2, metrics=None, events=None):
    return RouterView(n, block_size=16, router_block_tokens=16, metrics=metrics,
                      cache_view="events" if events is not None else "routed", events=events)


# -- scorers -----------------------------------------------------------------------------------

def test_queue_scorer_is_min_max_normalised_waiting():
    v = view(3, MetricsScrape(lambda: [(9, 4, 0.0), (9, 0, 0.0), (9, 2, 0.0)]))
    assert QueueScorer().score(rr(0, []), v, [0, 1, 2]) == [0.0, 1.0, 0.5]
    assert QueueScorer().score(rr(0, []), v, [0, 2]) == [0.0, 1.0]  # over the candidates only
    same = view(2, MetricsScrape(lambda: [(0, 3, 0.0), (5, 3, 0.0)]))
    assert QueueScorer().score(rr(0, []), same, [0, 1]) == [1.0, 1.0]


def test_kv_cache_utilization_scorer_is_one_minus_usage():
    v = view(2, MetricsScrape(lambda: [(0, 0, 0.25), (0, 0, 1.0)]))
    assert KVCacheUtilizationScorer().score(rr(0, []), v, [0, 1]) == [0.75, 0.0]


def test_precise_normalisations():
    # released scorer: min-max over the servers holding the first block, the others 0
    assert normalized([4, 2, 0], 8) == [1.0, 0.0, 0.0]
    assert normalized([6, 4, 2], 8) == [1.0, 0.5, 0.0]
    assert normalized([3, 3, 0], 8) == [1.0, 1.0, 0.0]
    assert normalized([0, 0], 8) == [0.0, 0.0]
    # main branch since May 2026: matched / prompt blocks
    assert normalized([4, 2, 0], 8, "absolute") == [0.5, 0.25, 0.0]
    assert normalized([1], 0, "absolute") == [0.0]


# -- the estimated index -----------------------------------------------------------------------

def test_approx_index_evicts_the_least_recently_added_at_its_capacity():
    index = ApproxPrefixIndex([4, 4])
    index.add(0, ["a", "b", "c"])
    index.add(0, ["a"])  # already held: moves to the front, evicts nothing
    assert index.held(0) == ["b", "c", "a"]
    index.add(0, ["d", "e"])  # the fifth entry evicts the least recent, b
    assert index.held(0) == ["c", "a", "d", "e"]
    assert index.servers("b") == [] and index.servers("c") == [0]
    index.add(1, ["b", "c"])
    # the walk stops at the first hash no server holds and counts each server's holdings on the way
    assert index.match(["a", "b", "c", "x", "d"]) == [2, 2]
    assert index.match(["x", "a"]) == [0, 0]


def test_approx_index_keeps_a_hash_its_own_request_evicted_listed_as_llm_d_does():
    index = ApproxPrefixIndex([2])
    index.add(0, ["a", "b", "c"])  # a is evicted by c during the add, then listed again
    assert index.held(0) == ["b", "c"]
    assert index.servers("a") == [0]
    assert index.match(["a", "b", "c"]) == [3]


def test_estimated_scorer_scores_matched_over_prompt_blocks_with_lru_eviction():
    scorer = PrefixCacheScorer(block_tokens=32, lru_capacity=4)
    v = view(2)
    scorer.prepare(v)
    # 7 engine blocks of 16 tokens (112 tokens) + 8 tokens: blocks of 32 tokens are engine hashes
    # 2, 4, 6 and a partial block of 24 tokens, 4 entries in all
    first = rr(0, [1, 2, 3, 4, 5, 6, 7], tokens=120)
    assert scorer.hashes(first) == [2, 4, 6, ("partial", 0)]
    assert scorer.score(first, v, [0, 1]) == [0.0, 0.0]
    scorer.routed(first, v, 0)
    other = rr(1, [9, 10, 11, 12], tokens=64)  # 2 more entries at capacity 4: hashes 2 and 4 go
    scorer.score(other, v, [0, 1])
    scorer.routed(other, v, 0)
    assert scorer.index.held(0) == [6, ("partial", 0), 10, 12]
    again = rr(2, [1, 2, 3, 4, 5, 6], tokens=96)  # 3 full blocks, no partial
    # hash 2 was evicted and nobody else holds it: the walk stops at once, although 6 is held
    assert scorer.score(again, v, [0, 1]) == [0.0, 0.0]
    scorer.routed(again, v, 1)
    later = rr(3, [1, 2, 3, 4, 5, 6, 7, 8], tokens=128)  # 4 full blocks: hashes 2, 4, 6, 8
    # worker 1 holds 2, 4, 6; worker 0 only 6, counted because worker 1 kept the walk going
    assert scorer.score(later, v, [0, 1]) == [1 / 4, 3 / 4]
    short = rr(4, [1], tokens=31)  # shorter than one block: no blocks, score 0
    assert scorer.hashes(short) == [] and scorer.score(short, v, [0, 1]) == [0.0, 0.0]
    capped = PrefixCacheScorer(max_blocks=2)
    capped.prepare(v)
    assert capped.hashes(rr(5, [1, 2, 3], tokens=56)) == [1, 2]  # cut at 2 blocks: no partial


def test_estimated_capacity_auto_tunes_to_each_workers_blocks():
    scorer = PrefixCacheScorer()
    v = view(2)
    v.num_gpu_blocks = [100, 50]
    scorer.prepare(v)
    assert scorer.index.capacities == [100, 50] and scorer.block == 16
    bare = view(2)  # the live replay: capacities unknown, llm-d's default
    scorer.prepare(bare)
    assert scorer.index.capacities == [31250, 31250]
    with pytest.raises(ValueError, match="multiple of the engine's block size 16"):
        PrefixCacheScorer(block_tokens=24).prepare(v)


def test_precise_index_sees_evictions_the_estimated_one_does_not():
    events = KVEventIndex(2)
    v = view(2, MetricsScrape(lambda: [(0, 0, 0.5), (0, 0, 0.5)]), events)
    precise = make_policy("llmd-precise", router_rng(0))
    estimated = make_policy("llmd-estimated", router_rng(0))
    assert precise.cache_view == "events" and estimated.cache_view is None
    precise_scorer, estimated_scorer = precise.scorers[0][0], estimated.scorers[2][0]
    first = rr(0, [1, 2, 3, 4])
    worker = estimated.choose(first, v)  # nothing known yet: a tie, broken at random
    events.apply(worker, True, [1, 2, 3, 4])  # the worker cached the prompt: both indexes agree
    expected = [1.0 if w == worker else 0.0 for w in (0, 1)]
    assert precise_scorer.score(rr(1, [1, 2, 3, 4]), v, [0, 1]) == expected
    assert estimated_scorer.score(rr(1, [1, 2, 3, 4]), v, [0, 1]) == expected
    events.apply(worker, False, [1, 2, 3, 4])  # then evicted it: the events say so, the routed index cannot
    assert precise_scorer.score(rr(2, [1, 2, 3, 4]), v, [0, 1]) == [0.0, 0.0]
    assert estimated_scorer.score(rr(2, [1, 2, 3, 4]), v, [0, 1]) == expected


def test_presets_weigh_their_scorers_as_the_guides_do():
    # worker 0: 3 of 4 blocks cached (events), 2 waiting, KV 50 %; worker 1: nothing, 0 waiting, KV 25 %
    events = KVEventIndex(2)
    events.apply(0, True, [1, 2, 3])
    v = view(2, MetricsScrape(lambda: [(1, 2, 0.5), (1, 0, 0.25)]), events)
    req = rr(1, [1, 2, 3, 4])
    precise = make_policy("llmd-precise", router_rng(0))
    # w0: 2 * 1 (min-max: the only holder) + 1 * 0.5 + 1 * 0 = 2.5; w1: 0 + 0.75 + 1 = 1.75
    assert precise.scores(req, v, [0, 1]) == [2.5, 1.75]
    assert precise.choose(req, v) == 0
    absolute = make_policy("llmd-precise:normalize=absolute", router_rng(0))
    assert absolute.scores(req, v, [0, 1]) == [2 * 0.75 + 0.5, 1.75]
    load = make_policy("llmd-load", router_rng(0))
    assert load.scores(req, v, [0, 1]) == [0.5, 1.75] and load.choose(req, v) == 1
    assert load.cache_view is None and not load.uses_prefixes and load.uses_metrics


# -- the cache view belongs to the policy ------------------------------------------------------

def small_profile(blocks=400):
    import dataclasses
    prof = load_profile("a6000-qwen2.5-7b")
    return dataclasses.replace(prof, engine=dataclasses.replace(prof.engine, num_gpu_blocks=blocks))


def test_each_policy_builds_its_own_view_source():
    trace = generators.seed_chat(4, 2)
    spec = ClusterSpec(small_profile(), num_workers=2)  # the run's cache view: routed
    precise = Cluster(trace, ClusterSpec(small_profile(), num_workers=2, policy="llmd-precise"), seed=0)
    assert precise.view.cache_view == "events" and precise.events is not None
    estimated = Cluster(trace, ClusterSpec(small_profile(), num_workers=2, policy="llmd-estimated"), seed=0)
    assert estimated.view.cache_view == "routed" and estimated.events is None
    assert estimated.policy.scorers[2][0].index.capacities == [400, 400]
    plain = Cluster(trace, spec, seed=0)
    assert plain.view.cache_view == "routed"
    # a policy that says nothing keeps the run's --cache-view
    events_run = Cluster(trace, ClusterSpec(small_profile(), num_workers=2, cache_view="events", policy="llmd"), seed=0)
    assert events_run.view.cache_view == "events"
    # the event delay too: the policy's where it gives one (-1: the run's)
    delayed = ClusterSpec(small_profile(), num_workers=2, kv_event_delay_s=0.2, policy="llmd-precise")
    assert Cluster(trace, delayed, seed=0)._event_delay_s == 0.2
    own = ClusterSpec(small_profile(), num_workers=2, kv_event_delay_s=0.2, policy="llmd-precise:kv_event_delay_s=0.05")
    assert Cluster(trace, own, seed=0)._event_delay_s == 0.05


def test_kvroute_policies_lists_the_llm_d_configurations():
    from click.testing import CliRunner

    from kvroute.cli.main import cli

    lines = CliRunner().invoke(cli, ["policies"], catch_exceptions=False).output.splitlines()
    listed = {line.split()[0]: line for line in lines}
    assert "prefix_weight=2.0,kv_weight=1.0,queue_weight=1.0,normalize=minmax" in listed["llmd-precise"]
    assert "queue_weight=2.0,kv_weight=2.0,prefix_weight=3.0,block_tokens=0,lru_capacity=0,max_blocks=256" \
        in listed["llmd-estimated"]
    assert "[queue_weight=1.0,kv_weight=1.0,picker=max]" in listed["llmd-load"]
    assert "EndpointPickerConfig" in listed["epp"]


def test_four_llm_d_configurations_compare_in_one_table():
    workload = lambda seed: generators.seed_chat(8, 3)  # noqa: E731
    spec = ClusterSpec(small_profile(), num_workers=2)
    policies = ["llmd-precise", "llmd-estimated", "llmd-load", "random"]
    comparison = compare(workload, spec, policies, rounds=1, executor="sequential")
    table = format_table(comparison)
    assert table.splitlines()[0].split() == ["metric", "llmd-precise", "llmd-estimated", "Δ", "vs", "llmd-precise",
                                             "llmd-load", "Δ", "vs", "llmd-precise", "random", "Δ", "vs",
                                             "llmd-precise"]
    assert comparison.policies == policies
    # each column is the run of that policy alone (its own cache view, the same trace and seed)
    for policy in policies:
        alone = simulate(generators.seed_chat(8, 3), ClusterSpec(small_profile(), num_workers=2, policy=policy), seed=0)
        assert list(comparison.runs[policy][0].records.worker) == list(alone.records.worker)
    workers = {p: list(comparison.runs[p][0].records.worker) for p in policies}
    assert len({tuple(w) for w in workers.values()}) == 4  # four different routings


# -- EndpointPickerConfig files ----------------------------------------------------------------

PRECISE_GUIDE = """\
apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins:
  - type: tokenizer
    parameters:
      modelName: Qwen/Qwen3-32B
  - type: single-profile-handler
  - type: decode-filter
  - type: precise-prefix-cache-scorer
    parameters:
      tokenProcessorConfig:
        blockSize: 16
        hashSeed: "42"
      kvEventsConfig:
        topicFilter: "kv@"
  - type: kv-cache-utilization-scorer
  - type: queue-scorer
  - type: max-score-picker
schedulingProfiles:
  - name: default
    plugins:
      - pluginRef: decode-filter
      - pluginRef: tokenizer
      - pluginRef: precise-prefix-cache-scorer
        weight: 2.0
      - pluginRef: kv-cache-utilization-scorer
        weight: 1.0
      - pluginRef: queue-scorer
        weight: 1.0
      - pluginRef: max-score-picker
"""


def write(tmp_path, text, name="epp.yaml"):
    path = tmp_path / name
    path.write_text(text)
    return path


def test_a_guide_config_parses_into_the_preset(tmp_path):
    parsed = read_endpoint_picker_config(write(tmp_path, PRECISE_GUIDE))
    assert [(type(s).__name__, w) for s, w in parsed.scorers] == [
        ("PrecisePrefixCacheScorer", 2.0), ("KVCacheUtilizationScorer", 1.0), ("QueueScorer", 1.0)]
    assert parsed.picker == "max" and parsed.scorers[0][0].block_size == 16


def test_the_guide_file_routes_as_the_preset(tmp_path):
    path = write(tmp_path, PRECISE_GUIDE)
    trace = generators.seed_chat(8, 3)
    by_file = simulate(trace, ClusterSpec(small_profile(), num_workers=2, policy=f"epp:{path}"), seed=0)
    by_name = simulate(trace, ClusterSpec(small_profile(), num_workers=2, policy="llmd-precise"), seed=0)
    assert list(by_file.records.worker) == list(by_name.records.worker)


def test_published_37_capacity_configs_parse(tmp_path):
    # the four scheduler configurations of ../shared/published/llm-d-37-capacity-report.md, with the
    # plugin names of their time (kv-cache-scorer, prefix-cache-scorer mode cache_tracking)
    default = read_endpoint_picker_config(write(tmp_path, """\
apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: queue-scorer
- type: kv-cache-scorer
- type: prefix-cache-scorer
- type: max-score-picker
  parameters:
    maxNumOfEndpoints: 1
- type: single-profile-handler
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: queue-scorer
    weight: 1
  - pluginRef: kv-cache-scorer
    weight: 1
  - pluginRef: prefix-cache-scorer
    weight: 2
  - pluginRef: max-score-picker
"""))
    assert [(s.type, w) for s, w in default.scorers] == [
        ("queue-scorer", 1.0), ("kv-cache-utilization-scorer", 1.0), ("prefix-cache-scorer", 2.0)]
    estimated = default.scorers[2][0]
    assert (estimated.block_tokens, estimated.lru_capacity, estimated.max_blocks) == (0, 0, 256)  # auto-tuned
    precise = read_endpoint_picker_config(write(tmp_path, """\
apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: single-profile-handler
- type: prefix-cache-scorer
  parameters:
    mode: cache_tracking
    indexerConfig:
      tokenProcessorConfig:
        blockSize: 64
        hashSeed: "42"
- type: kv-cache-scorer
- type: queue-scorer
- type: max-score-picker
schedulingProfiles:
- name: default
  plugins:
    - pluginRef: prefix-cache-scorer
      weight: 2.0
    - pluginRef: kv-cache-scorer
      weight: 1.0
    - pluginRef: queue-scorer
      weight: 1.0
    - pluginRef: max-score-picker
""", "precise.yaml"))
    assert isinstance(precise.scorers[0][0], PrecisePrefixCacheScorer) and precise.scorers[0][0].block_size == 64
    random = read_endpoint_picker_config(write(tmp_path, """\
apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: single-profile-handler
- type: random-picker
schedulingProfiles:
- name: default
  plugins:
    - pluginRef: random-picker
""", "random.yaml"))
    assert random.scorers == [] and random.picker == "random"


def test_no_profile_means_every_scorer_at_weight_one_and_the_max_score_picker(tmp_path):
    parsed = read_endpoint_picker_config(write(tmp_path, """\
apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: queue-scorer
- type: approx-prefix-cache-producer
  parameters:
    autoTune: false
    blockSizeTokens: 64
    lruCapacityPerServer: 1000
- type: prefix-cache-scorer
"""))
    assert [(s.type, w) for s, w in parsed.scorers] == [("queue-scorer", 1.0), ("prefix-cache-scorer", 1.0)]
    prefix = parsed.scorers[1][0]
    assert (prefix.block_tokens, prefix.lru_capacity) == (64, 1000) and parsed.picker == "max"


@pytest.mark.parametrize("text, expected", [
    (PRECISE_GUIDE.replace("  - type: queue-scorer\n", "  - type: fancy-scorer\n"),
     "epp.yaml:17: field 'plugins[5].type': unknown plugin type 'fancy-scorer'"),
    (PRECISE_GUIDE.replace("      - pluginRef: queue-scorer\n        weight: 1.0\n", "      - weight: 1.0\n"),
     "epp.yaml:28: field 'schedulingProfiles[0].plugins[4].pluginRef': missing 'pluginRef'"),
    (PRECISE_GUIDE.replace("      - pluginRef: queue-scorer\n", "      - pluginRef: queue\n"),
     "epp.yaml:28: field 'schedulingProfiles[0].plugins[4].pluginRef': names no plugin defined"),
    (PRECISE_GUIDE.replace("kind: EndpointPickerConfig", "kind: Deployment"),
     "epp.yaml:2: field 'kind': must be EndpointPickerConfig"),
    (PRECISE_GUIDE.replace("weight: 2.0", "weight: -2"),
     "epp.yaml:25: field 'schedulingProfiles[0].plugins[2].weight': must be a number >= 0"),
    (PRECISE_GUIDE.replace("schedulingProfiles:", "schedulingProfile:"),
     "epp.yaml:19: field 'schedulingProfile': unknown field"),
    ("plugins: [a\n", "epp.yaml:2: not valid YAML"),
])
def test_bad_configs_are_one_line_errors_naming_file_line_and_field(tmp_path, text, expected):
    with pytest.raises(InputError) as caught:
        read_endpoint_picker_config(write(tmp_path, text))
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith(str(tmp_path)) and expected in message


def test_a_precise_block_size_other_than_the_engines_fails_at_build(tmp_path):
    path = write(tmp_path, PRECISE_GUIDE.replace("blockSize: 16", "blockSize: 64"))
    with pytest.raises(ValueError, match=r"epp.yaml:12: field 'plugins\[3\].parameters.tokenProcessorConfig.blockSize'"
                                         r": block size 64 must equal the engine's block size 16 .*: a profile of "
                                         r"64-token blocks \(kvroute profiles derive --block-size 64\), or "
                                         r"blockSize 16 in the config$"):
        Cluster(generators.seed_chat(2, 1), ClusterSpec(small_profile(), num_workers=2, policy=f"epp:{path}"), 0)


def test_a_scenario_of_an_epp_file_records_the_files_hash_and_warns_when_it_changed(tmp_path):
    """An EndpointPickerConfig is an input like the trace: its path and sha256 go in the
    scenario's provenance (policy_configs), and a re-run with another file's content says so."""
    import hashlib

    import yaml
    from click.testing import CliRunner

    from kvroute.cli.main import cli

    path = write(tmp_path, PRECISE_GUIDE)
    spec = f"epp:{path}"
    first = CliRunner().invoke(cli, ["compare", "--chats", "4", "--turns", "2", "--rounds", "1", "--workers", "2",
                                     "--policies", f"round_robin,{spec}", "--out", str(tmp_path / "a")])
    assert first.exit_code == 0, first.output
    saved = yaml.safe_load((tmp_path / "a" / "scenario.yaml").read_text())
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    assert saved["kvroute"]["policy_configs"] == {spec: {"path": str(path.resolve()), "sha256": digest}}
    path.write_text(PRECISE_GUIDE.replace("weight: 2", "weight: 3", 1))
    again = CliRunner().invoke(cli, ["compare", "--config", str(tmp_path / "a" / "scenario.yaml")])  # no --out
    assert again.exit_code == 0, again.output
    assert f"warning: policy {spec}'s config file {path.resolve()} (sha256 {digest[:12]}... then, " in again.output


def test_a_scenario_saves_an_epp_file_absolute_so_it_reruns_from_another_directory(tmp_path, monkeypatch):
    import yaml
    from click.testing import CliRunner

    from kvroute.cli.main import cli

    path = write(tmp_path, PRECISE_GUIDE)
    monkeypatch.chdir(tmp_path)
    first = CliRunner().invoke(cli, ["compare", "--chats", "4", "--turns", "2", "--rounds", "1", "--workers", "2",
                                     "--policies", f"round_robin,epp:{path.name},kv_aware", "--out", "a"])
    assert first.exit_code == 0, first.output
    saved = yaml.safe_load((tmp_path / "a" / "scenario.yaml").read_text())
    assert saved["policies"] == f"round_robin,epp:{path.resolve()},kv_aware"
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    path.write_text(PRECISE_GUIDE.replace("weight: 2", "weight: 3", 1))
    again = CliRunner().invoke(cli, ["compare", "--config", str(tmp_path / "a" / "scenario.yaml"), "--out", "b"])
    assert again.exit_code == 0, again.output
    assert f"warning: policy epp:{path.resolve()}'s config file {path.resolve()} (sha256 " in again.output


def test_absolute_configs_keeps_the_specs_other_parameters():
    from kvroute.cli.provenance import absolute_configs

    here = Path(__file__).resolve()
    relative = os.path.relpath(here)
    assert absolute_configs(f"kv_aware,epp:config={relative},kv_event_delay_s=0.05") == \
        f"kv_aware,epp:config={here},kv_event_delay_s=0.05"
    assert absolute_configs("epp:no-such-file.yaml,round_robin") == "epp:no-such-file.yaml,round_robin"
    assert absolute_configs(f"epp:{relative},kv_event_delay_s=0.05") == f"epp:{here},kv_event_delay_s=0.05"


LOAD_ONLY = """\
apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins:
  - type: queue-scorer
  - type: max-score-picker
"""


def _report(tmp_path):
    """A Markdown report as llm-d prints them: a bold name, then the config's ```yaml block."""
    text = ("# Report\n\nSome prose.\n\n**precise-scheduling**\n\n```yaml\n" + PRECISE_GUIDE + "```\n\n"
            "### load-scheduling\n\n```yaml\n" + LOAD_ONLY + "```\n")
    return write(tmp_path, text, "report.md")


def test_a_markdown_reports_config_is_read_by_the_name_above_its_block(tmp_path):
    report = _report(tmp_path)
    precise = read_endpoint_picker_config(f"{report}#precise-scheduling")
    from_file = read_endpoint_picker_config(write(tmp_path, PRECISE_GUIDE))
    assert [(type(s).__name__, w) for s, w in precise.scorers] == [(type(s).__name__, w) for s, w in from_file.scorers]
    assert [(type(s).__name__, w) for s, w in read_endpoint_picker_config(f"{report}#load-scheduling").scorers] == \
        [("QueueScorer", 1.0)]
    with pytest.raises(InputError, match=r"report.md: 2 EndpointPickerConfig blocks \(precise-scheduling, "
                                         r"load-scheduling\): name one, as epp:.*report.md#NAME$"):
        read_endpoint_picker_config(report)
    with pytest.raises(InputError, match=r"no EndpointPickerConfig block named 'random'; the file's: "
                                         r"precise-scheduling, load-scheduling$"):
        read_endpoint_picker_config(f"{report}#random")


def test_a_markdown_reports_errors_name_the_reports_line(tmp_path):
    """The block's lines count from the report's top: the precise block starts at line 8, so its
    blockSize (line 12 of the block) is line 19 of the report; the load block starts at line 43."""
    report = _report(tmp_path)
    report.write_text(report.read_text().replace("blockSize: 16", "blockSize: 64"))
    with pytest.raises(ValueError, match=r"report.md:19: field 'plugins\[3\].parameters.tokenProcessorConfig"):
        Cluster(generators.seed_chat(2, 1), ClusterSpec(small_profile(), num_workers=2,
                                                        policy=f"epp:{report}#precise-scheduling"), 0)
    text = report.read_text()
    at = text.rindex("max-score-picker")  # the load block's picker, its line 5
    report.write_text(text[:at] + "nonsense-picker" + text[at + len("max-score-picker"):])
    with pytest.raises(InputError, match=r"report.md:47: field 'plugins\[1\].type'"):
        read_endpoint_picker_config(f"{report}#load-scheduling")


def test_absolute_configs_keeps_a_reports_block_name(tmp_path, monkeypatch):
    from kvroute.cli.provenance import absolute_configs

    report = _report(tmp_path)
    monkeypatch.chdir(tmp_path)
    assert absolute_configs("epp:report.md#load-scheduling,round_robin") == \
        f"epp:{report.resolve()}#load-scheduling,round_robin"
