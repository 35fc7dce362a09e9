"""The notes under a simulated comparison's table (``kvroute compare`` and ``simulate``): what
a reader needs to know that the numbers alone do not say. Each function returns one note line, or
"" when it has nothing to say. ``kvroute sweep`` words its failure, turnover and same-routing notes
with the same functions (``kvroute.cli.sweep_notes``)."""

from __future__ import annotations

FAILED_SHARE_WARNING = 0.1
"""The share of failed requests from which ``failure_note`` warns that the table's latencies are
of the served requests only (below it, a note)."""


def named_as_tables(notes: list[str], policies) -> list[str]:
    """``notes`` with each policy spec that carries a config file's path named as the tables and
    legends name it (``figure_style.short_names``: ``epp:../x/report.md#precise`` as
    ``epp:precise``)."""
    from kvroute.sim.study.figure_style import short_names

    renames = sorted(((spec, name) for spec, name in short_names(policies).items() if spec != name),
                     key=lambda pair: -len(pair[0]))  # a spec that holds another goes first
    for spec, name in renames:
        notes = [note.replace(spec, name) for note in notes]
    return notes


def failure_note(comparison) -> str:
    """A warning under the table when requests failed: how many, and one reason
    (:func:`failure_text` of every run's ``kvroute.sim.cluster.metrics.failures``)."""
    from kvroute.sim.cluster.metrics import Failures, failures

    total = sum((failures(run.record_rows()) for runs in comparison.runs.values() for run in runs), Failures())
    return failure_text(total, "all policies and rounds")


def failure_text(failed, scope: str, latencies: str = "the table's latencies are",
                 no_latencies: str = "the table holds no latencies") -> str:
    """The failure note of the runs whose failed requests ``failed`` counts (a
    ``kvroute.sim.cluster.metrics.Failures``): how many, and one reason; a warning from
    ``FAILED_SHARE_WARNING`` of the requests, which says the latencies are of the served ones
    only. When every request was rejected by the engine (and the later turns of their sessions
    not sent), it says so and why (vLLM's error, and for a prompt too long what to change); ""
    when none failed.

    Args:
        failed: the runs' ``Failures``.
        scope: which runs, in the note's parentheses (``"all policies and rounds"``).
        latencies, no_latencies: what the latencies shown are (``"... are"``: of the served
            only), and that there are none, in the words of the command's table or tables.
    """
    if not failed.failed:
        return ""
    rid, error = failed.example
    example = f"e.g. request {rid}: {advised(error or 'no reason recorded')}"
    if failed.failed < failed.requests:
        share = failed.failed / failed.requests
        if share < FAILED_SHARE_WARNING:
            return f"Note: {failed.failed} of {failed.requests} requests failed ({scope}); {example}"
        return (f"Warning: {failed.failed} of {failed.requests} requests ({100 * share:.0f} %) failed ({scope}), so "
                f"{latencies} of the {failed.requests - failed.failed} served only; {example}")
    if not failed.rejected or failed.timed_out:
        return f"Warning: every request failed ({scope}); {example}"
    text = (f"Warning: every request was rejected ({scope}), so none was served and {no_latencies}: "
            f"{failed.rejected} rejected by the engine, {example}")
    if failed.not_sent:
        text += f"; the other {failed.not_sent} were not sent, their parent request having been rejected"
    return text


def advised(error: str) -> str:
    """An engine's error with what to change, for a prompt longer than the model's context."""
    if error.startswith("This model's maximum context length"):
        return error + " (a prompt must be shorter than max_model_len: raise --max-model-len or shorten the prompts)"
    return error


def failed_count_note(comparison) -> str:
    """``--json``'s failure note, from the runs' summaries (no per-request table): how many
    requests failed over all policies and rounds (``failure_note`` gives one reason)."""
    failed = sum(int(row.get("failed") or 0) for row in comparison.rows)
    if not failed:
        return ""
    return (f"Note: {failed} requests failed (all policies and rounds); the notes without --json, or --out's "
            "records, give the reasons")


