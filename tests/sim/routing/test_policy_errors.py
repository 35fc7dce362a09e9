"""What a policy's ``choose`` must return, and the error a run stops with when a policy returns
anything else or raises (``PolicyError``: names the policy, its file and the line)."""

import inspect
import pickle

import numpy as np
import pytest

from kvroute.sim.cluster.cluster import ClusterSpec, simulate
from kvroute.sim.routing import POLICIES, Policy, PolicyError, RouterView, make_policy
from kvroute.sim.routing.policy_errors import checked_worker, prepare_policy, raise_policy_error
from kvroute.sim.timing.profile import load_profile
from kvroute.traces.generators import seed_chat


class Returns(Policy):
    """Routes every request to ``value``."""

    value: object = 0

    def choose(self, request, view):
        return self.value


class Raises(Policy):
    def choose(self, request, view):
        return {}["no such key"]


class PrepareRaises(Returns):
    def prepare(self, view):
        raise ZeroDivisionError("no workers to divide by")


class PrepareRejects(Returns):
    def prepare(self, view):
        raise ValueError("this policy needs 8 workers")


class InitRaises(Returns):
    def __init__(self, rng, size: int = 1):
        super().__init__(rng)
        self.table = [0] * size
        self.first = self.table[size]


class ReadsCache(Policy):
    """The most cached blocks, as a user's first cache-aware policy might read them."""

    def choose(self, request, view):
        matched = view.matched_blocks(request.block_hashes)
        return max(view.alive_workers(), key=matched.__getitem__)


class ReadsQueue(Policy):
    """The shortest scraped queue."""

    def choose(self, request, view):
        queue = view.load("queue")
        return min(view.alive_workers(), key=queue.__getitem__)


RAISE_LINE = inspect.getsourcelines(Raises.choose)[1] + 1
CACHE_LINE = inspect.getsourcelines(ReadsCache.choose)[1] + 1
QUEUE_LINE = inspect.getsourcelines(ReadsQueue.choose)[1] + 1
INIT_LINE = inspect.getsourcelines(InitRaises.__init__)[1] + 3
PREPARE_LINE = inspect.getsourcelines(PrepareRaises.prepare)[1] + 1


@pytest.fixture
def registered(monkeypatch):
    """``registered(name, cls, **attributes)``: a subclass of ``cls`` registered as ``name`` for
    this test only (the registry is left as it was)."""

    def register(name, cls, **attributes):
        sub = type(cls.__name__, (cls,), {"name": name, **attributes})
        monkeypatch.setitem(POLICIES, name, sub)
        return sub

    return register


def run(policy: str, num_workers: int = 2):
    trace = seed_chat(num_chats=3, num_turns=2, system_words=100, user_words=20, reply_tokens=8)
    return simulate(trace, ClusterSpec(load_profile("a6000-qwen2.5-7b"), num_workers, policy=policy), seed=0)


@pytest.mark.parametrize("value, shown", [(-1, "-1"), (99, "99"), (2, "2"), (1.0, "1.0 (a float)"),
                                          (True, "True (a bool)"), (None, "None (a NoneType)")])
def test_a_choice_that_is_not_a_worker_stops_the_run_naming_the_policy(registered, value, shown):
    """-1 used to route to the last worker silently (Python's negative index); 99 and 1.0 ended
    in an IndexError or TypeError reported as a bug in kvroute."""
    registered("bad_choice", Returns, value=value)
    with pytest.raises(PolicyError) as caught:
        run("bad_choice")
    line = Returns.choose.__code__.co_firstlineno  # a value has no line: the one of choose's def is named
    assert line == 22
    assert str(caught.value) == (f"policy 'bad_choice' ({__file__}, choose() defined at line 22) returned {shown} "
                                 "from choose(): a worker must be an int in range(2)")
    assert (caught.value.policy, caught.value.where, caught.value.line) == ("bad_choice", __file__, 22)
    assert isinstance(caught.value, ValueError)  # the CLI prints it as a one-line Error:


def test_a_numpy_integer_routes_as_the_same_int(registered):
    registered("one", Returns, value=1)
    registered("np_one", Returns, value=np.int64(1))
    plain, numpy = run("one").records, run("np_one").records
    assert (plain["worker"] == 1).all()
    assert plain.drop(columns="policy", errors="ignore").equals(numpy.drop(columns="policy", errors="ignore"))


