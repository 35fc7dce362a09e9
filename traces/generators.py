"""Synthetic workloads: the seed study's chat burst and long-history agent sessions.

Both return closed-loop multi-turn traces: every record has ``timestamp_ms = 0`` (all sessions
start at once; the simulator adds its own seeded start jitter), turn 1 carries ``hash_ids`` and
each later turn names its predecessor as ``parent`` (no ``hash_ids``), so its prompt is the
parent's prompt, the parent's output, then new tokens. Records are ordered turn-major: every
session's turn 1, then every session's turn 2, and so on, so parents precede children and
``request_id`` equals the position. Hash ids are ints >= 0 from a counter owned by each call
(ids ``0 .. S-1`` are the shared system prompt's full blocks, then each session's own blocks in
session order). No global random state: randomness comes only from the ``rng`` argument.
"""

from __future__ import annotations

import numpy as np

from kvroute.traces.arrivals import arrival_times, with_session_starts
from kvroute.traces.format import Trace, TraceRecord
from kvroute.traces.lengths import Dist, parse_dist


def seed_chat(
    num_chats: int = 64,
    num_turns: int = 6,
    system_words: int = 600,
    user_words: int = 150,
    reply_tokens: int | Dist | str = 128,
    tokens_per_word: float = 1.3,
    template_tokens_per_message: int = 4,
    generation_prompt_tokens: int = 3,
    think_time_ms: float | Dist | str = 0.0,
    block_size: int = 16,
    *,
    max_tokens: int | None = None,
    user_tokens: int | Dist | str | None = None,
    start_ms: float | Dist | str = 0.0,
    rng: np.random.Generator | None = None,
) -> Trace:
    """The lab's burst: ``num_chats`` chats of ``num_turns`` turns, all started at once.

    Token counts (defaults in brackets; ``round`` is Python's, half to even):

    - system prompt ``S = round(system_words * tokens_per_word) + template_tokens_per_message``
      [780 + 4 = 784], identical in every chat;
    - user message ``U = u + template_tokens_per_message`` with ``u`` the message's own tokens:
      ``round(user_words * tokens_per_word)`` [195] when ``user_tokens`` is None, else a draw of
      ``user_tokens`` (at least 1) per turn [199 in all];
    - generation prompt ``G = generation_prompt_tokens`` [3] (e.g. ``<|im_start|>assistant\\n``);
    - turn 1: ``input_length = S + U + G`` [986];
    - turn t >= 2: ``input_length = parent.input_length + parent.output_length + N`` with
      ``N = U + G`` [202] new tokens: the next user message with its template tokens plus the
      generation prompt. The closing template tokens of the previous assistant reply (e.g.
      ``<|im_end|>\\n``) are counted inside these ``N`` (within the per-message template
      allowance), not added on top, so with fixed lengths turn t has
      ``S + U + G + (t - 1) * (reply + N)`` prompt tokens [986, 1316, 1646, 1976, 2306, 2636];
    - every turn's ``output_length``: a draw of ``reply_tokens`` (where the model stops; at
      least 1) capped at ``max_tokens`` (the request's limit; None = no cap) [128];
    - ``think_time_ms`` (ms after the parent's last token) per later turn and ``start_ms`` (ms,
      the chat's first send, written as turn 1's ``timestamp_ms``) per chat [0, 0].

    Any of ``reply_tokens``, ``user_tokens``, ``think_time_ms`` and ``start_ms`` may be a number
    or a distribution in :mod:`kvroute.traces.lengths` syntax. Random ones draw from ``rng`` in a
    fixed order: starts (one per chat), user tokens (chat-major, turn 1..T), replies (same), then
    think times (chat-major, turn 2..T); fixed ones draw nothing, so a trace with fixed lengths is
    the same for every ``rng``.

    Hash ids (turn 1 only, at ``block_size`` tokens per block, ``ceil(input_length/block_size)``
    of them [62]): the ``S // block_size`` blocks lying fully inside the system prompt [49] get
    ids ``0 .. S//block_size - 1`` shared by all chats; every other block (the one straddling the
    end of the system prompt, if any, and all later ones) gets ids unique to its chat [13 per chat].

    Returns:
        A :class:`Trace` of ``num_chats * num_turns`` records, turn-major (``request_id`` of chat
        c, turn t is ``(t - 1) * num_chats + c``), ``session_id = c`` (0-based int), ``turn = t``
        (1-based), ``block_size = block_size``, source ``"seed_chat"`` and the parameters (with
        each distribution's text) in ``metadata``.

    Raises:
        ValueError: a count is negative, ``num_chats``/``num_turns``/``block_size`` < 1,
            ``max_tokens`` < 1, a distribution is malformed, or a random distribution is given
            without ``rng``.
    """
    for name, value in (("num_chats", num_chats), ("num_turns", num_turns), ("block_size", block_size)):
        if value < 1:
            raise ValueError(f"{name} must be >= 1, got {value}")
    for name, value in (("system_words", system_words), ("user_words", user_words),
                        ("tokens_per_word", tokens_per_word),
                        ("template_tokens_per_message", template_tokens_per_message),
                        ("generation_prompt_tokens", generation_prompt_tokens)):
        if value < 0:
            raise ValueError(f"{name} must be >= 0, got {value}")
    if max_tokens is not None and max_tokens < 1:
        raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
    reply = parse_dist(reply_tokens, "reply_tokens")
    user = parse_dist(round(user_words * tokens_per_word) if user_tokens is None else user_tokens, "user_tokens")
    think = parse_dist(think_time_ms, "think_time_ms")
    start = parse_dist(start_ms, "start_ms")
    draws = _Draws(rng)
    starts = draws.times(start, num_chats, "start_ms")
    users = draws.tokens(user, num_chats * num_turns, "user_tokens").reshape(num_chats, num_turns)
    replies = draws.tokens(reply, num_chats * num_turns, "reply_tokens", cap=max_tokens).reshape(num_chats, num_turns)
    thinks = draws.times(think, num_chats * max(num_turns - 1, 0), "think_time_ms").reshape(num_chats, -1)

    system = round(system_words * tokens_per_word) + template_tokens_per_message
    template, gen = template_tokens_per_message, generation_prompt_tokens

    ids = _BlockIds(system, block_size)
    records: list[TraceRecord] = []
    for c in range(num_chats):
        first_input = system + int(users[c, 0]) + template + gen
        records.append(TraceRecord(
            request_id=c, timestamp_ms=float(starts[c]), input_length=first_input,
            output_length=int(replies[c, 0]), hash_ids=ids.first_prompt(first_input), session_id=c, turn=1,
        ))
    for t in range(2, num_turns + 1):
        for c in range(num_chats):
            parent = records[(t - 2) * num_chats + c]
            records.append(TraceRecord(
                request_id=len(records), timestamp_ms=float(starts[c]),
                input_length=parent.input_length + parent.output_length + int(users[c, t - 1]) + template + gen,
                output_length=int(replies[c, t - 1]), session_id=c, turn=t, parent=parent.request_id,
                think_time_ms=float(thinks[c, t - 2]),
            ))
    # a fixed user turn as drawn (rounded, at least 1), with its template tokens
    user_fixed = int(users[0, 0]) + template if user.is_fixed else None
    metadata = {"generator": "seed_chat", "params": {
        "num_chats": num_chats, "num_turns": num_turns, "system_words": system_words,
        "user_words": user_words, "reply_tokens": _param(reply), "tokens_per_word": tokens_per_word,
        "template_tokens_per_message": template_tokens_per_message,
        "generation_prompt_tokens": generation_prompt_tokens, "think_time_ms": _param(think),
        "system_tokens": system,
        "max_tokens": max_tokens, "user_tokens": None if user_tokens is None else user.text,
        "start_ms": _param(start),
        **({"user_tokens_total": user_fixed, "first_input_tokens": system + user_fixed + gen,
            "new_tokens_per_turn": user_fixed + gen} if user.is_fixed else {}),
    }}
    return Trace(records=records, block_size=block_size, source="seed_chat", metadata=metadata)


