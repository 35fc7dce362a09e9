"""From trace records to engine prompts: content segments and block hashes per request.

A root record's prompt is its ``hash_ids`` blocks at the trace's block size (content id = the
hash id; the last block may be partial). A record with a ``parent`` resends the parent's whole
sequence (prompt and generated output) followed by its own new tokens. Every request's output is
a content stream of its own, so a later turn that resends it hits the blocks the reply filled on
the worker that generated it. Run-allocated content ids derive from the record's position in the
trace, so the same trace always gives the same hashes.

Given the engine's ``max_model_len``, nothing is expanded past it: a prompt vLLM will reject
(``input_length >= max_model_len``) gets no segments and no hashes, and an output is cut at
``max_model_len - input_length`` tokens, as vLLM's OpenAI server clamps ``max_tokens``. A
child of such a record is rejected too (its prompt holds the whole parent sequence), so the
cut never changes a prompt that is served. Long sessions are built without recursion.

Each record is built once for its own send. A record's sequence is kept while a later build
may need it: until its own send, and until each of its children has been built. An open-loop
child sent before its parent (arrival spread reorders a session's turns) builds the missing
ancestors once, keeps them for their own sends, and so every record is built once whatever
the send order.
"""

from __future__ import annotations

from collections.abc import Iterator

from kvroute.sim.engine.compiled import block_hashes
from kvroute.sim.engine.content import GENERATED_CONTENT_BASE, Segment
from kvroute.traces.format import Trace, TraceRecord
from kvroute.traces.reader import check_block_sizes


class Workload:
    """Prompt content of every record of a trace, built on demand and released after use.

    Args:
        trace: the requests.
        block_size: the engine's tokens per block.
        max_model_len: the engine's longest sequence, tokens; None expands every length in full.

    Attributes:
        roots: records without a parent, in trace order.
        children: request_id -> records extending it, in trace order.
        has_sessions: whether any record extends another (closed-loop replay is then the
            default).

    Raises:
        ValueError: on a block-size mismatch, naming the sizes that would work.
    """

    def __init__(self, trace: Trace, block_size: int, max_model_len: int | None = None) -> None:
        try:
            check_block_sizes(trace.block_size, block_size)
        except ValueError as exc:
            raise ValueError(f"{trace.source}: {exc}") from exc
        self.trace = trace
        self.block_size = block_size
        self.max_model_len = max_model_len
        self.position = {rec.request_id: i for i, rec in enumerate(trace.records)}
        self.by_id = {rec.request_id: rec for rec in trace.records}
        self.roots: list[TraceRecord] = []
        self.children: dict[int, list[TraceRecord]] = {}
        for rec in trace.records:
            if rec.parent is None:
                self.roots.append(rec)
            else:
                self.children.setdefault(rec.parent, []).append(rec)
        self.has_sessions = bool(self.children)
        self._unbuilt = {rid: len(kids) for rid, kids in self.children.items()}  # children not built yet
        self._kept: dict[int, tuple[list[Segment], list[int]]] = {}
        self._sent: set[int] = set()  # kept records whose own build (their send) has happened

    def subtree(self, rec: TraceRecord) -> Iterator[tuple[TraceRecord, list[TraceRecord]]]:
        """``(parent, its children)`` for ``rec`` and every later turn below it, depth first (a
        loop, not recursion: sessions can be thousands of turns deep); what a failed request's
        closed-loop descendants are, which are then never sent."""
        stack = [rec]
        while stack:
            parent = stack.pop()
            kids = self.children.get(parent.request_id, [])
            yield parent, kids
            stack.extend(kids)

    def output_content_id(self, rec: TraceRecord) -> int:
        """Content id of ``rec``'s generated output."""
        return GENERATED_CONTENT_BASE + 2 * self.position[rec.request_id]

    def new_content_id(self, rec: TraceRecord) -> int:
        """Content id of the new tokens a child record adds after its parent's sequence."""
        return GENERATED_CONTENT_BASE + 2 * self.position[rec.request_id] + 1

    def build(self, rec: TraceRecord) -> tuple[list[Segment], list[int]]:
        """Segments of ``rec``'s prompt followed by its output, and their full-block hashes; call
        it once per record, when the record is sent.

        Returns:
            ``(segments, hashes)``: the sequence of ``input_length + output_length`` tokens
            (output cut at ``max_model_len``) and one hash per full engine block of it (a list
            of ints, or an ``array("q")`` from the compiled core: ``compiled.block_hashes``);
            nothing (empty segments, no hashes) for a prompt of ``max_model_len`` tokens or more.
        """
        rid = rec.request_id
        built = self._kept.get(rid)
        if built is None:
            # An open-loop child can be sent before its parent: build the missing ancestors
            # first, oldest first, in a loop (sessions can be thousands of turns deep), and keep
            # them for their own sends.
            chain = [rec]
            while chain[-1].parent is not None and chain[-1].parent not in self._kept:
                chain.append(self.by_id[chain[-1].parent])
            for link in reversed(chain):
                built = self._build_one(link, built, ahead=link is not rec)
        self._sent.add(rid)
        self._maybe_release(rid)
        return built

    def _build_one(self, rec: TraceRecord, parent_built: tuple[list[Segment], list[int]] | None,
                   ahead: bool) -> tuple[list[Segment], list[int]]:
        """``build`` for one record whose parent's sequence is ``parent_built`` or kept;
        ``ahead``: built before its own send (for a child sent first), so kept for it."""
        limit = self.max_model_len
        if rec.parent is not None:
            parent = self.by_id[rec.parent]
            if parent_built is None:
                parent_built = self._kept[rec.parent]
        if limit is not None and rec.input_length >= limit:
            segments, hashes = [], []  # vLLM rejects the prompt: nothing to hash
        elif rec.parent is None:
            segments = self._root_prompt(rec)
            segments.append(self._output(rec))
            hashes = block_hashes(segments, self.block_size)
        else:
            parent_segments, parent_hashes = parent_built
            new = rec.input_length - parent.input_length - parent.output_length
            segments = list(parent_segments)
            if new > 0:
                segments.append((self.new_content_id(rec), 0, new))
            segments.append(self._output(rec))
            hashes = block_hashes(segments, self.block_size, parent_hashes)
        if ahead or self._unbuilt.get(rec.request_id, 0) > 0:
            self._kept[rec.request_id] = (segments, hashes)
        if rec.parent is not None:
            self._unbuilt[rec.parent] -= 1
            self._maybe_release(rec.parent)
        return segments, hashes

    def _maybe_release(self, request_id: int) -> None:
        """Drop a record's kept sequence once it is sent and every child of it is built."""
        if request_id in self._sent and self._unbuilt.get(request_id, 0) <= 0:
            self._kept.pop(request_id, None)
            self._sent.discard(request_id)

    def _output(self, rec: TraceRecord) -> Segment:
        """``rec``'s output segment, cut where vLLM clamps ``max_tokens``."""
        length = rec.output_length
        if self.max_model_len is not None:
            length = min(length, self.max_model_len - rec.input_length)
        return (self.output_content_id(rec), 0, length)

    def _root_prompt(self, rec: TraceRecord) -> list[Segment]:
        size = self.trace.block_size
        ids = rec.hash_ids or ()
        segments = [(hid, 0, size) for hid in ids]
        if segments:
            last = rec.input_length - size * (len(ids) - 1)
            segments[-1] = (ids[-1], 0, last)
        return segments
