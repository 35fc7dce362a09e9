"""The engine steps a measured experiment causes, derived with the simulator's own Scheduler.

Every measurement is explained as a sum of step times of ``kvroute.sim.timing.cost_model.StepCost``
over the steps that ``kvroute.sim.engine.scheduler.Scheduler`` runs for the experiment, so the fitted
coefficients mean exactly what the simulator uses them for (chunking at
``max_num_batched_tokens``, the prefix-cache hit rules, the decode context of each step).

A :class:`Step` is the step's composition; :func:`design_row` turns a list of steps into one
row of the least-squares design matrix, given which steps sit on the weight-load floor.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np

from kvroute.sim.engine.config import EngineConfig
from kvroute.sim.timing.cost_model import StepCost
from kvroute.sim.engine.request import Request
from kvroute.sim.engine.scheduler import Scheduler, SchedulerOutput

#: Coefficient order of the design matrix (the fields of ``StepCost``).
COEFFICIENTS = ("step_overhead_s", "weight_load_s", "per_token_s", "per_request_s",
                "prefill_attn_s", "decode_attn_s")


@dataclass(frozen=True, slots=True)
class Step:
    """Composition of one engine step.

    Attributes:
        tokens: scheduled tokens (``num_batched_tokens``).
        reqs: scheduled requests.
        pairs: causal attention pairs of the prefill chunks.
        ctx: context tokens read by one-token (decode) requests.
    """

    tokens: int
    reqs: int
    pairs: float
    ctx: float

    @classmethod
    def of(cls, out: SchedulerOutput) -> "Step":
        """The composition of a Scheduler step."""
        return cls(out.num_batched_tokens, out.num_reqs, out.prefill_token_pairs, out.decode_context_tokens)

    def time(self, cost: StepCost) -> float:
        """Seconds this step takes under ``cost``."""
        return cost.step_time(self.tokens, self.reqs, self.pairs, int(round(self.ctx)))


def design_row(steps: list[Step], cost: StepCost | None) -> np.ndarray:
    """Feature vector (order :data:`COEFFICIENTS`) of a sum of steps; ``sum(time) = row @ coef``.

    A step whose linear-layer time ``per_token_s * tokens`` is below ``weight_load_s`` (under
    ``cost``) contributes 1 to the ``weight_load_s`` column instead of its tokens to
    ``per_token_s``; with ``cost`` None no step is on the floor.
    """
    row = np.zeros(len(COEFFICIENTS))
    for s in steps:
        row[0] += 1.0
        if cost is not None and cost.per_token_s * s.tokens < cost.weight_load_s:
            row[1] += 1.0
        else:
            row[2] += s.tokens
        row[3] += s.reqs
        row[4] += s.pairs
        row[5] += s.ctx
    return row


def predict(steps: list[Step], cost: StepCost) -> float:
    """Seconds the steps take under ``cost`` (exact, floor included)."""
    return sum(s.time(cost) for s in steps)


class _Ids:
    """Fresh block-hash ids; shared prefixes reuse a list of them."""

    def __init__(self) -> None:
        self._next = itertools.count(1)

    def fresh(self, n: int) -> list[int]:
        return [next(self._next) for _ in range(n)]


def _hashes(ids: _Ids, prefix: list[int], prompt_len: int, max_tokens: int, block_size: int) -> list[int]:
    total = (prompt_len + max_tokens) // block_size
    own = max(0, total - len(prefix))
    return (prefix + ids.fresh(own))[:total]


def _engine(engine: EngineConfig) -> EngineConfig:
    # A roomy pool: the calibration sweeps never fill the cache, and the fit must not depend on
    # the server's (possibly huge) block count.
    from dataclasses import replace

    return replace(engine, num_gpu_blocks=max(engine.num_gpu_blocks, 2), enable_prefix_caching=True)


def _run_until(sched: Scheduler, done) -> list[Step]:
    steps = []
    for _ in range(100_000):
        out = sched.schedule()
        if out.is_empty():
            raise RuntimeError("scheduler made no progress (engine too small for the experiment)")
        steps.append(Step.of(out))
        result = sched.update(out)
        if done(result):
            return steps
    raise RuntimeError("experiment did not finish")  # pragma: no cover


def _warmed(engine: EngineConfig, prefix_len: int) -> tuple[Scheduler, _Ids, list[int]]:
    """An idle scheduler on a roomy copy of ``engine`` whose cache holds a prefix of
    ``prefix_len`` tokens (request 0 prefilled it and finished), the block-hash id source, and
    the prefix's block hashes (full blocks only)."""
    engine = _engine(engine)
    bs = engine.block_size
    sched = Scheduler(engine)
    ids = _Ids()
    prefix_hashes = ids.fresh(prefix_len // bs)
    if prefix_len > 0:
        sched.add_request(Request(0, prefix_len, 1, _hashes(ids, prefix_hashes, prefix_len, 1, bs)))
        _run_until(sched, lambda r: bool(r.finished))
    return sched, ids, prefix_hashes


def prefill_steps(engine: EngineConfig, prompt_len: int, prefix_len: int = 0) -> list[Step]:
    """Steps from admission to the first token of a prompt of ``prompt_len`` tokens on an idle
    engine whose cache holds the first ``prefix_len`` tokens (left there by an earlier prompt of
    exactly those tokens).

    Returns:
        The steps, in order; their sum is the engine part of the TTFT.

    Raises:
        ValueError: ``prefix_len > prompt_len`` or a non-positive ``prompt_len``.
    """
    if prompt_len < 1 or not 0 <= prefix_len <= prompt_len:
        raise ValueError(f"bad prefill experiment: prompt {prompt_len}, prefix {prefix_len}")
    sched, ids, prefix_hashes = _warmed(engine, prefix_len)
    bs = sched.config.block_size
    req = Request(1, prompt_len, 1, _hashes(ids, prefix_hashes, prompt_len, 1, bs))
    sched.add_request(req)
    return _run_until(sched, lambda r: req in r.emitted)


def expected_cached_tokens(engine: EngineConfig, prompt_len: int, prefix_len: int) -> int:
    """Prompt tokens vLLM serves from the cache in :func:`prefill_steps`' experiment."""
    if prefix_len == 0:
        return 0
    return min(prefix_len // engine.block_size, (prompt_len - 1) // engine.block_size) * engine.block_size


def decode_step(batch: int, total_context: float) -> Step:
    """One step of ``batch`` one-token requests whose contexts sum to ``total_context`` tokens.

    Equal to what :class:`Scheduler` runs in steady decoding (checked by the tests): a decode of
    a request holding ``n`` tokens reads ``n`` context tokens (``computed + 1``).
    """
    return Step(batch, batch, 0.0, float(total_context))


def decode_context(prompt_len: int, output_index: float) -> float:
    """Context read by the decode step that produces output token ``output_index + 1``
    (0-based arrival index ``output_index``): ``prompt_len + output_index`` tokens."""
    return prompt_len + output_index


def mixed_steps(
    engine: EngineConfig,
    batch: int,
    decode_prompt_len: int,
    decode_prefix_len: int,
    outputs_before: int,
    prefill_len: int,
) -> list[Step]:
    """Steps from the arrival of a cold prompt of ``prefill_len`` tokens to its first token while
    ``batch`` requests decode.

    The decoding requests have prompts of ``decode_prompt_len`` tokens sharing a cached prefix of
    ``decode_prefix_len`` tokens and have produced ``outputs_before`` tokens when the new prompt
    is admitted.

    Returns:
        The mixed steps (decodes plus prefill chunks); their sum is what the decode streams see
        as the gap(s) around the new prompt's first token.
    """
    sched, ids, prefix_hashes = _warmed(engine, decode_prefix_len)
    bs = sched.config.block_size
    horizon = outputs_before + 10_000
    decs = [Request(1 + i, decode_prompt_len, horizon, _hashes(ids, prefix_hashes, decode_prompt_len, horizon, bs))
            for i in range(batch)]
    for r in decs:
        sched.add_request(r)
    _run_until(sched, lambda res: all(r.num_output_tokens >= outputs_before for r in decs))
    new = Request(10_000_000, prefill_len, 1, _hashes(ids, [], prefill_len, 1, bs))
    sched.add_request(new)
    return _run_until(sched, lambda r: new in r.emitted)