def policy_notes(trace, policies: list[str]) -> list[str]:
    """Each policy's own note on the workload (``Policy.workload_note``: e.g. session_affinity on
    requests without a session id), once per policy name, in the order given."""
    from kvroute.sim.routing import POLICIES, parse_spec

    names = dict.fromkeys(parse_spec(spec)[0] for spec in policies)
    return [POLICIES[name].workload_note(trace.records) for name in names]


def model_note(trace, profile) -> str:
    """A note when the workload's own run served another model than the profile's (an
    inference-perf config's ``server.model_name``): the times are the profile's model's."""
    from kvroute.sim.timing.profile import model_key, profile_model_key

    theirs = trace.metadata.get("model_name") if isinstance(trace.metadata, dict) else None
    ours = (profile.raw.get("model") or {}).get("name")
    if not theirs or not ours or model_key(theirs) == profile_model_key(profile):
        return ""
    return (f"Note: the workload config's run served {theirs}; the times here are those of the profile's model, "
            f"{ours} ({profile.name}). To simulate {theirs}: `kvroute profiles derive --model {theirs} --gpu GPU "
            "--tp N`, then --profile FILE.")


def speed_note(profile, num_workers: int) -> str:
    """A note under the table when the workers step at drawn speeds (``host.engine_speed_sigma``):
    a measured input that moves from sweep to sweep and that changes between policies hinge on."""
    sigma = profile.host.engine_speed_sigma if profile.host is not None else 0.0
    if sigma <= 0 or num_workers < 2:
        return ""
    period = profile.host.engine_speed_period_s
    drawn = f"drawn anew every {period:.2g} s" if period > 0 else "drawn per round"
    allowed = ""
    interval = profile.speed_period_interval()
    if interval is not None:
        lo, hi = interval
        allowed = f"; its sweep allows {lo:.2g} s to " + (f"{hi:.2g} s" if hi != float("inf") else "one speed per round")
    return (f"Note: each worker steps at its own speed, {drawn} (log-spread {sigma:.2f}, from {profile.name}'s "
            f"bursts{allowed}); the spread and how long a speed lasts move from sweep to sweep, and changes between "
            "policies move with them (docs/design/timing-and-host-model.md).")


TURNOVER_NOTE = 1.0
"""How many times over a run's evictions must replace the cluster's KV blocks (cached blocks
evicted per run / blocks the workers hold) before ``kv_turnover_note`` speaks."""

LOST_HISTORY_NOTE = 0.01
"""The share of a run's prompt tokens that later turns computed again after their worker evicted
them (``kvroute.sim.cluster.eviction.evicted_history_tokens``) from which ``kv_turnover_note``
also names a policy whose evictions stayed under ``TURNOVER_NOTE`` times the blocks."""

KV_MEMORY_ADVICE = "Hit rates and TTFT then depend on KV memory (try --kv-blocks or --workers)"
"""What the turnover notes say a turned-over cache means."""


def turnover(evicted: float, held: int) -> float | None:
    """How many times over the workers' evictions replaced the blocks they can cache in, when at
    least ``TURNOVER_NOTE`` times (else None, and for no blocks).

    Args:
        evicted: cached blocks evicted per run, all workers (mean over rounds).
        held: blocks the workers can cache in (``kvroute.sim.cluster.eviction.cacheable_blocks``).
    """
    return evicted / held if held and evicted >= TURNOVER_NOTE * held else None


