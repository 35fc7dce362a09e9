"""Which reader a trace file needs, and reading it with that reader.

Formats (:data:`FORMATS`): ``kvroute`` (kvroute/Mooncake JSON Lines), ``azure`` (Azure LLM
inference CSV), ``burstgpt`` (BurstGPT CSV), ``sharegpt`` (ShareGPT-style conversation JSON) and
``vllm-bench`` (``vllm bench serve`` result JSON). ``auto`` picks by suffix and content: a
``.csv`` by its header, a ``.json`` by its top level (a list: ShareGPT; an object with
``input_lens``: a vLLM result), anything else JSON Lines, unless its first line is no JSON object
(a README, a YAML file): that file is in no format kvroute reads, and is refused as such
(:data:`FORMATS_READ`) rather than as malformed JSON.
"""

from __future__ import annotations

import csv
import os
from collections.abc import Callable
from pathlib import Path

from kvroute.traces.format import Trace
from kvroute.traces.inputs import InputError, check_regular_file
from kvroute.traces.reader import MOONCAKE_BLOCK_SIZE, TraceError

FORMATS = ("auto", "kvroute", "azure", "burstgpt", "sharegpt", "vllm-bench")

FORMATS_READ = ("kvroute or Mooncake JSON Lines (.jsonl), Azure or BurstGPT CSV (.csv), "
                "ShareGPT or vllm bench serve JSON (.json)")
"""The trace formats ``auto`` recognises, with their suffixes, as an error message names them."""


def detect_format(path: str | os.PathLike[str]) -> str:
    """The format of ``path`` (one of :data:`FORMATS` but ``auto``).

    Raises:
        TraceError: a ``.json`` file that is neither a list nor a vLLM result; a file of another
            suffix than ``.jsonl`` whose first non-blank line is not a JSON object (nor gzip
            data, which the JSON Lines reader names).
        OSError: the file cannot be opened.
    """
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix == ".csv":
        from kvroute.traces.burstgpt import is_burstgpt_header

        with open(path, encoding="utf-8-sig", errors="replace", newline="") as handle:
            header = next(csv.reader(handle), [])
        return "burstgpt" if is_burstgpt_header(header) else "azure"
    if suffix == ".json":
        with open(path, "rb") as handle:
            head = handle.read(4096).removeprefix(b"\xef\xbb\xbf").lstrip()  # a UTF-8 BOM, then blanks
        if head[:1] == b"[":
            return "sharegpt"
        if head[:1] == b"{":
            return "vllm-bench"
        raise TraceError("a .json trace must be a ShareGPT list or a vllm bench serve result object", str(path), 1)
    if suffix != ".jsonl" and not _starts_like_json_lines(path):
        raise TraceError(f"not a trace format kvroute reads (its first line is not a JSON object); it reads "
                         f"{FORMATS_READ}", str(path))
    return "kvroute"


def _starts_like_json_lines(path: Path) -> bool:
    """Whether ``path`` is empty, gzip data (the reader says to decompress it) or its first
    non-blank line opens a JSON object, as every line of a JSON Lines trace does."""
    with open(path, "rb") as handle:
        head = handle.read(4096)
    if head[:2] == b"\x1f\x8b":
        return True
    head = head.removeprefix(b"\xef\xbb\xbf").lstrip()  # a UTF-8 BOM, then blank lines
    return not head or head[:1] == b"{"


def read_any(path: str | os.PathLike[str], block_size: int | None = None, fmt: str = "auto",
             count_tokens: Callable[[str], int] | None = None, tokens_note: str | None = None) -> Trace:
    """Read ``path`` in format ``fmt`` (``auto``: :func:`detect_format`).

    Args:
        path: the trace file.
        block_size: tokens per hash id block (a JSON Lines file may declare its own); default 512
            (16 for ShareGPT, whose fresh ids then match vLLM's blocks).
        fmt: one of :data:`FORMATS`.
        count_tokens, tokens_note: ShareGPT's token counter and how it counts
            (:mod:`kvroute.traces.sharegpt`); ignored by the other formats.

    Raises:
        TraceError (a ValueError): an unknown format, or the reader's error naming file, line or
            record and field.
        OSError: the file cannot be opened.
    """
    if fmt not in FORMATS:
        raise TraceError(f"unknown trace format {fmt!r}; expected one of {', '.join(FORMATS)}", str(path))
    try:
        check_regular_file(path)  # a FIFO would block, /dev/zero never ends
    except InputError as exc:
        raise TraceError(exc.reason, None) from None
    if fmt == "auto":
        fmt = detect_format(path)
    if fmt == "kvroute":
        from kvroute.traces.reader import read_trace

        return read_trace(path, block_size)
    if fmt == "sharegpt":
        from kvroute.traces.sharegpt import read_sharegpt

        return read_sharegpt(path, block_size or 16, count_tokens, tokens_note)
    block_size = block_size or MOONCAKE_BLOCK_SIZE
    if fmt == "azure":
        from kvroute.traces.azure import read_azure_csv

        return read_azure_csv(path, block_size)
    if fmt == "burstgpt":
        from kvroute.traces.burstgpt import read_burstgpt

        return read_burstgpt(path, block_size)
    from kvroute.traces.vllm_bench import read_vllm_bench

    return read_vllm_bench(path, block_size)

