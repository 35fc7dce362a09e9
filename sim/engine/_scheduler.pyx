# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=False, initializedcheck=False
# distutils: language = c++
"""vLLM v1's step scheduler for one engine, compiled: the same public API and the same results
as the pure-Python ``kvroute.sim.engine.scheduler.Scheduler`` (the reference and fallback, whose
docstrings describe the algorithm; ``kvroute.sim.engine.compiled`` chooses between them, and
``tests/sim/engine/test_scheduler_impls.py`` checks that both take the same steps).

The per-step passes (``schedule``, ``update``, ``decode_run_length``) keep the requests' token
counters as C integers (the compiled ``Request``) and the step's sums in C variables, so an
engine step costs a few Python objects (its lists and its ``SchedulerOutput``) instead of a few
hundred bytecodes per request. Integer division follows Python's rules (``cdivision=False``);
the step's ``prefill_token_pairs`` is summed with the same float operations, in the same order,
as the Python scheduler (the build turns off fused multiply-add), so it is equal bit for bit.
Only compiled ``Request`` objects can be added (TypeError otherwise).
"""

from collections import deque

from libcpp.vector cimport vector

from kvroute.sim.engine._block_pool cimport BlockPool
from kvroute.sim.engine._kv_cache_manager cimport KVCacheManager
from kvroute.sim.engine._request cimport Request
from kvroute.sim.engine.request import RequestStatus
from kvroute.sim.engine.scheduler_output import SchedulerOutput, StepResult

cdef object WAITING = RequestStatus.WAITING
cdef object RUNNING = RequestStatus.RUNNING
cdef object PREEMPTED = RequestStatus.PREEMPTED
cdef object FINISHED_LENGTH_CAPPED = RequestStatus.FINISHED_LENGTH_CAPPED
cdef object FINISHED_ABORTED = RequestStatus.FINISHED_ABORTED


cdef struct StepSums:
    Py_ssize_t num_batched_tokens
    double prefill_token_pairs
    Py_ssize_t decode_context_tokens
    Py_ssize_t num_decodes


cdef inline Py_ssize_t first_run_step(Py_ssize_t c, Py_ssize_t block_size):
    """``kvroute.sim.engine.fast_forward.first_run_step``: the first step j >= 1 of a decode run
    with (c + j) % block_size == 0."""
    cdef Py_ssize_t j = (-c) % block_size
    return j if j else block_size


