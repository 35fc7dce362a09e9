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

from kvroute.traces.format import Trace, TraceRecord


def seed_chat(
    num_chats: int = 64,
    num_turns: int = 6,
    system_words: int = 600,
    user_words: int = 150,
    reply_tokens: int = 128,
    tokens_per_word: float = 1.3,
    template_tokens_per_message: int = 4,
    generation_prompt_tokens: int = 3,
    think_time_ms: float = 0.0,
    block_size: int = 16,
) -> Trace:
    """The lab's burst: ``num_chats`` chats of ``num_turns`` turns, all started at once.

    Token counts (defaults in brackets; ``round`` is Python's, half to even):

    - system prompt ``S = round(system_words * tokens_per_word) + template_tokens_per_message``
      [780 + 4 = 784], identical in every chat;
    - user message ``U = round(user_words * tokens_per_word) + template_tokens_per_message``
      [195 + 4 = 199];
    - generation prompt ``G = generation_prompt_tokens`` [3] (e.g. ``<|im_start|>assistant\\n``);
    - turn 1: ``input_length = S + U + G`` [986], ``output_length = reply_tokens`` [128];
    - turn t >= 2: ``input_length = parent.input_length + parent.output_length + N`` with
      ``N = U + G`` [202] new tokens: the next user message with its template tokens plus the
      generation prompt. The closing template tokens of the previous assistant reply (e.g.
      ``<|im_end|>\\n``) are counted inside these ``N`` (within the per-message template
      allowance), not added on top, so turn t has ``S + U + G + (t - 1) * (reply_tokens + N)``
      prompt tokens [986, 1316, 1646, 1976, 2306, 2636 for t = 1..6];
      ``output_length = reply_tokens``, ``think_time_ms = think_time_ms`` (ms after the parent's
      last token).

    Hash ids (turn 1 only, at ``block_size`` tokens per block, ``ceil(input_length/block_size)``
    of them [62]): the ``S // block_size`` blocks lying fully inside the system prompt [49] get
    ids ``0 .. S//block_size - 1`` shared by all chats; every other block (the one straddling the
    end of the system prompt, if any, and all later ones) gets ids unique to its chat [13 per chat].

    Returns:
        A :class:`Trace` of ``num_chats * num_turns`` records, turn-major (``request_id`` of chat
        c, turn t is ``(t - 1) * num_chats + c``), ``session_id = c`` (0-based int), ``turn = t``
        (1-based), ``timestamp_ms = 0``, ``block_size = block_size``, source ``"seed_chat"`` and
        the parameters in ``metadata``.

    Raises:
        ValueError: a count is negative, ``num_chats``/``num_turns``/``block_size`` < 1, or
            ``think_time_ms`` < 0.
    """
    for name, value in (("num_chats", num_chats), ("num_turns", num_turns), ("block_size", block_size)):
        if value < 1:
            raise ValueError(f"{name} must be >= 1, got {value}")
    for name, value in (("system_words", system_words), ("user_words", user_words),
                        ("reply_tokens", reply_tokens), ("tokens_per_word", tokens_per_word),
                        ("template_tokens_per_message", template_tokens_per_message),
                        ("generation_prompt_tokens", generation_prompt_tokens),
                        ("think_time_ms", think_time_ms)):
        if value < 0:
            raise ValueError(f"{name} must be >= 0, got {value}")
    system = round(system_words * tokens_per_word) + template_tokens_per_message
    user = round(user_words * tokens_per_word) + template_tokens_per_message
    first_input = system + user + generation_prompt_tokens
    new_per_turn = user + generation_prompt_tokens

    ids = _BlockIds(system, block_size)
    records: list[TraceRecord] = []
    for c in range(num_chats):
        records.append(TraceRecord(
            request_id=c, timestamp_ms=0.0, input_length=first_input, output_length=reply_tokens,
            hash_ids=ids.first_prompt(first_input), session_id=c, turn=1,
        ))
    for t in range(2, num_turns + 1):
        for c in range(num_chats):
            parent = records[(t - 2) * num_chats + c]
            records.append(TraceRecord(
                request_id=len(records), timestamp_ms=0.0,
                input_length=parent.input_length + parent.output_length + new_per_turn,
                output_length=reply_tokens, session_id=c, turn=t, parent=parent.request_id,
                think_time_ms=float(think_time_ms),
            ))
    metadata = {"generator": "seed_chat", "params": {
        "num_chats": num_chats, "num_turns": num_turns, "system_words": system_words,
        "user_words": user_words, "reply_tokens": reply_tokens, "tokens_per_word": tokens_per_word,
        "template_tokens_per_message": template_tokens_per_message,
        "generation_prompt_tokens": generation_prompt_tokens, "think_time_ms": think_time_ms,
        "system_tokens": system, "user_tokens": user, "first_input_tokens": first_input,
        "new_tokens_per_turn": new_per_turn,
    }}
    return Trace(records=records, block_size=block_size, source="seed_chat", metadata=metadata)


