"""Make the KV-event wire fixtures of ``tests/calibrate/live/test_kv_event_wire.py`` from vLLM
wheels: ``python -m tests.support.kv_event_fixtures DIR...``, each DIR a wheel unpacked with
``unzip WHEEL 'vllm/*.py' -d DIR`` (``pip download vllm==X --no-deps``).

A wheel's ``vllm/distributed/kv_events.py`` does not import without the rest of vLLM (it imports
``vllm.config``, ``vllm.logger`` and ``vllm.v1.core.kv_cache_utils``), so its class definitions,
up to the publishers, are executed on their own with those imports left out and
``ExternalBlockHash`` given as ``bytes | int`` (its definition in ``v1/core/kv_cache_utils.py`` of
every release read). The bytes are then msgspec's encoding of each release's own structs, as the
server's ``ZmqEventPublisher`` sends them (``msgspec.msgpack.Encoder().encode(batch)``).
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Union

TS = 1764900000.25
"""The batch's ``ts`` in every fixture."""


def release_classes(root: Path) -> dict:
    """The namespace of ``root``/vllm/distributed/kv_events.py's event classes."""
    path = Path(root) / "vllm" / "distributed" / "kv_events.py"
    text = path.read_text()
    cut = min(i for i in (text.find("class EventPublisher"), text.find("class KVEventAggregator")) if i > 0)
    text = re.sub(r"^from vllm[^\n]*\((?:.|\n)*?\)\n", "", text[:cut], flags=re.M)
    text = "\n".join(line for line in text.splitlines() if not line.startswith(("from vllm", "import zmq", "logger =")))
    ns: dict = {"__name__": f"vllm_kv_events_{root.name.replace('.', '_')}", "ExternalBlockHash": Union[bytes, int]}
    exec(compile(text, str(path), "exec"), ns)
    return ns


def fixture_batch(ns: dict):
    """The fixture's batch built from one release's classes: two ``BlockStored`` (blocks 101,
    102 of tokens 1..8, then 103 of 9..12 under parent 102; block size 4), a ``BlockRemoved`` of
    101 and an ``AllBlocksCleared``, data-parallel rank 0."""
    stored, removed, cleared = ns["BlockStored"], ns["BlockRemoved"], ns["AllBlocksCleared"]
    extra = {"lora_name": None} if "lora_name" in stored.__struct_fields__ else {}

    def block(hashes, parent, tokens):
        return stored(block_hashes=hashes, parent_block_hash=parent, token_ids=tokens, block_size=4,
                      lora_id=None, medium="GPU", **extra)

    events = [block([101, 102], None, list(range(1, 9))), block([103], 102, [9, 10, 11, 12]),
              removed(block_hashes=[101], medium="GPU"), cleared()]
    return ns["KVEventBatch"](ts=TS, events=events, data_parallel_rank=0)


def main(argv: list[str]) -> int:
    import msgspec

    for root in argv:
        print(Path(root).name, msgspec.msgpack.encode(fixture_batch(release_classes(Path(root)))).hex())
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