def kv_turnover_note(comparison, block_size: int, trace=None, time_series: bool = False) -> str:
    """A note when the prefix cache turned over: for each policy whose runs evicted, on average,
    at least ``TURNOVER_NOTE`` times the blocks the workers can hold (``num_gpu_blocks`` less
    vLLM's null block each, the capacity ``vllm:kv_cache_usage_perc`` and the time series' KV
    panel count; vLLM's block pool evicts a cached block when it hands the block out again,
    ``num_evictions``), how many and how many times over; with the run's ``trace``, when its
    records have parent links, also what it cost: the share of the prompt tokens a later turn
    computed again that its worker had cached for an earlier turn of the chat and evicted (a
    lower bound: ``kvroute.sim.cluster.eviction``), and the hit rate with them; a policy that
    evicted fewer blocks but lost at least ``LOST_HISTORY_NOTE`` of its prompt tokens so is named
    too. The hit rate and TTFT then depend on KV memory, which the preemption row does not show.
    ``block_size``: tokens per block; ``trace``: the runs' ``Trace``, or a function of a run's
    seed that returns its trace (a generated workload's rounds); ``time_series``: the run drew
    each worker's KV use (the note then points to those figures, not to the option)."""
    from kvroute.sim.cluster.eviction import cacheable_blocks, evicted_history_tokens, parent_links

    known: dict[int, dict] = {}  # seed -> parent links (a generated workload's trace is drawn per round)

    def parents(seed: int) -> dict:
        if seed not in known:
            known[seed] = parent_links(trace(seed) if callable(trace) else trace)
        return known[seed]

    parts = []
    for policy in comparison.policies:
        runs = comparison.runs.get(policy) or []
        if not runs:
            continue
        rows = [run.worker_rows() for run in runs]
        held = cacheable_blocks(rows[0])
        evicted = sum(sum(int(w["num_evictions"]) for w in r) for r in rows) / len(rows)
        if not (held and evicted):
            continue
        cost = None
        # a trace without parent links (Mooncake's, Azure's) gives the rule nothing to read: no figure
        if trace is not None and any(p is not None for p in parents(runs[0].seed).values()):
            counts = [evicted_history_tokens(run.record_rows(), parents(run.seed), block_size) for run in runs]
            lost = sum(x / p for x, _, p in counts if p) / len(counts)
            hit = sum(c / p for _, c, p in counts if p) / len(counts)
            cost = (lost, hit)
        if turnover(evicted, held) is None and (cost is None or cost[0] < LOST_HISTORY_NOTE):
            continue
        parts.append((policy, evicted, evicted / held, held, cost))
    if not parts:
        return ""
    (policy, evicted, times, held, cost), rest = parts[0], parts[1:]
    lead = ("the KV cache turned over" if any(part[2] >= TURNOVER_NOTE for part in parts)
            else "the KV cache evicted history that later turns needed")
    text = (f"Note: {lead}: per run (mean over rounds) the workers evicted {evicted:,.0f} cached "
            f"blocks under {policy}, {_times(times)} times the {held:,} blocks of {block_size} tokens they can cache in "
            f"({held * block_size:,} tokens; vLLM keeps one block of each worker back)")
    if cost is not None:
        lost, hit = cost
        text += (f", and later turns computed again {100 * lost:.1f} % of the prompt tokens that their worker had "
                 f"cached for the chat's earlier turn and evicted (hit rate {hit:.3f}; {hit + lost:.3f} with them)")
    for k, (p, e, t, _, c) in enumerate(rest):
        text += f"{'; and' if k == len(rest) - 1 else ';'} {e:,.0f} under {p} ({_times(t)} times"
        text += f"; {100 * c[0]:.1f} %: {c[1]:.3f}, {c[1] + c[0]:.3f} with them)" if c is not None else ")"
    where = "the timeseries-<policy> figures" if time_series else "--time-series"
    return (text + (". Those shares are lower bounds (blocks shared across chats are not counted)"
                    if any(part[4] is not None for part in parts) else "")
            + f". {KV_MEMORY_ADVICE}; the preemption row counts only requests pushed out while running. Each "
            f"worker's KV use over time: {where}.")


