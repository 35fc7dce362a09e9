"""What a calibration sweep measures, and in what order.

:class:`SweepPlan` lists the experiments (``cold``, ``cached``, ``decode``, ``mixed`` and the
concurrency sweep's ``burst``/``burst_all``; what each one measures:
:mod:`kvroute.calibrate.calibration.measure`); :func:`sweep_schedule` interleaves the concurrency
sweep with the one-at-a-time experiments. Running them is
:func:`kvroute.calibrate.calibration.measure.run_sweep`; timing them in advance,
:mod:`kvroute.calibrate.calibration.sweep_time`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from kvroute.calibrate.live.client import CalibrationError, ServerInfo


@dataclass(frozen=True, slots=True)
class SweepPlan:
    """What to measure. All lengths in tokens.

    Attributes:
        cold_lengths, cold_reps: unique-prompt lengths and repetitions.
        cached_prefixes, cached_new, cached_reps: cached-prefix lengths (rounded down to whole
            blocks), new tokens after them, repetitions.
        decode_batches, decode_contexts, decode_tokens, decode_reps: B, context L (rounded to
            whole blocks), output tokens T per request, repetitions.
        mixed_batches, mixed_prefills, mixed_context, mixed_lead, mixed_tokens, mixed_reps: B
            decoding requests of context ``mixed_context``; the cold prompt of each length in
            ``mixed_prefills`` is sent once every decode has streamed ``mixed_lead`` tokens;
            decodes run ``mixed_tokens`` tokens (enough that none finishes before the prompt's first
            token, so the server's prefill-time histogram gains exactly that prompt's sample).
        burst_sizes, burst_shapes, burst_reps: the concurrency sweep: N requests at once for each
            N, each ``(prompt tokens, output tokens)`` shape, on one server and on all; ``()``
            sizes skip it (the dataclass default; the presets include it).
        burst_cached_sizes, burst_cached_shapes: bursts on a cached prefix, in the concurrency
            sweep: N requests at once for each N, each ``(prefix tokens, new tokens, output
            tokens)`` shape, the prefix cached by one request before the burst.
        burst_slots: the concurrency sweep runs in this many slots between the one-at-a-time
            experiments, cut by their count (:func:`sweep_schedule`); 1: all of it after them.
    """

    cold_lengths: tuple[int, ...] = (16, 32, 64, 128, 256, 512, 768, 1024, 1536, 2048, 3072, 4096,
                                     6144, 8192, 12288, 16384)
    cold_reps: int = 3
    cached_prefixes: tuple[int, ...] = (512, 2048, 8192)
    cached_new: tuple[int, ...] = (16, 128, 512, 2048)
    cached_reps: int = 2
    decode_batches: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64)
    decode_contexts: tuple[int, ...] = (128, 1024, 4096, 16384)
    decode_tokens: int = 64
    decode_reps: int = 3
    mixed_batches: tuple[int, ...] = (4, 16)
    mixed_prefills: tuple[int, ...] = (128, 512, 1536)
    mixed_context: int = 1024
    mixed_lead: int = 8
    mixed_tokens: int = 160
    mixed_reps: int = 2
    burst_sizes: tuple[int, ...] = ()
    burst_shapes: tuple[tuple[int, int], ...] = ((256, 32), (2048, 16))
    burst_reps: int = 2
    burst_cached_sizes: tuple[int, ...] = (1, 2, 4, 8, 16)
    burst_cached_shapes: tuple[tuple[int, int, int], ...] = ((2048, 256, 32),)
    burst_slots: int = 12

    @classmethod
    def preset(cls, name: str) -> "SweepPlan":
        """``"full"`` (the shipped profile's sweep) or ``"quick"`` (the live tests, about a minute
        on the tiny CPU model).

        Raises:
            ValueError: unknown name.
        """
        if name == "full":
            return cls(burst_sizes=(1, 2, 4, 8, 16, 32, 64))
        if name == "quick":
            return cls(
                cold_lengths=(16, 64, 256, 1024, 2048, 4096),
                cold_reps=2,
                cached_prefixes=(1024,),
                cached_new=(32, 512),
                cached_reps=1,
                decode_batches=(1, 4, 16),
                decode_contexts=(128, 2048),
                decode_tokens=32,
                decode_reps=1,
                mixed_batches=(4,),
                mixed_prefills=(512,),
                mixed_context=512,
                mixed_tokens=96,
                mixed_reps=1,
                burst_sizes=(1, 4, 16),
                burst_shapes=((256, 16),),
                burst_reps=1,
                burst_cached_sizes=(4,),
                burst_cached_shapes=((512, 128, 16),),
            )
        raise ValueError(f"unknown sweep preset {name!r}; choose 'full' or 'quick'")

    def longest_sequence(self) -> tuple[int, int]:
        """``(prompt, prompt + max_tokens)`` of the longest request of the plan, tokens."""
        cands = [(L, L + 1) for L in self.cold_lengths]
        cands += [(P + N, P + N + 1) for P in self.cached_prefixes for N in self.cached_new]
        cands += [(L, L + self.decode_tokens) for L in self.decode_contexts]
        if self.mixed_batches:
            cands += [(self.mixed_context, self.mixed_context + self.mixed_tokens)]
            cands += [(P, P + 1) for P in self.mixed_prefills]
        if self.burst_sizes:
            cands += [(L, L + T) for L, T in self.burst_shapes]
            if self.burst_cached_sizes:
                cands += [(P + N, P + N + T) for P, N, T in self.burst_cached_shapes]
        return max(cands, key=lambda c: c[1]) if cands else (0, 0)

    def check_fits(self, info: ServerInfo) -> None:
        """Raise when the plan does not fit the server.

        Raises:
            CalibrationError: a sequence longer than ``max_model_len``, a decode batch above
                ``max_num_seqs`` or a mixed step above ``max_num_batched_tokens``.
        """
        prompt, total = self.longest_sequence()
        if prompt >= info.max_model_len or total > info.max_model_len:
            raise CalibrationError(
                f"the sweep needs sequences of {total} tokens (a {prompt}-token prompt plus its output) "
                f"but the server at {info.url} has max_model_len {info.max_model_len}; "
                f"pass --max-len {info.max_model_len - self.decode_tokens - 1} (or less), or start the server "
                f"with a larger --max-model-len"
            )
        too_big = [b for b in (*self.decode_batches, *self.mixed_batches) if b > info.max_num_seqs]
        if too_big:
            raise CalibrationError(
                f"decode batches {too_big} exceed the server's max_num_seqs {info.max_num_seqs} at {info.url}"
            )
        for b in self.mixed_batches:
            for p in self.mixed_prefills:
                if b + p > info.max_num_batched_tokens:
                    raise CalibrationError(
                        f"a mixed step of {b} decodes and a {p}-token prompt exceeds the server's "
                        f"max_num_batched_tokens {info.max_num_batched_tokens} at {info.url}"
                    )

    def clipped(self, max_len: int) -> "SweepPlan":
        """The plan without the lengths whose sequences exceed ``max_len`` tokens; a cached prefix
        stays only where it fits with the largest new-token count (its experiments pair it with
        each of them)."""
        keep = lambda xs, extra: tuple(x for x in xs if x + extra <= max_len)  # noqa: E731
        return replace(
            self,
            cold_lengths=keep(self.cold_lengths, 1),
            cached_prefixes=tuple(P for P in self.cached_prefixes if P + max(self.cached_new, default=0) + 1 <= max_len),
            decode_contexts=keep(self.decode_contexts, self.decode_tokens),
            mixed_prefills=keep(self.mixed_prefills, 1),
            mixed_batches=self.mixed_batches if self.mixed_context + self.mixed_tokens <= max_len else (),
            burst_shapes=tuple((L, T) for L, T in self.burst_shapes if L + T <= max_len),
            burst_cached_shapes=tuple(s for s in self.burst_cached_shapes if sum(s) <= max_len),
        )

    def extended(self, longest: int) -> "SweepPlan":
        """The plan with longer sequences, up to ``longest`` tokens in all (prompt plus output):
        cold prompts at 1.5x, 2x, 3x, 4x, ... the plan's longest cold prompt while they fit, and
        at ``longest - 1``; a cached prefix of ``longest`` minus the largest new-token count
        minus 1; a decode context of ``longest - decode_tokens``. Each family (cold, cached,
        decode) gains lengths only where its own longest sequence falls short of ``longest``.

        For a run whose sequences go beyond the shipped sweep (the lab's 32k-token histories):
        the fitted attention cost is then measured there rather than extrapolated
        (``kvroute.sim.timing.coverage``).

        Raises:
            ValueError: ``longest`` < 2.
        """
        if longest < 2:
            raise ValueError(f"longest must be >= 2 tokens, got {longest}")
        top = max(self.cold_lengths, default=1)
        cold = set(self.cold_lengths)
        for factor in (1.5, 2, 3, 4, 6, 8, 12, 16):
            if int(top * factor) + 1 <= longest:
                cold.add(int(top * factor))
        if top + 1 < longest:
            cold.add(longest - 1)
        new = max(self.cached_new, default=0)
        prefixes = set(self.cached_prefixes)
        if max(prefixes, default=0) + new + 1 < longest and longest - new - 1 > 0:
            prefixes.add(longest - new - 1)
        contexts = set(self.decode_contexts)
        if max(contexts, default=0) + self.decode_tokens < longest:
            contexts.add(longest - self.decode_tokens)
        return replace(self, cold_lengths=tuple(sorted(cold)), cached_prefixes=tuple(sorted(prefixes)),
                       decode_contexts=tuple(sorted(contexts)))

    def without_bursts(self) -> "SweepPlan":
        """The plan without its concurrency sweep."""
        return replace(self, burst_sizes=())

    def bursts(self, num_servers: int, first_id: int, capacity_tokens: int | None = None) -> list[dict[str, Any]]:
        """The concurrency sweep's experiments, numbered from ``first_id``: per repetition, shape
        and N (ascending), a burst on one server (servers taken in turn) then on all servers;
        cold shapes first, then the cached-prefix shapes (``prefix_len`` > 0; none without
        ``burst_sizes``). Bursts whose N sequences do not fit in 90 % of ``capacity_tokens``
        (a shared prefix counted once, as its blocks are) are left out."""
        cap = math.inf if capacity_tokens is None else 0.9 * capacity_tokens
        shapes = [(0, L, T, self.burst_sizes) for L, T in self.burst_shapes]
        if self.burst_sizes:
            shapes += [(P, P + N, T, self.burst_cached_sizes) for P, N, T in self.burst_cached_shapes]
        exps: list[dict[str, Any]] = []
        k = 0
        for rep in range(self.burst_reps):
            for P, L, T, sizes in shapes:
                for N in sorted(sizes):
                    if P + N * (L - P + T) > cap:
                        continue
                    exps.append(dict(kind="burst", rep=rep, batch=N, prompt_len=L, prefix_len=P, max_tokens=T,
                                     server=k % num_servers))
                    k += 1
                    if num_servers > 1:
                        exps.append(dict(kind="burst_all", rep=rep, batch=N, prompt_len=L, prefix_len=P,
                                         max_tokens=T))
        for i, e in enumerate(exps):
            e["exp_id"] = first_id + i
        return exps

    def experiments(self, capacity_tokens: int | None = None, seed: int = 0) -> list[dict[str, Any]]:
        """The experiments in sweep order: cold, cached, decode, mixed; repetitions interleaved
        (every shape once before any twice) and shapes in a seeded random order within each
        repetition, so a drift or an interruption spreads over the grid instead of along it.

        Args:
            capacity_tokens: KV tokens the server holds; decode points whose B contexts do not
                fit in 90% of it are left out (they would measure preemption, not decoding).
        """
        exps: list[dict[str, Any]] = []
        cap = math.inf if capacity_tokens is None else 0.9 * capacity_tokens
        fits = lambda B, L, T: B * (L + T) <= cap  # noqa: E731
        for rep in range(self.cold_reps):
            exps += [dict(kind="cold", rep=rep, prompt_len=L) for L in self.cold_lengths]
        for rep in range(self.cached_reps):
            exps += [dict(kind="cached", rep=rep, prefix_len=P, new_len=N)
                     for P in self.cached_prefixes for N in self.cached_new]
        for rep in range(self.decode_reps):
            exps += [dict(kind="decode", rep=rep, batch=B, context_len=L)
                     for L in self.decode_contexts for B in self.decode_batches
                     if fits(B, L, self.decode_tokens)]
        for rep in range(self.mixed_reps):
            exps += [dict(kind="mixed", rep=rep, batch=B, prefill_len=P)
                     for B in self.mixed_batches for P in self.mixed_prefills
                     if fits(B, self.mixed_context, self.mixed_tokens)]
        rng = np.random.default_rng(seed)
        blocks: dict[tuple, list] = {}
        for e in exps:
            blocks.setdefault((e["kind"], e["rep"]), []).append(e)
        exps = []
        for block in blocks.values():
            exps += [block[i] for i in rng.permutation(len(block))]
        for i, e in enumerate(exps):
            e["exp_id"] = i
        return exps


def sweep_schedule(shares: Sequence[Sequence[dict[str, Any]]], bursts: Sequence[dict[str, Any]], slots: int,
                   seed: int = 0) -> list[tuple[list[list[dict[str, Any]]], list[dict[str, Any]]]]:
    """The sweep's order in time: ``slots`` steps, each a segment of every server's one-at-a-time
    experiments (run concurrently, one at a time per server) followed by a chunk of the
    concurrency sweep (run one burst after another, every server free).

    A host's speed moves while a sweep runs. With every burst after the one-at-a-time
    experiments, the burst fit would compare the sweep's last minute of the host with the minutes
    before it, and its ``contention`` would take up the difference. Spread through them, bursts
    and step costs sample the same stretch of time.

    Segments are cut by count, not by time: the cold and cached experiments are short, so the
    first slots fall within the sweep's first minute and the others minutes apart; the sweep
    takes no longer than with every burst at the end. Cutting by estimated duration would even
    the slots out, but a decode experiment (64 prefills of 16k-token contexts: minutes on a CPU
    server) then ends a slot on one server while the other waits, which makes the sweep minutes
    longer. (The measurements behind both choices: docs/log/from-code-comments.md.)

    Args:
        shares: each server's one-at-a-time experiments in order; segment ``k`` of a share is
            its ``k``-th of ``slots`` near-equal consecutive parts.
        bursts: the concurrency sweep (:meth:`SweepPlan.bursts`); dealt to the chunks in a
            seeded random order, so every chunk mixes shapes and sizes (experiment ids keep
            the plan's order).
        slots: steps, >= 1 (1: every burst after every one-at-a-time experiment).
        seed: seeds the bursts' order (``numpy.random.default_rng(seed)``).

    Returns:
        ``[(segments, chunk), ...]``, ``slots`` long: ``segments[i]`` is server ``i``'s part.

    Raises:
        ValueError: ``slots < 1``.
    """
    if slots < 1:
        raise ValueError(f"burst_slots must be >= 1, got {slots!r}")
    order = [bursts[i] for i in np.random.default_rng(seed).permutation(len(bursts))] if slots > 1 else list(bursts)
    cut = lambda xs, k: list(xs[len(xs) * k // slots:len(xs) * (k + 1) // slots])  # noqa: E731
    return [([cut(share, k) for share in shares], cut(order, k)) for k in range(slots)]