def _param(dist: Dist) -> float | str:
    """A fixed distribution as its number (fixed lengths stay plain numbers in the metadata),
    else its text."""
    return dist.params[0] if dist.kind == "fixed" else dist.text


class _Draws:
    """Draws of one generator call: fixed distributions use no random numbers."""

    def __init__(self, rng: np.random.Generator | None) -> None:
        self.rng = rng

    def _need(self, dist: Dist, what: str) -> np.random.Generator:
        if self.rng is None:
            raise ValueError(f"{what} is random ({dist.text}): pass rng (a seeded numpy Generator)")
        return self.rng

    def tokens(self, dist: Dist, n: int, what: str, cap: int | None = None) -> np.ndarray:
        if dist.is_fixed:
            return dist.draw_tokens(None, n, cap)  # type: ignore[arg-type]
        return dist.draw_tokens(self._need(dist, what), n, cap)

    def times(self, dist: Dist, n: int, what: str) -> np.ndarray:
        if dist.is_fixed:
            return np.full(n, dist.params[0], dtype=float)
        return dist.sample(self._need(dist, what), n)


AGENT_SYSTEM_TOKENS = 2000
"""Tokens of the agent workload's shared system prompt (instructions and tool definitions), when
the history range's low end leaves room for it. A stated round figure, not a measurement: give
``system_tokens`` for a deployment's own."""