def _times(ratio: float) -> str:
    """A turnover ratio as the note prints it: one decimal, two under ``TURNOVER_NOTE`` (0.95,
    not a 1.0 that did not turn over)."""
    return f"{ratio:.1f}" if ratio >= TURNOVER_NOTE else f"{ratio:.2f}"


def clamped_output_note(comparison, max_model_len: int, trace) -> str:
    """A note when served requests asked for more output tokens than ``max_model_len`` leaves
    after their prompt: vLLM's OpenAI server lowers ``max_tokens`` to what is left
    (``kvroute.sim.engine.scheduler.clamp_max_tokens``) and the simulation does the same, so
    their replies are shorter than the trace says. How many, over all policies and rounds, and
    one example. ``trace``: the runs' ``Trace``, or a function of a run's seed that returns its
    trace (a generated workload's rounds)."""
    asked_by_seed: dict[int, dict[int, int]] = {}
    cut = served = 0
    example = None
    for runs in comparison.runs.values():
        for run in runs:
            if run.seed not in asked_by_seed:
                t = trace(run.seed) if callable(trace) else trace
                asked_by_seed[run.seed] = {r.request_id: r.output_length for r in t.records}
            ok = run.records[run.records["status"] == "ok"]
            asked = ok["request_id"].map(asked_by_seed[run.seed])
            short = ok[ok["output_tokens"] < asked]
            served += len(ok)
            cut += len(short)
            if example is None and len(short):
                row = short.iloc[0]
                example = (int(row["request_id"]), int(row["prompt_tokens"]), int(asked[short.index[0]]),
                           int(row["output_tokens"]))
    if not cut:
        return ""
    rid, prompt, want, got = example
    return (f"Note: {cut} of {served} served requests (all policies and rounds) asked for more output than "
            f"max_model_len {max_model_len:,} leaves after their prompt and got what is left, as vLLM's OpenAI server "
            f"lowers max_tokens; e.g. request {rid}: {prompt:,} prompt tokens, {want:,} asked, {got:,} generated")


def flat_goodput_note(comparison, slo_ttft_s: float, slo_tpot_s: float) -> str:
    """A note when goodput cannot tell runs apart: its share is 1 in every run (every request met
    the service class) or 0 in every run (none did), so the bound, not the policies, sets it.
    ``slo_ttft_s``, ``slo_tpot_s``: the bounds, s."""
    shares = {row.get("goodput_share") for row in comparison.rows}
    if len(shares) != 1 or (share := shares.pop()) not in (0.0, 1.0):
        return ""
    return (f"Note: goodput share is {share:.3f} in every run: {'every' if share else 'no'} request met TTFT <= "
            f"{slo_ttft_s:g} s and TPOT <= {slo_tpot_s:g} s, so goodput does not tell the runs apart; --slo-ttft "
            "and --slo-tpot set your service's bounds.")


def same_routing_note(records) -> str:
    """A note naming policies that routed alike: every request to the same worker as an earlier
    policy of the table, in every round (so their rows differ by nothing but the policy's name).

    Args:
        records: per-request rows with ``policy``, ``round``, ``request_id`` and ``worker``
            (``Comparison.records()``), policies in the table's order.
    """
    from kvroute.sim.cluster.metrics import routed_alike

    return same_routing_text([(policy, first, "") for policy, first in routed_alike(records).items()])


def same_routing_text(alike: list[tuple[str, str, str]]) -> str:
    """The note of :func:`same_routing_note` (and of a sweep's), "" for none.

    Args:
        alike: ``(policy, first, where)``: ``policy`` routed every request as ``first`` did, in
            every round, at ``where`` (``" at workers=4"``; "" for the one scenario of a table).
    """
    if not alike:
        return ""
    pairs = ", and ".join(f"{policy} routed every request to the worker {first} chose{where}"
                          for policy, first, where in alike)
    return (f"Note: {pairs}, in every round, so their rows differ in nothing but the name (`kvroute policies` gives "
            "each one's rule and thresholds).")
