"""From trace records to engine prompts: content segments and block hashes per request.

A root record's prompt is its ``hash_ids`` blocks at the trace's block size (content id = the
hash id; the last block may be partial). A record with a ``parent`` resends the parent's whole
sequence (prompt and generated output) followed by its own new tokens. Every request's output is
a content stream of its own, so a later turn that resends it hits the blocks the reply filled on
the worker that generated it. Run-allocated content ids derive from the record's position in the
trace, so the same trace always gives the same hashes.
"""

from __future__ import annotations

from kvroute.sim.content import GENERATED_CONTENT_BASE, Segment, block_hashes
from kvroute.traces.format import Trace, TraceRecord
from kvroute.traces.reader import check_block_sizes


class Workload:
    """Prompt content of every record of a trace, built on demand and released after use.

    Args:
        trace: the requests.
        block_size: the engine's tokens per block.

    Attributes:
        roots: records without a parent, in trace order.
        children: request_id -> records extending it, in trace order.
        has_sessions: whether any record extends another (closed-loop replay is then the
            default).

    Raises:
        ValueError: on a block-size mismatch, naming the sizes that would work.
    """

    def __init__(self, trace: Trace, block_size: int) -> None:
        try:
            check_block_sizes(trace.block_size, block_size)
        except ValueError as exc:
            raise ValueError(f"{trace.source}: {exc}") from exc
        self.trace = trace
        self.block_size = block_size
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
        self._pending = {rid: len(kids) for rid, kids in self.children.items()}
        self._kept: dict[int, tuple[list[Segment], list[int]]] = {}

    def output_content_id(self, rec: TraceRecord) -> int:
        """Content id of ``rec``'s generated output."""
        return GENERATED_CONTENT_BASE + 2 * self.position[rec.request_id]

    def new_content_id(self, rec: TraceRecord) -> int:
        """Content id of the new tokens a child record adds after its parent's sequence."""
        return GENERATED_CONTENT_BASE + 2 * self.position[rec.request_id] + 1

    def build(self, rec: TraceRecord) -> tuple[list[Segment], list[int]]:
        """Segments of ``rec``'s prompt followed by its output, and their full-block hashes.

        Returns:
            ``(segments, hashes)``: the sequence of ``input_length + output_length`` tokens
            and one hash per full engine block of it.
        """
        out = (self.output_content_id(rec), 0, rec.output_length)
        if rec.parent is None:
            segments = self._root_prompt(rec)
            segments.append(out)
            hashes = block_hashes(segments, self.block_size)
        else:
            parent = self.by_id[rec.parent]
            parent_segments, parent_hashes = self._parent_sequence(parent)
            new = rec.input_length - parent.input_length - parent.output_length
            segments = list(parent_segments)
            if new > 0:
                segments.append((self.new_content_id(rec), 0, new))
            segments.append(out)
            hashes = block_hashes(segments, self.block_size, parent_hashes)
            self._release_parent(parent.request_id)
        if rec.request_id in self._pending:
            self._kept[rec.request_id] = (segments, hashes)
        return segments, hashes

    def _root_prompt(self, rec: TraceRecord) -> list[Segment]:
        size = self.trace.block_size
        ids = rec.hash_ids or ()
        segments = [(hid, 0, size) for hid in ids]
        if segments:
            last = rec.input_length - size * (len(ids) - 1)
            segments[-1] = (ids[-1], 0, last)
        return segments

    def _parent_sequence(self, parent: TraceRecord) -> tuple[list[Segment], list[int]]:
        kept = self._kept.get(parent.request_id)
        if kept is not None:
            return kept
        # Open-loop replay can send a child before its parent: build the parent's content too.
        segments, hashes = self.build(parent)
        return segments, hashes

    def _release_parent(self, parent_id: int) -> None:
        left = self._pending.get(parent_id, 0) - 1
        if left <= 0:
            self._pending.pop(parent_id, None)
            self._kept.pop(parent_id, None)
        else:
            self._pending[parent_id] = left
