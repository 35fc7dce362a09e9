"""Read ShareGPT-style conversation files as multi-turn sessions.

A ShareGPT file (``ShareGPT_V3_unfiltered_cleaned_split.json``, the dataset ``vllm bench serve
--dataset-name sharegpt`` samples from) is a JSON list of conversations::

    [{"id": "x1", "conversations": [{"from": "human", "value": "Hi"},
                                    {"from": "gpt", "value": "Hello!"}, ...]}, ...]

OpenAI-style ``{"messages": [{"role": "user", "content": ...}]}`` entries are read too.

Each conversation becomes one session. Every user message answered by an assistant message is a
turn: its prompt is the whole conversation so far (earlier messages and replies, then the user's
message), its output the reply. Turn ``k > 1`` has turn ``k - 1`` as ``parent``, so a prefix
cache can reuse the history; turn 1 gets fresh hash ids no other session shares. No chat template
is modelled: a prompt is the sum of its messages' token counts. Timestamps are 0 and think times
0: sessions start together and each turn follows its parent (closed loop); ``--arrival-spread``
of the commands that replay the trace spreads their starts (``--request-rate`` rescales
timestamps, and these are all equal: it refuses them).
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable

from kvroute.traces.inputs import MAX_TOKENS
from kvroute.traces.format import Trace, TraceRecord
from kvroute.traces.reader import TraceError, load_json_document

CHARS_PER_TOKEN = 4.0
"""Default characters per token of the estimate: OpenAI's rule of thumb for English text with
BPE tokenizers ("one token is about 4 characters"); a real tokenizer (``--tokenizer``) is exact."""

_USER = {"human", "user"}
_ASSISTANT = {"gpt", "assistant", "chatgpt", "bard", "bing", "model"}
_CONTEXT = {"system", "tool", "function"}


def char_estimate(chars_per_token: float = CHARS_PER_TOKEN) -> Callable[[str], int]:
    """A token counter ``text -> max(1, ceil(len(text) / chars_per_token))`` (tokens).

    Raises:
        ValueError: ``chars_per_token`` not a finite number > 0.
    """
    if not (isinstance(chars_per_token, (int, float)) and math.isfinite(chars_per_token) and chars_per_token > 0):
        raise ValueError(f"chars per token must be a finite number > 0, got {chars_per_token!r}")
    return lambda text: max(1, math.ceil(len(text) / chars_per_token))


def tokenizer_counter(name: str) -> Callable[[str], int]:
    """A token counter using a Hugging Face tokenizer (``transformers.AutoTokenizer``), without
    special tokens, at least 1 per message.

    Raises:
        ValueError: ``transformers`` is not installed, or the tokenizer cannot be loaded.
    """
    try:
        from transformers import AutoTokenizer
    except ImportError:
        raise ValueError("--tokenizer needs the transformers package (pip install transformers); "
                         "without it, tokens are estimated from characters (--chars-per-token)") from None
    try:
        tok = AutoTokenizer.from_pretrained(name)
    except Exception as exc:  # noqa: BLE001 - any loading failure is the user's to fix
        raise ValueError(f"cannot load tokenizer {name!r}: {type(exc).__name__}: {exc}") from None
    return lambda text: max(1, len(tok(text, add_special_tokens=False)["input_ids"]))


def read_sharegpt(path: str | os.PathLike[str], block_size: int, count_tokens: Callable[[str], int] | None = None,
                  tokens_note: str | None = None) -> Trace:
    """Read a ShareGPT-style JSON file as one session per conversation.

    Args:
        path: the ``.json`` file (a list of conversations).
        block_size: tokens per hash id block of the first turns' fresh ids (> 0).
        count_tokens: message text -> tokens; default :func:`char_estimate` (4 chars/token).
        tokens_note: how tokens were counted, stored as ``metadata["tokens"]``.

    Returns:
        A :class:`Trace`: records in conversation order, turns in order; ``request_id`` counts
        from 0, ``session_id`` is the conversation's ``id`` (or its 0-based index; an ``id`` an
        earlier conversation has is made ``"<id>#<index>"``, and such conversations are counted
        in ``metadata["repeated_ids"]``), ``turn`` 1-based, ``parent`` the previous turn,
        ``timestamp_ms`` and ``think_time_ms`` 0. A conversation without a user message answered
        by an assistant gives no record and is counted in ``metadata["skipped_conversations"]``. ``metadata["origin"]`` is ``"sharegpt"``.

    Raises:
        TraceError (a ValueError) naming path and field (``[i].conversations[j].from``): not
            JSON, not a list, an entry without a conversation list, a message without a role or
            text, an unknown role, a prompt above ``MAX_TOKENS``, no record at all.
        OSError: the file cannot be opened.
    """
    source = str(path)
    if count_tokens is None:
        count_tokens = char_estimate()
        tokens_note = tokens_note or f"estimated at {CHARS_PER_TOKEN:g} characters per token"
    doc = load_json_document(path)
    if type(doc) is not list:
        raise TraceError(f"expected a JSON list of conversations, got {type(doc).__name__}", source)
    records: list[TraceRecord] = []
    next_id = 0
    skipped = repeated = 0
    seen: set[object] = set()
    for i, entry in enumerate(doc):
        messages = _messages(entry, source, i)
        session = entry.get("id", i)
        if type(session) not in (int, str):
            session = i
        if session in seen:  # two conversations are two sessions (session affinity, --request-rate)
            session, repeated = f"{session}#{i}", repeated + 1
        seen.add(session)
        before = len(records)
        next_id = _session(messages, session, records, next_id, block_size, count_tokens, source, i)
        skipped += len(records) == before
    if not records:
        raise TraceError("no conversation has a user message answered by an assistant", source)
    return Trace(records, block_size, source,
                 {"origin": "sharegpt", "tokens": tokens_note or "counted by the caller",
                  "skipped_conversations": skipped, "repeated_ids": repeated})


def _messages(entry: object, source: str, i: int) -> list[tuple[str, str]]:
    """``(role, text)`` pairs of one conversation, roles normalised to user/assistant/context."""
    if type(entry) is not dict:
        raise TraceError(f"expected an object, got {type(entry).__name__}", source, None, f"[{i}]")
    key = "conversations" if "conversations" in entry else "messages"
    turns = entry.get(key)
    if type(turns) is not list:
        raise TraceError("expected a list of messages", source, None, f"[{i}].{key}")
    out = []
    for j, msg in enumerate(turns):
        where = f"[{i}].{key}[{j}]"
        if type(msg) is not dict:
            raise TraceError(f"expected an object, got {type(msg).__name__}", source, None, where)
        role = msg.get("from", msg.get("role"))
        text = msg.get("value", msg.get("content"))
        if type(role) is not str:
            raise TraceError("missing or not a string", source, None, f"{where}.from")
        if type(text) is not str:
            raise TraceError("missing or not a string", source, None, f"{where}.value")
        role = role.lower()
        if role in _USER:
            out.append(("user", text))
        elif role in _ASSISTANT:
            out.append(("assistant", text))
        elif role in _CONTEXT:
            out.append(("context", text))
        else:
            raise TraceError(f"unknown role {role!r}; expected one of "
                             f"{sorted(_USER | _ASSISTANT | _CONTEXT)}", source, None, f"{where}.from")
    return out


def _session(messages, session, records, next_id, block_size, count_tokens, source, i) -> int:
    """Append one conversation's turns to ``records``; returns the next fresh hash id."""
    history = 0  # tokens of the messages before the pending ones
    pending = 0  # tokens of user/context messages not yet answered
    has_user = False
    parent: int | None = None
    turn = 0
    for role, text in messages:
        tokens = count_tokens(text)
        if role == "assistant" and has_user:
            turn += 1
            prompt = history + pending
            if prompt + tokens > MAX_TOKENS:
                raise TraceError(f"conversation reaches {prompt + tokens:,} tokens, above {MAX_TOKENS:,}",
                                 source, None, f"[{i}]")
            rid = len(records)
            hash_ids = None
            if parent is None:
                n_blocks = -(-prompt // block_size)
                hash_ids = range(next_id, next_id + n_blocks)
                next_id += n_blocks
            records.append(TraceRecord(rid, 0.0, prompt, tokens, hash_ids, session, turn, parent))
            parent = rid
            history = prompt + tokens
            pending, has_user = 0, False
        elif role == "assistant":
            history += tokens  # a reply to nothing (a greeting): part of the next prompt
        else:
            pending += tokens
            has_user = has_user or role == "user"
    return next_id