def agent_sessions(
    rng: np.random.Generator,
    num_sessions: int = 16,
    num_turns: int = 10,
    history_tokens: tuple[int, int] = (8000, 32000),
    new_tokens: tuple[int, int] | Dist | str = (200, 1000),
    reply_tokens: tuple[int, int] | Dist | str = (50, 300),
    system_tokens: int | None = None,
    think_time_ms: tuple[float, float] | Dist | str = (0, 2000),
    block_size: int = 16,
    max_tokens: int | None = None,
) -> Trace:
    """Long-history agent traffic: sessions whose prompts hold 8k-32k tokens, with short replies.

    Distributions (all from ``rng``; a ``(low, high)`` pair means ``uniform:low:high``, integer
    ranges inclusive at both ends; ``reply_tokens``, ``new_tokens`` and ``think_time_ms`` may
    also be any :mod:`kvroute.traces.lengths` distribution):

    - turn 1 ``input_length ~ UniformInt[history_tokens]``: a shared system prompt of
      ``system_tokens`` tokens (same in every session) plus a history unique to the session
      making up the rest; ``system_tokens`` None (the default) is ``AGENT_SYSTEM_TOKENS``
      (2,000) or the range's low end if that is shorter, so any history range has a default;
    - every turn's ``output_length ~ reply_tokens`` (tokens, at least 1), capped at
      ``max_tokens`` when given;
    - turn t >= 2 extends its parent by ``n ~ new_tokens`` new tokens (tool output or
      a new message): ``input_length = parent.input_length + parent.output_length + n``;
      ``think_time_ms`` (ms, float) after the parent's last token;
    - a session stops before ``num_turns`` if its next prompt would exceed ``history_tokens[1]``
      (that turn is not emitted), so sessions have 1 to ``num_turns`` turns.

    Draw order (fixed, so a seed gives the same trace): per session in order, turn 1's length
    then its reply; then per later turn: new tokens, reply, think time (the draws of the turn
    that overflows are made and discarded).

    Hash ids (turn 1 only, ``block_size`` tokens per block): the ``system_tokens // block_size``
    blocks fully inside the system prompt have ids shared by all sessions; all other blocks
    have ids unique to the session.

    Returns:
        A turn-major :class:`Trace` (see the module docstring) with ``session_id`` 0-based,
        ``turn`` 1-based, ``timestamp_ms = 0``, source ``"agent_sessions"`` and the parameters
        in ``metadata``.

    Raises:
        ValueError: a range has low > high or a negative bound (``history_tokens`` a low bound
            below 1), ``num_sessions``/``num_turns``/
            ``block_size`` < 1, or a ``system_tokens`` given that is > ``history_tokens[0]``.
    """
    for name, value in (("num_sessions", num_sessions), ("num_turns", num_turns), ("block_size", block_size)):
        if value < 1:
            raise ValueError(f"{name} must be >= 1, got {value}")
    low, high = history_tokens
    if low < 1 or low > high:  # a first prompt has at least one token
        raise ValueError(f"history_tokens must be a range 1 <= low <= high, got {(low, high)}")
    new_dist, reply_dist, think_dist = (_range_dist(value, name) for value, name in (
        (new_tokens, "new_tokens"), (reply_tokens, "reply_tokens"), (think_time_ms, "think_time_ms")))
    if max_tokens is not None and max_tokens < 1:
        raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
    if system_tokens is None:
        # NOTE: the shared prompt must fit in the shortest first prompt; a user who asks for
        # short histories (--history 1000-2000) has no flag for it, so it shrinks to fit.
        system_tokens = min(AGENT_SYSTEM_TOKENS, low)
    if not 0 <= system_tokens <= history_tokens[0]:
        raise ValueError(f"system_tokens must be in [0, history_tokens[0]={history_tokens[0]}], "
                         f"got {system_tokens}")

    def uniform_int(bounds: tuple[int, int]) -> int:
        return int(rng.integers(bounds[0], bounds[1], endpoint=True))

    def reply() -> int:
        return int(reply_dist.draw_tokens(rng, 1, max_tokens)[0])

    top = history_tokens[1]
    sessions: list[list[tuple[int, int, float]]] = []  # per session: (input, output, think)
    for _ in range(num_sessions):
        turns = [(uniform_int(history_tokens), reply(), 0.0)]
        for _ in range(1, num_turns):
            n_new, n_out = int(new_dist.draw_tokens(rng, 1, minimum=0)[0]), reply()
            think = float(think_dist.sample(rng, 1)[0])
            n_in = turns[-1][0] + turns[-1][1] + n_new
            if n_in > top:
                break
            turns.append((n_in, n_out, think))
        sessions.append(turns)

    ids = _BlockIds(system_tokens, block_size)
    records: list[TraceRecord] = []
    previous: dict[int, int] = {}  # session -> request_id of its latest turn
    for t in range(max(len(s) for s in sessions)):
        for s, turns in enumerate(sessions):
            if t >= len(turns):
                continue
            n_in, n_out, think = turns[t]
            rid = len(records)
            if t == 0:
                records.append(TraceRecord(rid, 0.0, n_in, n_out, ids.first_prompt(n_in), s, 1))
            else:
                records.append(TraceRecord(rid, 0.0, n_in, n_out, None, s, t + 1, previous[s], think))
            previous[s] = rid
    metadata = {"generator": "agent_sessions", "params": {
        "num_sessions": num_sessions, "num_turns": num_turns, "history_tokens": list(history_tokens),
        "new_tokens": new_dist.text, "reply_tokens": reply_dist.text, "max_tokens": max_tokens,
        "system_tokens": system_tokens, "think_time_ms": think_dist.text,
    }}
    return Trace(records=records, block_size=block_size, source="agent_sessions", metadata=metadata)


