"""Where independent simulation runs execute: this process, a local process pool or a Dask cluster.

One place for ``compare``, ``sweep`` and ``sensitivity``: :func:`run_tasks` maps a picklable
function over tasks and hands each result to a callback as it finishes (any order), so callers
keep their own bookkeeping (rows in grid order, runs per policy and round, progress bars).
Stopping: Ctrl-C or SIGTERM raise ``KeyboardInterrupt`` (:class:`Stop` for SIGTERM) in the main
thread while :func:`interrupts_as_keyboard` is active; a local pool's processes are then
terminated at once and reaped, so no child outlives the command. :func:`interrupts_as_keyboard`
is kvroute's one SIGTERM mechanism (``kvroute.cli.signals`` uses it for every command).
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # imported where a pool starts: concurrent.futures costs a simulation ~10 ms
    from concurrent.futures import ProcessPoolExecutor

EXECUTORS = ("local", "sequential", "dask")
"""``local``: a process pool on this machine; ``sequential``: this process; ``dask``: a Dask
cluster (a scheduler address, or a temporary loopback LocalCluster)."""

DASK_CONNECT_TIMEOUT_S = 5.0
"""How long to wait for a Dask scheduler before giving up, s."""


class Stop(KeyboardInterrupt):
    """Raised in the main thread by the SIGTERM handler, so SIGTERM stops work like Ctrl-C."""


def _interrupt(signum, frame) -> None:
    raise KeyboardInterrupt


def _terminate(signum, frame) -> None:
    handler = signal.getsignal(signal.SIGINT)
    if callable(handler) and handler not in (signal.default_int_handler, _interrupt):
        handler(signal.SIGINT, frame)  # e.g. asyncio.run's: it cancels the main task, whose clean-up runs
        return
    raise Stop  # Python's own Ctrl-C (or SIGINT ignored): KeyboardInterrupt, telling SIGTERM apart


@contextlib.contextmanager
def interrupts_as_keyboard(sigint: bool = True):
    """While active, SIGTERM (what ``kill``, ``timeout`` or a service manager sends) takes Ctrl-C's
    path in the main thread: it runs the SIGINT handler of the moment when that is a program's
    own (inside ``asyncio.run``: the main task is cancelled, its clean-up runs, and ``asyncio.run``
    raises ``KeyboardInterrupt``), else it raises :class:`Stop` (a ``KeyboardInterrupt``).

    Args:
        sigint: also make SIGINT raise ``KeyboardInterrupt``, even when a script started us in
            the background (where SIGINT arrives ignored). Leave it False around ``asyncio.run``,
            which installs its own SIGINT handler only over Python's default one.

    The previous handlers are restored after. A no-op outside the main thread.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = [(signal.SIGTERM, signal.signal(signal.SIGTERM, _terminate))]
    if sigint:
        previous.append((signal.SIGINT, signal.signal(signal.SIGINT, _interrupt)))
    try:
        yield
    finally:
        for signum, handler in reversed(previous):
            signal.signal(signum, handler)


@contextlib.contextmanager
def interrupts_deferred():
    """While active, the first Ctrl-C or SIGTERM is held, not raised: for work whose results are all
    in and only need reporting and writing, which a stop must not lose. Yields a list that gets the
    held signal's name (``"SIGINT"`` or ``"SIGTERM"``); the caller checks it after the block (and
    exits as interrupted). A second signal raises at once (``KeyboardInterrupt``, :class:`Stop`
    for SIGTERM): whoever insists is not made to wait.

    The previous handlers are restored after. A no-op outside the main thread (yields an empty
    list that stays empty).
    """
    held: list[str] = []
    if threading.current_thread() is not threading.main_thread():
        yield held
        return

    def hold(signum, frame) -> None:
        if held:
            raise Stop if signum == signal.SIGTERM else KeyboardInterrupt
        held.append(signal.Signals(signum).name)

    previous = [(signum, signal.signal(signum, hold)) for signum in (signal.SIGINT, signal.SIGTERM)]
    try:
        yield held
    finally:
        for signum, handler in reversed(previous):
            signal.signal(signum, handler)