cdef class Scheduler:
    """The waiting and running queues of one engine and the step algorithm over them.

    Args:
        config: engine settings (``EngineConfig``, read once here).

    With ``config.async_scheduling`` it is also vLLM's ``AsyncScheduler`` (as the pure-Python
    ``kvroute.sim.engine.async_scheduler.AsyncScheduler``): output placeholders after
    ``schedule()``, ``out.samples``, and the async ``update()``.

    Attributes:
        config: as given.
        pool: the worker's compiled BlockPool.
        kv_cache_manager: block tables and prefix-cache counters (the compiled manager).
        waiting: FCFS queue (a deque); preempted requests return to its front.
        running: requests holding blocks, in admission order (a list).
        num_preemptions: preemptions so far (``vllm:num_preemptions_total``).
    """

    cdef readonly object config
    cdef readonly BlockPool pool
    cdef readonly KVCacheManager kv_cache_manager
    cdef readonly object waiting
    cdef public list running
    cdef public Py_ssize_t num_preemptions
    cdef Py_ssize_t _block_size, _max_num_batched_tokens, _max_num_seqs, _max_model_len
    cdef Py_ssize_t _long_prefill_token_threshold
    cdef bint _async
    # NOTE: an instance dict, as the Python class has, so that callers can wrap a method of one
    # scheduler (calibration instruments ``schedule`` this way)
    cdef dict __dict__

    def __init__(self, config) -> None:
        self.config = config
        self._async = config.async_scheduling
        self.pool = BlockPool(config.num_gpu_blocks, config.enable_prefix_caching)
        self.kv_cache_manager = KVCacheManager(self.pool, config.block_size, config.max_model_len)
        self.waiting = deque()
        self.running = []
        self.num_preemptions = 0
        self._block_size = config.block_size
        self._max_num_batched_tokens = config.max_num_batched_tokens
        self._max_num_seqs = config.max_num_seqs
        self._max_model_len = config.max_model_len
        self._long_prefill_token_threshold = config.long_prefill_token_threshold

    # -- queue management ---------------------------------------------------------------------

    def add_request(self, Request request not None) -> None:
        """Append a new request to the waiting queue."""
        request.status = WAITING
        self.waiting.append(request)

    def has_unfinished_requests(self) -> bool:
        """True while any request waits or runs."""
        return bool(self.waiting) or bool(self.running)

    def finish_requests(self, requests, finished_status=FINISHED_ABORTED) -> list:
        """Finish requests from outside the scheduler (vLLM's ``Scheduler.finish_requests``,
        called with ``FINISHED_ABORTED`` by ``EngineCore.abort_requests``): as the pure-Python
        ``Scheduler.finish_requests``, whose docstring gives the rules.

        Raises:
            ValueError: if ``finished_status`` is not a finished status.
        """
        if finished_status not in (FINISHED_LENGTH_CAPPED, FINISHED_ABORTED):
            raise ValueError(f"finish_requests: {finished_status!r} is not a finished status")
        finished_status = RequestStatus(finished_status)
        cdef list valid = []
        cdef set seen = set()
        cdef set from_running = set()
        cdef list from_waiting = []
        cdef Request req
        for r in requests:
            req = <Request?>r
            key = id(req)
            if key in seen or req.status >= FINISHED_LENGTH_CAPPED:
                continue
            if req.status is RUNNING:
                from_running.add(key)
            elif req in self.waiting:
                from_waiting.append(req)
            else:
                continue  # not in this engine (vLLM: an unknown request id)
            seen.add(key)
            valid.append(req)
        if from_running:
            self.running = [r for r in self.running if id(r) not in from_running]
        for r in from_waiting:
            self.waiting.remove(r)
        for r in valid:
            (<Request>r).status = finished_status
            self.kv_cache_manager.free(r)
        return valid

    # -- one step ----------------------------------------------------------------------------

    def schedule(self):
        """Choose the requests and token counts of the next step and allocate their blocks;
        advances each scheduled request's ``num_computed_tokens`` by its scheduled tokens."""
        cdef list requests = []
        cdef list num_scheduled = []
        cdef list preempted = []
        cdef list admitted = []
        cdef vector[Py_ssize_t] num_new
        cdef StepSums sums
        sums.num_batched_tokens = 0
        sums.prefill_token_pairs = 0.0
        sums.decode_context_tokens = 0
        sums.num_decodes = 0
        cdef Py_ssize_t budget = self._max_num_batched_tokens
        cdef Py_ssize_t num_eligible = len(self.running) + len(self.waiting)
        # NOTE: the long-prefill cap applies only when another request competes for the step.
        cdef Py_ssize_t threshold = self._long_prefill_token_threshold if num_eligible > 1 else 0
        budget = self._schedule_running(requests, num_new, preempted, &sums, budget, threshold)
        if not preempted and self.waiting:
            self._schedule_waiting(requests, num_new, admitted, &sums, budget, threshold)
        cdef Py_ssize_t i
        for i in range(<Py_ssize_t>num_new.size()):
            (<Request>requests[i]).num_computed_tokens += num_new[i]
            num_scheduled.append(num_new[i])
        cdef list samples = None
        cdef Request req
        if self._async:
            # vLLM's AsyncScheduler._update_after_schedule: a placeholder per sampling request
            samples = []
            for i in range(<Py_ssize_t>num_new.size()):
                req = <Request>requests[i]
                req.num_in_flight_tokens += num_new[i]
                if req.num_computed_tokens >= req.num_prompt_tokens + req.num_output_tokens + req.num_output_placeholders:
                    req.num_output_placeholders += 1
                    samples.append(True)
                else:
                    samples.append(False)
        # NOTE: filled field by field, without the dataclass's Python __init__ (a frame per step)
        out = SchedulerOutput.__new__(SchedulerOutput)
        out.requests = requests
        out.num_scheduled_tokens = num_scheduled
        out.num_batched_tokens = sums.num_batched_tokens
        out.prefill_token_pairs = sums.prefill_token_pairs
        out.decode_context_tokens = sums.decode_context_tokens
        out.num_decodes = sums.num_decodes
        out.preempted = preempted
        out.admitted = admitted
        out.samples = samples
        return out

    cdef Py_ssize_t _schedule_running(self, list requests, vector[Py_ssize_t]& num_scheduled, list preempted,
                                      StepSums* sums, Py_ssize_t budget, Py_ssize_t threshold) except -1:
        cdef list running = self.running
        cdef KVCacheManager kv = self.kv_cache_manager
        cdef Py_ssize_t max_model_len = self._max_model_len
        cdef Py_ssize_t req_index = 0
        cdef Py_ssize_t computed, num_new, placeholders
        cdef Request req, victim
        cdef bint scheduled
        while req_index < len(running) and budget > 0:
            req = <Request>running[req_index]
            computed = req.num_computed_tokens
            placeholders = req.num_output_placeholders  # 0 without async scheduling
            if placeholders and computed + 2 - placeholders >= req.num_prompt_tokens + req.max_tokens:
                # NOTE: async scheduling: the step in flight already samples the last token.
                req_index += 1
                continue
            num_new = req.num_prompt_tokens + req.num_output_tokens + placeholders - computed
            if 0 < threshold < num_new:
                num_new = threshold
            if num_new > budget:
                num_new = budget
            if num_new > max_model_len - computed - 1:
                num_new = max_model_len - computed - 1
            if num_new <= 0:
                req_index += 1
                continue
            scheduled = True
            while not kv.extend_running(req, num_new):
                victim = <Request>running.pop()
                self._preempt(victim)
                preempted.append(victim)
                if victim is req:
                    scheduled = False
                    break
            if not scheduled:
                break
            _add_to_output(requests, num_scheduled, sums, req, num_new, computed)
            budget -= num_new
            req_index += 1
        return budget

    cdef int _schedule_waiting(self, list requests, vector[Py_ssize_t]& num_scheduled, list admitted,
                               StepSums* sums, Py_ssize_t budget, Py_ssize_t threshold) except -1:
        waiting = self.waiting
        cdef list running = self.running
        cdef KVCacheManager kv = self.kv_cache_manager
        cdef Py_ssize_t max_num_seqs = self._max_num_seqs
        cdef Request req
        cdef object hit_blocks
        cdef Py_ssize_t num_hit, num_computed, num_new
        cdef bint looked_up
        while budget > 0 and waiting:
            if len(running) >= max_num_seqs:
                break
            req = <Request>waiting[0]
            hit_blocks = []
            num_hit = 0
            looked_up = req.num_computed_tokens == 0
            if looked_up:
                hit_blocks, num_hit = kv.get_computed_blocks(req)
            num_computed = req.num_computed_tokens + num_hit
            num_new = req.num_prompt_tokens + req.num_output_tokens - num_computed
            if 0 < threshold < num_new:
                num_new = threshold
            if num_new > budget:
                num_new = budget
            if not kv.allocate_slots(req, num_new, hit_blocks, True):
                break  # NOTE: head-of-line blocking: the rest of the queue waits too.
            waiting.popleft()
            running.append(req)
            if looked_up:
                # vLLM records prefix-cache stats at admission only, not on failed lookups, and
                # none with prefix caching off (KVCacheManager.record_prefix_cache_stats).
                if self.pool.enable_caching:
                    kv.stats.record(req.num_prompt_tokens + req.num_output_tokens, num_hit,
                                    preempted=req.num_preemptions > 0)
                if req.num_cached_tokens is None:
                    req.num_cached_tokens = num_hit
            req.status = RUNNING
            req.num_computed_tokens = num_computed
            admitted.append(req)
            _add_to_output(requests, num_scheduled, sums, req, num_new, num_computed)
            budget -= num_new
        return 0

    cdef int _preempt(self, Request req) except -1:
        """Free a running request's blocks and put it at the front of the waiting queue."""
        self.kv_cache_manager.free(req)
        req.status = PREEMPTED
        req.num_computed_tokens = 0
        # async scheduling: the output in flight is still delivered, but moves no counter
        req.num_stale_output_tokens = req.num_in_flight_tokens
        req.num_output_placeholders = 0
        req.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(req)
        return 0

    # -- runs of identical decode steps ------------------------------------------------------

    def decode_run_length(self, out) -> int:
        """How many steps after ``out`` would repeat its composition exactly (see the Python
        scheduler's method); 0 when ``out`` is not a pure decode step of every running request
        with nothing waiting."""
        cdef list requests = out.requests
        if self._async:
            return 0  # outputs lag their step: a run's steps are not identical
        if self.waiting or out.preempted or out.admitted or len(requests) != len(self.running):
            return 0
        if out.num_batched_tokens != len(requests):
            return 0
        cdef Py_ssize_t max_model_len = self._max_model_len
        cdef Py_ssize_t n = 1 << 62
        cdef Py_ssize_t left, room
        cdef Request req
        for r in requests:
            req = <Request>r
            if req.num_output_tokens < 1 or req.num_computed_tokens < req.num_prompt_tokens + req.num_output_tokens:
                return 0  # a recomputing request (one token of a replayed prompt per step) samples nothing
            left = req.max_tokens - req.num_output_tokens - 2
            room = max_model_len - req.num_prompt_tokens - req.num_output_tokens - 2
            n = min(n, left, room)
        if n <= 0:
            return 0
        return min(n, self._steps_before_blocks_run_out(requests, n))

    cdef Py_ssize_t _steps_before_blocks_run_out(self, list requests, Py_ssize_t n) except -1:
        cdef Py_ssize_t bs = self._block_size
        cdef Py_ssize_t free = self.pool._num_free
        if len(requests) * (-(-n // bs)) <= free:
            return n
        cdef vector[Py_ssize_t] firsts
        for r in requests:
            firsts.push_back(first_run_step((<Request>r).num_computed_tokens - 1, bs))
        cdef Py_ssize_t lo = 0, hi = n, mid, used, f  # largest j with blocks_by(j) <= free
        while lo < hi:
            mid = (lo + hi + 1) // 2
            used = 0
            for f in firsts:
                if f <= mid:
                    used += (mid - f) // bs + 1
            if used <= free:
                lo = mid
            else:
                hi = mid - 1
        return lo

    def advance_decode_run(self, list requests, Py_ssize_t num_steps) -> None:
        """Apply ``num_steps`` decode steps to ``requests`` at once, exactly as that many
        ``schedule()`` + ``update()`` calls would (see the Python scheduler's method)."""
        if num_steps <= 0:
            return
        cdef Py_ssize_t bs = self._block_size
        cdef KVCacheManager kv = self.kv_cache_manager
        cdef Request req
        cdef Py_ssize_t pos, c, j
        if not kv.allocate_decode_run(requests, num_steps):
            events = []  # (step, position in running order, kind)
            for pos in range(len(requests)):
                c = (<Request>requests[pos]).num_computed_tokens  # step j computes token c + j
                for j in range(first_run_step(c - 1, bs), num_steps + 1, bs):
                    events.append((j, pos, 0))  # token c + j opens a block
                for j in range(first_run_step(c, bs), num_steps + 1, bs):
                    events.append((j, pos, 1))  # token c + j fills its block
            events.sort()
            for _, pos, kind in events:
                r = requests[pos]
                if kind == 0:
                    kv.allocate_new_blocks(r, 1)
                else:
                    kv.cache_blocks(r, kv.get_num_cached_blocks(r) + 1)
        for r in requests:
            req = <Request>r
            req.num_computed_tokens += num_steps
            req.num_output_tokens += num_steps

    def update(self, out):
        """Apply a finished step: sample one token for every request whose prompt (and, after a
        preemption, replayed output) is computed; finish and free those that reach
        ``max_tokens`` or ``max_model_len``. With async scheduling, as
        ``AsyncScheduler.update``.

        Raises:
            ValueError: with async scheduling, if ``out`` was not scheduled so.
        """
        if self._async:
            return self._update_async(out)
        cdef list emitted = []
        cdef list finished = []
        cdef Py_ssize_t max_model_len = self._max_model_len
        cdef Request req
        for r in out.requests:
            req = <Request>r
            if req.status is not RUNNING:
                continue
            if req.num_computed_tokens < req.num_prompt_tokens + req.num_output_tokens:
                continue  # a prefill chunk that does not finish the sequence samples nothing
            req.num_output_tokens += 1
            emitted.append(req)
            if req.num_output_tokens >= req.max_tokens or req.num_prompt_tokens + req.num_output_tokens >= max_model_len:
                req.status = FINISHED_LENGTH_CAPPED
                finished.append(req)
        if finished:
            for r in finished:
                self.kv_cache_manager.free(r)
            self.running = [r for r in self.running if (<Request>r).status is RUNNING]
        result = StepResult.__new__(StepResult)
        result.emitted = emitted
        result.finished = finished
        return result

    cdef object _update_async(self, out):
        # vLLM's update_from_output with AsyncScheduler._update_request_with_output (see the
        # pure-Python kvroute.sim.engine.async_scheduler.AsyncScheduler.update)
        cdef list samples = out.samples
        if samples is None:
            raise ValueError("AsyncScheduler.update: the step was not scheduled by an AsyncScheduler")
        cdef list emitted = []
        cdef list finished = []
        cdef list requests = out.requests
        cdef list num_scheduled = out.num_scheduled_tokens
        cdef KVCacheManager kv = self.kv_cache_manager
        cdef bint caching = self.pool.enable_caching
        cdef Py_ssize_t bs = self._block_size
        cdef Py_ssize_t max_model_len = self._max_model_len
        cdef Py_ssize_t i, n
        cdef bint stale, stopped, was_running, stopped_waiting = False
        cdef Request req
        for i in range(len(requests)):
            req = <Request>requests[i]
            status = req.status
            if status is FINISHED_LENGTH_CAPPED or status is FINISHED_ABORTED:
                continue  # finished (or aborted) while this step was in flight
            n = num_scheduled[i]
            req.num_in_flight_tokens -= n
            stale = req.num_stale_output_tokens > 0
            if stale:
                req.num_stale_output_tokens -= n
            if not samples[i]:
                continue  # a prefill chunk that does not reach the end samples nothing
            was_running = status is RUNNING
            req.num_output_tokens += 1
            emitted.append(req)
            stopped = (req.num_output_tokens >= req.max_tokens
                       or req.num_prompt_tokens + req.num_output_tokens >= max_model_len)
            if stopped:
                req.status = FINISHED_LENGTH_CAPPED
            if not stale:
                req.num_output_placeholders -= 1
            if was_running and caching:
                kv.cache_blocks(req, (req.num_computed_tokens - req.num_output_placeholders) // bs)
            if stopped:
                kv.free(req)
                finished.append(req)
                if not was_running:
                    stopped_waiting = True
        if finished:
            self.running = [r for r in self.running if (<Request>r).status is RUNNING]
            if stopped_waiting:
                # NOTE: rare: a request preempted with its last token in flight
                for r in finished:
                    if r in self.waiting:
                        self.waiting.remove(r)
        result = StepResult.__new__(StepResult)
        result.emitted = emitted
        result.finished = finished
        return result


cdef inline void _add_to_output(list requests, vector[Py_ssize_t]& num_scheduled, StepSums* sums, Request req,
                                Py_ssize_t num_new, Py_ssize_t computed) except *:
    requests.append(req)
    num_scheduled.push_back(num_new)
    sums.num_batched_tokens += num_new
    if num_new == 1:
        sums.decode_context_tokens += computed + 1
        sums.num_decodes += 1
    else:
        # scheduler_output.prefill_pairs(computed, num_new), operation by operation
        sums.prefill_token_pairs += <double>num_new * (<double>computed + <double>(num_new + 1) / 2.0)