def agent_sessions(
    rng: np.random.Generator,
    num_sessions: int = 16,
    num_turns: int = 10,
    history_tokens: tuple[int, int] = (8000, 32000),
    new_tokens: tuple[int, int] = (200, 1000),
    reply_tokens: tuple[int, int] = (50, 300),
    system_tokens: int = 2000,
    think_time_ms: tuple[float, float] = (0, 2000),
    block_size: int = 16,
) -> Trace:
    """Long-history agent traffic: sessions whose prompts hold 8k-32k tokens, with short replies.

    Distributions (all from ``rng``; integer ranges inclusive at both ends):

    - turn 1 ``input_length ~ UniformInt[history_tokens]``: a shared system prompt of
      ``system_tokens`` tokens (same in every session) plus a history unique to the session
      making up the rest;
    - every turn's ``output_length ~ UniformInt[reply_tokens]`` (tokens);
    - turn t >= 2 extends its parent by ``n ~ UniformInt[new_tokens]`` new tokens (tool output or
      a new message): ``input_length = parent.input_length + parent.output_length + n``;
      ``think_time_ms ~ Uniform[think_time_ms)`` (ms, float) after the parent's last token;
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
        ValueError: a range has low > high or a negative bound, ``num_sessions``/``num_turns``/
            ``block_size`` < 1, or ``system_tokens`` > ``history_tokens[0]``.
    """
    for name, value in (("num_sessions", num_sessions), ("num_turns", num_turns), ("block_size", block_size)):
        if value < 1:
            raise ValueError(f"{name} must be >= 1, got {value}")
    for name, (low, high) in (("history_tokens", history_tokens), ("new_tokens", new_tokens),
                              ("reply_tokens", reply_tokens), ("think_time_ms", think_time_ms)):
        if low < 0 or low > high:
            raise ValueError(f"{name} must be a range 0 <= low <= high, got {(low, high)}")
    if not 0 <= system_tokens <= history_tokens[0]:
        raise ValueError(f"system_tokens must be in [0, history_tokens[0]={history_tokens[0]}], "
                         f"got {system_tokens}")

    def uniform_int(bounds: tuple[int, int]) -> int:
        return int(rng.integers(bounds[0], bounds[1], endpoint=True))

    top = history_tokens[1]
    sessions: list[list[tuple[int, int, float]]] = []  # per session: (input, output, think)
    for _ in range(num_sessions):
        turns = [(uniform_int(history_tokens), uniform_int(reply_tokens), 0.0)]
        for _ in range(1, num_turns):
            n_new, n_out = uniform_int(new_tokens), uniform_int(reply_tokens)
            think = float(rng.uniform(think_time_ms[0], think_time_ms[1]))
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
        "new_tokens": list(new_tokens), "reply_tokens": list(reply_tokens),
        "system_tokens": system_tokens, "think_time_ms": list(think_time_ms),
    }}
    return Trace(records=records, block_size=block_size, source="agent_sessions", metadata=metadata)


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


def builtin_workload(
    name: str,
    chats: int,
    turns: int,
    think_time_s: float = 0.0,
    seed: int = 0,
    reply: int | tuple[int, int] | None = None,
    history: tuple[int, int] | None = None,
) -> Trace:
    """A built-in workload by its CLI name, as ``kvroute compare`` and ``kvroute sweep`` build it.

    Args:
        name: ``"seed-chat"`` (the lab's burst) or ``"agent"`` (long-history sessions).
        chats: chats or sessions.
        turns: turns per chat (the agent generator may stop a session earlier).
        think_time_s: seconds between a reply's last token and the next turn.
        seed: seeds the agent generator (the seed burst is deterministic).
        reply: reply tokens (seed-chat), or a fixed value or ``(low, high)`` range (agent);
            None keeps the generator's default.
        history: agent history range in tokens; None keeps the default (8,000-32,000).

    Raises:
        ValueError: for an unknown name (the message lists the valid ones).
    """
    if name == "seed-chat":
        kwargs = {} if reply is None else {"reply_tokens": int(reply)}
        return seed_chat(num_chats=chats, num_turns=turns, think_time_ms=think_time_s * 1000, **kwargs)
    if name == "agent":
        kwargs: dict = {}
        if reply is not None:
            kwargs["reply_tokens"] = (reply, reply) if isinstance(reply, int) else tuple(reply)
        if history is not None:
            kwargs["history_tokens"] = tuple(history)
        return agent_sessions(
            np.random.default_rng(seed), num_sessions=chats, num_turns=turns,
            think_time_ms=(think_time_s * 1000, think_time_s * 1000), **kwargs,
        )
    raise ValueError(f"unknown workload {name!r}; valid workloads: {', '.join(BUILTIN_WORKLOADS)}")