def run_tasks(fn: Callable[[Any], Any], tasks: Sequence[Any], done: Callable[[int, Any], None],
              executor: str = "local", address: str | None = None, max_workers: int | None = None) -> None:
    """Call ``done(i, fn(tasks[i]))`` for every task, as each finishes.

    Args:
        fn: a module-level (picklable) function of one task.
        tasks: the tasks (picklable for ``local`` and ``dask``).
        done: called in this process with the task's index and result.
        executor: one of :data:`EXECUTORS`.
        address: a Dask scheduler address (``tcp://host:8786``); only with ``dask``.
        max_workers: processes of the local pool or of a temporary Dask LocalCluster (default:
            the CPU count, at most the number of tasks).

    Raises:
        ValueError: an unknown executor, an address without ``dask``, Dask missing or its
            scheduler unreachable. An exception of ``fn`` is raised here as soon as it is seen
            (the pool's other runs are stopped).
    """
    if executor not in EXECUTORS:
        raise ValueError(f"unknown executor {executor!r}; valid executors: {', '.join(EXECUTORS)}")
    if address is not None and executor != "dask":
        raise ValueError("an address is for executor='dask'")
    if not tasks:
        return
    if executor == "sequential":
        for i, task in enumerate(tasks):
            done(i, fn(task))
    elif executor == "local":
        _run_local(fn, tasks, max_workers, done)
    else:
        _run_dask(fn, tasks, address, max_workers, done)


def _pool_worker_init() -> None:
    """In each pool process: Ctrl-C at the terminal is the parent's to handle (it terminates us);
    SIGTERM kills at once."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


def stop_pool(pool: ProcessPoolExecutor) -> None:
    """Terminate a pool's processes now (no waiting for running tasks) and reap them.

    A process terminated while it was sending its result leaves the pool's manager thread reading
    the rest of that message, which never comes: the parent's own write end of the result pipe
    keeps it open, so the read blocks for ever and so would ``shutdown`` and the interpreter's
    exit, which join that thread (CPython 3.11's ``concurrent.futures.process``; seen as a
    ``compare --executor local`` that SIGTERM left hanging). With every process gone nothing else
    writes to that pipe: closing the parent's write end ends the read (end of file), and the
    manager thread, seeing a broken pool, ends.
    """
    processes = list((getattr(pool, "_processes", None) or {}).values())
    for process in processes:
        with contextlib.suppress(Exception):
            process.terminate()
    writer = getattr(getattr(pool, "_result_queue", None), "_writer", None)
    try:
        for process in processes:
            process.join(timeout=1.0)
            if process.is_alive():
                process.kill()
                process.join(timeout=1.0)
    finally:  # also when a second Ctrl-C cut the reaping short
        if writer is not None and not any(process.is_alive() for process in processes):
            with contextlib.suppress(OSError):
                writer.close()
    # With every process gone the pool's manager thread sees a broken pool and ends at once;
    # waiting for it avoids a race with the interpreter's exit hook on its closed pipe.
    pool.shutdown(wait=True, cancel_futures=True)


def _run_local(fn, tasks: Sequence[Any], max_workers: int | None, done) -> None:
    from concurrent.futures import ProcessPoolExecutor, as_completed

    workers = max_workers or min(len(tasks), os.cpu_count() or 1)
    pool = ProcessPoolExecutor(max_workers=workers, initializer=_pool_worker_init)
    try:
        futures = {pool.submit(fn, task): i for i, task in enumerate(tasks)}
        for future in as_completed(futures):
            done(futures[future], future.result())
    except BaseException:
        stop_pool(pool)  # also on a run's error: do not wait for the other runs
        raise
    pool.shutdown(wait=True)


def _run_dask(fn, tasks: Sequence[Any], address: str | None, max_workers: int | None, done) -> None:
    try:
        from distributed import Client, LocalCluster, as_completed as dask_completed
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ValueError("executor='dask' needs Dask distributed: pip install 'kvroute[dask]'") from exc
    cluster = None
    if address is None:
        n = max_workers or min(len(tasks), os.cpu_count() or 1)
        # NOTE: loopback only and no dashboard: a run must not open ports to the network.
        cluster = LocalCluster(n_workers=n, threads_per_worker=1, processes=True, host="127.0.0.1",
                               dashboard_address=None)
        address = cluster.scheduler_address
    try:
        try:
            client = Client(address, timeout=DASK_CONNECT_TIMEOUT_S)
        except (OSError, TimeoutError, ValueError) as exc:
            reason = " ".join(str(exc).split()) or type(exc).__name__
            raise ValueError(f"cannot reach the Dask scheduler at {address}: {reason[:200]}") from None
        with client:
            futures = client.map(fn, tasks, pure=False)
            index = {f.key: i for i, f in enumerate(futures)}
            for future in dask_completed(futures):
                done(index[future.key], future.result())
    finally:
        if cluster is not None:
            cluster.close()