def _range_dist(value: tuple[float, float] | Dist | str, name: str) -> Dist:
    """A ``(low, high)`` pair as ``uniform:low:high``; anything else through ``parse_dist``."""
    if isinstance(value, (tuple, list)):
        low, high = value
        if low < 0 or low > high:
            raise ValueError(f"{name} must be a range 0 <= low <= high, got {tuple(value)}")
        return parse_dist(f"uniform:{low}:{high}", name)
    return parse_dist(value, name)


class _BlockIds:
    """Hash-id allocation for first prompts: shared system-prompt blocks, then unique ones.

    Owned by one generator call (no global state). Ids ``0 .. system_tokens // block_size - 1``
    name the system prompt's full blocks; later ids are handed out in call order.
    """

    def __init__(self, system_tokens: int, block_size: int) -> None:
        self.block_size = block_size
        self.shared = system_tokens // block_size
        self.next_id = self.shared

    def first_prompt(self, input_length: int) -> tuple[int, ...]:
        """Ids for a prompt that starts with the system prompt: shared ids, then fresh ones."""
        n_blocks = -(-input_length // self.block_size)
        n_shared = min(self.shared, n_blocks)
        n_own = n_blocks - n_shared
        ids = tuple(range(n_shared)) + tuple(range(self.next_id, self.next_id + n_own))
        self.next_id += n_own
        return ids


BUILTIN_WORKLOADS = ("seed-chat", "agent")

WORKLOAD_SIZES: dict[str, tuple[int, int]] = {"seed-chat": (64, 6), "agent": (16, 10)}
"""Each built-in workload's default (chats or sessions, turns): the lab's seed burst, and the
agent generator's 16 sessions of up to 10 turns (``agent_sessions``'s defaults). Every command and
``Scenario`` takes a size left unset (None) from here."""

SEED_CHAT_MAX_TOKENS = 128
"""The lab's reply limit: "128-token replies" (``../shared/seed-study.md``), read as ``max_tokens``."""

SEED_CHAT_REPLY = "lognormal:90:1"
"""Where the seed burst's replies stop before the 128-token cap: fitted to the lab's four 6-turn
numbers by ``bench/bench_seed_fit.py`` (median 90 tokens fitted; CV 1.0 fixed, the fit being flat
between 0.5 and 1.5). Capped at 128, replies average 86.5 tokens and 34 % reach the cap."""

SEED_CHAT_USER = "fixed:195"
"""Tokens of a 150-word user message (1.3 tokens per word, before template tokens)."""


def workload_rng(seed: int) -> np.random.Generator:
    """The generator a built-in workload draws its lengths from for run seed ``seed``.

    A stream of its own (``SeedSequence([seed, 1])``), so length draws are independent of the
    simulator's jitter draws, which use ``default_rng(seed)``.
    """
    return np.random.default_rng([seed, 1])


def arrival_rng(seed: int) -> np.random.Generator:
    """The generator a built-in workload draws its sessions' arrival gaps from for run seed
    ``seed`` (``--request-rate``): a stream of its own (``SeedSequence([seed, 3])``), apart from the
    lengths' and think times' (:func:`workload_rng`, ``[seed, 1]``), the uncertainty draws' of
    ``compare --uncertainty`` (``[seed, 2]``) and the simulator's (``default_rng(seed)``), so that a
    sweep over lengths or think times at one rate keeps the same arrivals at each point (common
    random numbers)."""
    return np.random.default_rng([seed, 3])


def builtin_workload(
    name: str,
    chats: int | None,
    turns: int | None,
    think_time_s: float | Dist | str = 0.0,
    seed: int = 0,
    reply: int | tuple[int, int] | Dist | str | None = None,
    history: tuple[int, int] | None = None,
    *,
    max_tokens: int | None = None,
    user: int | Dist | str | None = None,
    start_s: float | Dist | str = 0.0,
    block_size: int = 16,
    request_rate: float | None = None,
    arrival: str = "poisson",
) -> Trace:
    """A built-in workload by its CLI name, as ``kvroute compare`` and ``kvroute sweep`` build it.

    Args:
        name: ``"seed-chat"`` (the lab's burst) or ``"agent"`` (long-history sessions).
        chats: chats or sessions; None: the workload's default (``WORKLOAD_SIZES``).
        turns: turns per chat (the agent generator may stop a session earlier); None: the
            workload's default.
        think_time_s: seconds between a reply's last token and the next turn: a number or a
            distribution (:mod:`kvroute.traces.lengths`); 0 for both workloads unless given, as
            on the CLI (``agent_sessions`` called directly defaults to 0-2 s).
        seed: the run's seed; random lengths are drawn from ``workload_rng(seed)`` and arrival
            gaps from ``arrival_rng(seed)``, so every round of a comparison draws its own workload
            and a fixed workload is the same in all.
        reply: where replies stop, tokens: a number, a distribution, or (agent) a ``(low, high)``
            range; None keeps the default (seed-chat ``SEED_CHAT_REPLY``, agent 50-300).
        history: agent history range in tokens; None keeps the default (8,000-32,000).
        max_tokens: the requests' reply limit (cap on ``reply``); None keeps the default
            (seed-chat ``SEED_CHAT_MAX_TOKENS``, agent none).
        user: seed-chat: tokens of each user message (before template tokens); agent: new tokens
            per later turn. None keeps the default (seed-chat ``SEED_CHAT_USER``, agent 200-1000).
        start_s: seed-chat only: each chat's first send, seconds after the start (a number or a
            distribution), on top of the simulator's ``arrival_spread``.
        block_size: tokens per ``hash_ids`` block of the trace.
        request_rate: sessions started per second (None: all at once, the lab's burst); each
            session's first turn is sent at its arrival time, later turns follow closed-loop.
        arrival: the sessions' arrival process (:mod:`kvroute.traces.arrivals`: ``poisson``,
            ``gamma:CV``, ``constant``), drawn after the lengths from the same generator.

    Raises:
        ValueError: for an unknown name (the message lists the valid ones) or a bad distribution.
    """
    if name in WORKLOAD_SIZES:
        default_chats, default_turns = WORKLOAD_SIZES[name]
        chats = default_chats if chats is None else chats
        turns = default_turns if turns is None else turns
    rng = workload_rng(seed)
    trace = _generate(name, chats, turns, think_time_s, rng, reply, history, max_tokens, user, start_s, block_size)
    if request_rate is None:
        return trace
    sessions = len({rec.session_id for rec in trace.records})
    return with_session_starts(trace, arrival_times(sessions, request_rate, arrival, arrival_rng(seed)))


def _generate(name, chats, turns, think_time_s, rng, reply, history, max_tokens, user, start_s, block_size) -> Trace:
    if name == "seed-chat":
        return seed_chat(
            num_chats=chats, num_turns=turns,
            reply_tokens=SEED_CHAT_REPLY if reply is None else _dist_arg(reply, "reply"),
            max_tokens=SEED_CHAT_MAX_TOKENS if max_tokens is None else max_tokens,
            user_tokens=SEED_CHAT_USER if user is None else user,
            think_time_ms=parse_dist(think_time_s, "think_time").scaled(1000.0),
            start_ms=parse_dist(start_s, "start").scaled(1000.0), rng=rng, block_size=block_size,
        )
    if name == "agent":
        kwargs: dict = {}
        if reply is not None:
            kwargs["reply_tokens"] = _dist_arg(reply, "reply")
        if user is not None:
            kwargs["new_tokens"] = user
        if history is not None:
            kwargs["history_tokens"] = tuple(history)
        return agent_sessions(
            rng, num_sessions=chats, num_turns=turns, max_tokens=max_tokens, block_size=block_size,
            think_time_ms=parse_dist(think_time_s, "think_time").scaled(1000.0), **kwargs,
        )
    raise ValueError(f"unknown workload {name!r}; valid workloads: {', '.join(BUILTIN_WORKLOADS)}")


def _dist_arg(value: int | tuple[int, int] | Dist | str, name: str) -> Dist:
    return _range_dist(value, name)
