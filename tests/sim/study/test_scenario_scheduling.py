"""Scenario.scheduling: the engine's sync or async scheduling, or the profile's."""

import pytest

from kvroute.sim.cluster.cluster import simulate
from kvroute.sim.study.scenario import Scenario, ScenarioError


def test_scheduling_sets_the_engines_async_flag_or_keeps_the_profiles():
    assert Scenario().base_profile().engine.async_scheduling is False  # the shipped prior: vLLM 0.11, sync
    assert Scenario(scheduling="sync").base_profile().engine.async_scheduling is False
    assert Scenario(scheduling="async").base_profile().engine.async_scheduling is True
    assert Scenario(scheduling="async").spec().profile.engine.async_scheduling is True


def test_unknown_scheduling_names_the_field():
    with pytest.raises(ScenarioError) as exc:
        Scenario(scheduling="eager")
    assert exc.value.field == "scheduling"
    assert "valid: profile, sync, async" in str(exc.value)


def test_async_scheduling_delays_later_turns_first_tokens_by_about_one_step():
    """Under async scheduling a new request joins the step after next (docs/log/2026-12-05-async-scheduling.md):
    on a small burst every later turn's TTFT is at least the sync one's."""
    runs = {}
    for mode in ("sync", "async"):
        scenario = Scenario(chats=8, turns=3, workers=2, scheduling=mode, policy="round_robin")
        runs[mode] = simulate(scenario.trace(), scenario.spec(), seed=0)
    later = {mode: run.records.loc[run.records.turn > 1, "ttft"] for mode, run in runs.items()}
    assert len(later["sync"]) == len(later["async"]) == 16
    assert later["async"].sum() > later["sync"].sum()