def test_checked_worker_converts_integers_and_refuses_the_rest():
    policy = make_policy("round_robin", np.random.default_rng(0))
    for value in (np.int64(3), np.int32(0), np.uint8(2), 1):
        got = checked_worker(policy, value, 4)
        assert got == int(value) and got.__class__ is int
    for value in (4, -1, np.int64(-1), 2.0, np.float64(1.0), True, np.True_, "1", [1]):
        with pytest.raises(PolicyError, match=r"^policy 'round_robin' \(built in: kvroute/sim/routing/"
                                              r"round_robin\.py, choose\(\) defined at line \d+\) returned .* from choose\(\): a worker must "
                                              r"be an int in range\(4\)$"):
            checked_worker(policy, value, 4)


def test_an_exception_in_choose_names_the_policy_file_and_line(registered):
    registered("raises", Raises)
    with pytest.raises(PolicyError) as caught:
        run("raises")
    error = caught.value
    assert str(error) == f"policy 'raises' ({__file__} line {RAISE_LINE}) raised KeyError in choose(): 'no such key'"
    assert (error.policy, error.where, error.line) == ("raises", __file__, RAISE_LINE)
    assert isinstance(error.__cause__, KeyError)
    # a process pool sends it back pickled: the message and the attributes survive
    back = pickle.loads(pickle.dumps(error))
    assert type(back) is PolicyError and str(back) == str(error)
    assert (back.policy, back.where, back.line) == (error.policy, error.where, error.line)


def test_a_policy_that_reads_what_it_did_not_declare_stops_and_says_which_flag(registered):
    """A policy reading the cache view without ``uses_prefixes`` used to get zeros from every
    worker (no prefix index is kept for it) and ran as a cache-blind policy; one reading the
    scraped queue without ``uses_metrics`` read the simulator's values but zeros live (the live
    replay polls /metrics only for the policies that declare it). Both now stop the run."""
    registered("reads_cache", ReadsCache)
    registered("reads_queue", ReadsQueue)
    with pytest.raises(PolicyError) as caught:
        run("reads_cache")
    assert str(caught.value) == (f"policy 'reads_cache' ({__file__} line {CACHE_LINE}) raised RuntimeError in "
                                 "choose(): matched_blocks: the router keeps no prefix index for this policy; a "
                                 "policy that reads the cache view sets uses_prefixes = True (Policy)")
    with pytest.raises(PolicyError) as caught:
        run("reads_queue")
    assert str(caught.value) == (f"policy 'reads_queue' ({__file__} line {QUEUE_LINE}) raised ValueError in "
                                 "choose(): load signal 'queue' needs the workers' /metrics, which the router reads "
                                 "for a policy that sets uses_metrics = True (Policy)")
    registered("declares_cache", ReadsCache, uses_prefixes=True)
    registered("declares_queue", ReadsQueue, uses_metrics=True)
    cached = run("declares_cache").records  # the shared system prompt draws every chat to worker 0
    assert cached["worker"].eq(0).all() and cached["cached_tokens"].sum() > 0
    assert run("declares_queue").records["status"].eq("ok").all()


def test_prepare_and_init_errors_name_the_policy_too(registered):
    registered("bad_prepare", PrepareRaises)
    with pytest.raises(PolicyError, match=rf"^policy 'bad_prepare' \({__file__} line {PREPARE_LINE}\) raised "
                                          r"ZeroDivisionError in prepare\(\): no workers to divide by$"):
        run("bad_prepare")
    registered("rejects", PrepareRejects)  # a ValueError of prepare is its documented refusal: as it is
    with pytest.raises(ValueError, match="^this policy needs 8 workers$") as caught:
        run("rejects")
    assert not isinstance(caught.value, PolicyError)
    registered("bad_init", InitRaises)
    with pytest.raises(PolicyError, match=rf"^policy 'bad_init' \({__file__} line {INIT_LINE}\) raised "
                                          r"IndexError in __init__\(\): list index out of range$"):
        make_policy("bad_init:size=2", np.random.default_rng(0))


def test_a_built_in_policy_says_it_is_built_in():
    policy, view = make_policy("kv_aware", np.random.default_rng(0)), RouterView(2, 16, 256)
    view.mark_dead(0)
    view.mark_dead(1)
    with pytest.raises(PolicyError) as caught:
        try:
            policy.choose(None, view)
        except RuntimeError as exc:
            raise_policy_error(policy, exc, "choose")
    line = caught.value.line
    assert str(caught.value) == (f"policy 'kv_aware' (built in: kvroute/sim/routing/kv_aware.py line {line}) raised "
                                 "RuntimeError in choose(): no live worker to route to")


def test_memory_errors_pass_through():
    policy = make_policy("round_robin", np.random.default_rng(0))
    with pytest.raises(MemoryError):
        raise_policy_error(policy, MemoryError(), "choose")


def test_prepare_policy_passes_a_clean_prepare():
    policy = make_policy("round_robin", np.random.default_rng(0))
    assert prepare_policy(policy, RouterView(2, 16, 256)) is None
