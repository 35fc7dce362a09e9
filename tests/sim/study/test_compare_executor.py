"""compare runs its policy x round grid on the executors sweep uses, with identical results."""

import subprocess
import sys
import textwrap

import pandas as pd
import pytest
from click.testing import CliRunner

from kvroute.sim.cluster.cluster import ClusterSpec
from kvroute.sim.study.executors import run_tasks
from kvroute.sim.study.experiment import compare
from kvroute.sim.timing.profile import load_profile
from kvroute.traces.generators import seed_chat


def _square(x):
    return x * x


def test_run_tasks_hands_every_result_to_its_index():
    for executor in ("sequential", "local"):
        seen = {}
        run_tasks(_square, [1, 2, 3, 4], seen.__setitem__, executor, max_workers=2)
        assert seen == {0: 1, 1: 4, 2: 9, 3: 16}
    with pytest.raises(ValueError, match="unknown executor 'threads'"):
        run_tasks(_square, [1], print, "threads")
    with pytest.raises(ValueError, match="an address is for executor='dask'"):
        run_tasks(_square, [1], print, "local", address="tcp://127.0.0.1:1")


STUCK_POOL = textwrap.dedent("""
    import os, struct
    from concurrent.futures import ProcessPoolExecutor
    from kvroute.sim.study import executors
    pool = ProcessPoolExecutor(max_workers=2, initializer=executors._pool_worker_init)
    assert pool.submit(abs, -1).result() == 1
    # what a process terminated while sending its result leaves in the pipe: a message header
    # announcing 1,000 bytes, then 10 of them; the pool's manager thread waits for the rest
    os.write(pool._result_queue._writer.fileno(), struct.pack("!i", 1000) + bytes(10))
    executors.stop_pool(pool)
    print("stopped")
""")


def test_stop_pool_ends_a_pool_whose_result_was_cut_mid_message():
    """The hang behind a SIGTERM'd ``compare --executor local`` that never exited: a worker
    terminated mid-result left the manager thread reading for ever, and ``shutdown`` joined it.
    In a child process, so that the old behaviour fails the test rather than hanging pytest's exit
    (the timeout only guards against that hang)."""
    done = subprocess.run([sys.executable, "-c", STUCK_POOL], capture_output=True, text=True, timeout=60)
    assert (done.returncode, done.stdout) == (0, "stopped\n"), done.stderr


def test_compare_on_a_process_pool_equals_compare_in_process():
    spec = ClusterSpec(load_profile("a6000-qwen2.5-7b"), num_workers=2)
    trace = seed_chat(num_chats=6, num_turns=2)
    seen = []
    args = (trace, spec, ["round_robin", "kv_aware"])
    here = compare(*args, rounds=2, seed=4)
    pooled = compare(*args, rounds=2, seed=4, executor="local", max_workers=2, progress=lambda p, r: seen.append((p, r)))
    pd.testing.assert_frame_equal(here.summaries, pooled.summaries)
    pd.testing.assert_frame_equal(here.records(), pooled.records())
    assert sorted(seen) == [("kv_aware", 0), ("kv_aware", 1), ("round_robin", 0), ("round_robin", 1)]


def test_compare_and_sweep_take_the_same_executor_options():
    from kvroute.cli.main import cli

    runner = CliRunner()
    for command in ("compare", "sweep"):
        text = runner.invoke(cli, [command, "--help"]).output
        assert "--executor [local|sequential|dask]" in text and "[default: local]" in text, command
        assert "--max-workers" in text and "--address" in text, command
    args = ["compare", "--chats", "4", "--turns", "2", "--rounds", "2", "--policies", "round_robin,kv_aware", "--json"]
    local = runner.invoke(cli, args, catch_exceptions=False).output
    sequential = runner.invoke(cli, args + ["--executor", "sequential"], catch_exceptions=False).output
    assert local == sequential
