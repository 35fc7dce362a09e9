"""The live replay checks a policy's choice as the simulator does (no server needed: the streams
are replaced, or the error comes before any is opened)."""

import asyncio

import numpy as np
import pytest

from kvroute.calibrate.validation.replay import Endpoint, LiveReplay, ReplaySpec
from kvroute.sim.routing import POLICIES, Policy, PolicyError
from kvroute.traces.format import Trace, TraceRecord

NOWHERE = [Endpoint("http://127.0.0.1:1", "fake"), Endpoint("http://127.0.0.1:2", "fake")]


class Returns(Policy):
    value: object = 0

    def choose(self, request, view):
        return self.value


class Fails(Policy):
    def choose(self, request, view):
        raise RuntimeError("my policy's own bug")


@pytest.fixture
def registered(monkeypatch):
    def register(name, cls, **attributes):
        monkeypatch.setitem(POLICIES, name, type(cls.__name__, (cls,), {"name": name, **attributes}))

    return register


def replay(policy: str, streamed: list | None = None) -> LiveReplay:
    """An open-loop replay of three requests under ``policy``; with ``streamed``, each request's
    stream is replaced by one that appends its worker and succeeds."""
    records = [TraceRecord(i, 0.0, 64, 4, (2 * i, 2 * i + 1)) for i in range(3)]
    live = LiveReplay(Trace(records, 32), NOWHERE, 32, ReplaySpec(policy, closed_loop=False))
    if streamed is not None:
        async def stream(rec, worker, prompt, record):
            streamed.append(worker)
            record.first_token = record.last_token = record.finish = live.now()
            return True

        live._stream = stream
    return live


@pytest.mark.parametrize("value, shown", [(-1, "-1"), (2, "2"), (1.0, "1.0 (a float)"), (True, "True (a bool)")])
def test_a_choice_that_is_not_a_worker_stops_the_replay(registered, value, shown):
    registered("bad_choice", Returns, value=value)
    streamed = []
    with pytest.raises(PolicyError) as caught:
        asyncio.run(replay("bad_choice", streamed).run())
    assert str(caught.value) == (f"policy 'bad_choice' ({__file__}, choose() defined at line 19) returned {shown} "
                                 "from choose(): a worker must be an int in range(2)")
    assert streamed == []


def test_a_numpy_integer_is_sent_as_a_plain_int(registered):
    registered("np_one", Returns, value=np.int64(1))
    streamed = []
    live = replay("np_one", streamed)
    asyncio.run(live.run())
    assert streamed == [1, 1, 1] and all(w.__class__ is int for w in streamed)
    assert [r.worker for r in live.records] == [1, 1, 1]


def test_a_runtime_error_is_no_live_worker_only_when_every_worker_is_dead(registered):
    registered("fails", Fails)
    with pytest.raises(PolicyError, match=rf"^policy 'fails' \({__file__} line \d+\) raised RuntimeError in "
                                          r"choose\(\): my policy's own bug$"):
        asyncio.run(replay("fails", []).run())
    live = replay("round_robin", [])
    live.view.mark_dead(0)
    live.view.mark_dead(1)
    asyncio.run(live.run())
    assert [r.error for r in live.records] == ["not sent: no live worker to route to"] * 3
