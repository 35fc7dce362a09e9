"""KV-cache events decoded by kvroute's own schema for every vLLM release read (issue 33, row 4).

The fixtures are one ``KVEventBatch`` encoded with each release's own event classes (its
``vllm/distributed/kv_events.py`` from the released wheel, executed with msgspec as
``tests/support/kv_event_fixtures.py`` says, since the module does not import without vLLM): arrays
``[tag, fields...]`` through 0.23 (``array_like=True``), maps from 0.24. Each is decoded by
:func:`kvroute.calibrate.live.kv_events.decode_batch`, with no vLLM, into the same events; the
structs declared here (the two wire families as the client understands them) re-encode each to
the same bytes; where vLLM is installed (the live extra: 0.32), its own encoder gives the 0.24+
bytes.
"""

from __future__ import annotations

import pytest

msgspec = pytest.importorskip("msgspec", reason="msgspec is not installed (the test and gpu extras bring it)")

from kvroute.calibrate.live.kv_events import KVEvent, KVEventFormatError, LiveKVEvents, decode_batch
from kvroute.sim.timing.vllm_versions import kv_events_as_maps
from tests.support.kv_event_fixtures import TS

WIRE = {
    "0.11.0": bytes.fromhex(
        "93cb41da4c8f281000009497ab426c6f636b53746f726564926566c098010203040506070804c0a347505597ab426c6f"
        "636b53746f72656491676694090a0b0c04c0a347505593ac426c6f636b52656d6f7665649165a347505591b0416c6c42"
        "6c6f636b73436c656172656400"
    ),
    "0.14.0": bytes.fromhex(
        "93cb41da4c8f281000009498ab426c6f636b53746f726564926566c098010203040506070804c0a3475055c098ab426c"
        "6f636b53746f72656491676694090a0b0c04c0a3475055c093ac426c6f636b52656d6f7665649165a347505591b0416c"
        "6c426c6f636b73436c656172656400"
    ),
    "0.20.0": bytes.fromhex(
        "93cb41da4c8f28100000949aab426c6f636b53746f726564926566c098010203040506070804c0a3475055c0c0c09aab"
        "426c6f636b53746f72656491676694090a0b0c04c0a3475055c0c0c094ac426c6f636b52656d6f7665649165a3475055"
        "c091b0416c6c426c6f636b73436c656172656400"
    ),
    "0.23.0": bytes.fromhex(
        "93cb41da4c8f28100000949cab426c6f636b53746f726564926566c098010203040506070804c0a3475055c0c0c0c0c0"
        "9cab426c6f636b53746f72656491676694090a0b0c04c0a3475055c0c0c0c0c094ac426c6f636b52656d6f7665649165"
        "a3475055c091b0416c6c426c6f636b73436c656172656400"
    ),
    "0.24.0": bytes.fromhex(
        "93cb41da4c8f281000009488a474797065ab426c6f636b53746f726564ac626c6f636b5f686173686573926566b17061"
        "72656e745f626c6f636b5f68617368c0a9746f6b656e5f696473980102030405060708aa626c6f636b5f73697a6504a7"
        "6c6f72615f6964c0a66d656469756da3475055a96c6f72615f6e616d65c088a474797065ab426c6f636b53746f726564"
        "ac626c6f636b5f6861736865739167b1706172656e745f626c6f636b5f6861736866a9746f6b656e5f69647394090a0b"
        "0caa626c6f636b5f73697a6504a76c6f72615f6964c0a66d656469756da3475055a96c6f72615f6e616d65c083a47479"
        "7065ac426c6f636b52656d6f766564ac626c6f636b5f6861736865739165a66d656469756da347505581a474797065b0"
        "416c6c426c6f636b73436c656172656400"
    ),
    "0.26.0": bytes.fromhex(
        "93cb41da4c8f281000009488a474797065ab426c6f636b53746f726564ac626c6f636b5f686173686573926566b17061"
        "72656e745f626c6f636b5f68617368c0a9746f6b656e5f696473980102030405060708aa626c6f636b5f73697a6504a7"
        "6c6f72615f6964c0a66d656469756da3475055a96c6f72615f6e616d65c088a474797065ab426c6f636b53746f726564"
        "ac626c6f636b5f6861736865739167b1706172656e745f626c6f636b5f6861736866a9746f6b656e5f69647394090a0b"
        "0caa626c6f636b5f73697a6504a76c6f72615f6964c0a66d656469756da3475055a96c6f72615f6e616d65c083a47479"
        "7065ac426c6f636b52656d6f766564ac626c6f636b5f6861736865739165a66d656469756da347505581a474797065b0"
        "416c6c426c6f636b73436c656172656400"
    ),
    "0.34.0": bytes.fromhex(
        "93cb41da4c8f2810000094de0008a474797065ab426c6f636b53746f726564ac626c6f636b5f686173686573926566b1"
        "706172656e745f626c6f636b5f68617368c0a9746f6b656e5f696473980102030405060708aa626c6f636b5f73697a65"
        "04a76c6f72615f6964c0a66d656469756da3475055a96c6f72615f6e616d65c0de0008a474797065ab426c6f636b5374"
        "6f726564ac626c6f636b5f6861736865739167b1706172656e745f626c6f636b5f6861736866a9746f6b656e5f696473"
        "94090a0b0caa626c6f636b5f73697a6504a76c6f72615f6964c0a66d656469756da3475055a96c6f72615f6e616d65c0"
        "83a474797065ac426c6f636b52656d6f766564ac626c6f636b5f6861736865739165a66d656469756da347505581a474"
        "797065b0416c6c426c6f636b73436c656172656400"
    ),
}
"""``python -m tests.support.kv_event_fixtures <unpacked wheels>`` printed these (2026-12-05)."""

EXPECTED = [
    KVEvent("BlockStored", (101, 102), None, tuple(range(1, 9))),
    KVEvent("BlockStored", (103,), 102, (9, 10, 11, 12)),
    KVEvent("BlockRemoved", (101,)),
    KVEvent("AllBlocksCleared"),
]


@pytest.mark.parametrize("version", sorted(WIRE))
def test_every_release_decodes_to_the_same_events(version):
    ts, events = decode_batch(WIRE[version])
    assert ts == TS
    assert events == EXPECTED


@pytest.mark.parametrize("version", sorted(WIRE))
def test_the_event_form_changes_at_0_24(version):
    first_event = msgspec.msgpack.decode(WIRE[version])[1][0]
    assert isinstance(first_event, dict) is kv_events_as_maps(version)
    assert kv_events_as_maps(version) is (version >= "0.24.0")


# The two families as the client reads them, declared here (field order is the wire's for arrays).
class _ArrayEvent(msgspec.Struct, array_like=True, omit_defaults=True, tag=True):
    pass


class _MapEvent(msgspec.Struct, omit_defaults=True, tag=True):
    pass


def _family(base, lora_name: bool, trailing: int):
    fields = dict(block_hashes=list, parent_block_hash=int | None, token_ids=list, block_size=int,
                  lora_id=int | None, medium=str | None)
    if lora_name:
        fields["lora_name"] = str | None
    names = ["extra_keys", "group_idx", "kv_cache_spec_kind", "kv_cache_spec_sliding_window"][:trailing]
    stored = msgspec.defstruct("BlockStored", [*fields.items(), *((n, object, None) for n in names)], bases=(base,))
    removed_fields = [("block_hashes", list), ("medium", str | None)]
    removed_fields += [("group_idx", int | None, None)] if trailing else []
    removed = msgspec.defstruct("BlockRemoved", removed_fields, bases=(base,))
    cleared = msgspec.defstruct("AllBlocksCleared", [], bases=(base,))
    return stored, removed, cleared


class _Batch(msgspec.Struct, array_like=True, omit_defaults=True):
    ts: float
    events: list
    data_parallel_rank: int | None = None


FAMILIES = {  # version: (event base, has lora_name, defaulted fields after it); 0.34's BlockStored has
    # more than 15 fields, so msgspec writes its map header in 3 bytes: decoded above, not re-encoded here
    "0.11.0": (_ArrayEvent, False, 0),
    "0.14.0": (_ArrayEvent, True, 0),
    "0.20.0": (_ArrayEvent, True, 2),
    "0.23.0": (_ArrayEvent, True, 4),
    "0.24.0": (_MapEvent, True, 4),
    "0.26.0": (_MapEvent, True, 4),
}


@pytest.mark.parametrize("version", sorted(FAMILIES))
def test_the_declared_families_encode_each_release_byte_for_byte(version):
    base, lora_name, trailing = FAMILIES[version]
    stored, removed, cleared = _family(base, lora_name, trailing)
    extra = {"lora_name": None} if lora_name else {}
    events = [stored(block_hashes=[101, 102], parent_block_hash=None, token_ids=list(range(1, 9)), block_size=4,
                     lora_id=None, medium="GPU", **extra),
              stored(block_hashes=[103], parent_block_hash=102, token_ids=[9, 10, 11, 12], block_size=4,
                     lora_id=None, medium="GPU", **extra),
              removed(block_hashes=[101], medium="GPU"), cleared()]
    assert msgspec.msgpack.encode(_Batch(TS, events, 0)) == WIRE[version]


def test_installed_vllm_encodes_the_map_family_bytes():
    kv_events = pytest.importorskip("vllm.distributed.kv_events", reason="vLLM is not installed (the live extra)")
    import vllm

    assert vllm.__version__ >= "0.24"
    extra = {"lora_name": None}
    events = [kv_events.BlockStored(block_hashes=[101, 102], parent_block_hash=None, token_ids=list(range(1, 9)),
                                    block_size=4, lora_id=None, medium="GPU", **extra),
              kv_events.BlockStored(block_hashes=[103], parent_block_hash=102, token_ids=[9, 10, 11, 12],
                                    block_size=4, lora_id=None, medium="GPU", **extra),
              kv_events.BlockRemoved(block_hashes=[101], medium="GPU"), kv_events.AllBlocksCleared()]
    data = msgspec.msgpack.encode(kv_events.KVEventBatch(ts=TS, events=events, data_parallel_rank=0))
    assert data == WIRE["0.26.0"]


@pytest.mark.parametrize("version", ["0.11.0", "0.34.0"])
def test_decoded_events_feed_the_index_the_same_way(version):
    feed = LiveKVEvents(["ipc:///unused"], block_size=4)
    ts, events = decode_batch(WIRE[version])
    feed.apply(0, events[:2], ts)  # the two stores: blocks 1-8 and 9-12, chained
    assert feed.translators[0].num_unnamed == 0
    assert len(feed.index.cached(0)) == 3
    feed.apply(0, events[2:3], ts)  # the removal of block 101
    assert len(feed.index.cached(0)) == 2
    feed.apply(0, events[3:], ts)
    assert len(feed.index.cached(0)) == 0


def test_bytes_hashes_and_unknown_tags_decode():
    payload = msgspec.msgpack.encode([2.5, [{"type": "BlockStored", "block_hashes": [b"\x01" * 32],
                                            "parent_block_hash": None, "token_ids": [5, 6]},
                                           ["SomethingNew", 1, 2]]])
    ts, events = decode_batch(payload)
    assert ts == 2.5 and events == [KVEvent("BlockStored", (b"\x01" * 32,), None, (5, 6)), KVEvent("SomethingNew")]


@pytest.mark.parametrize("payload, message", [
    (b"\xc1", "not a msgpack KV-event batch"),
    (msgspec.msgpack.encode([1.0]), "a KV-event batch is \\[ts, events, ...\\]"),
    (msgspec.msgpack.encode([1.0, [7]]), "a KV-cache event is a tagged array or map, got int"),
    (msgspec.msgpack.encode([1.0, [{"block_hashes": []}]]), "without its type tag"),
])
def test_bad_payloads_are_one_clear_error(payload, message):
    with pytest.raises(KVEventFormatError, match=message):
        decode_batch(payload)


def test_the_feed_waits_for_a_late_publisher_and_sees_its_first_batch(tmp_path):
    """start() returns once the subscription has connected, not after a fixed wait: a publisher
    that binds 1 s late (longer than the old fixed 0.5 s join) still has its first batch, sent
    the moment start() returns, received."""
    import asyncio

    zmq = pytest.importorskip("zmq")
    import zmq.asyncio

    endpoint = f"ipc://{tmp_path}/kv-events"

    async def main():
        ctx = zmq.asyncio.Context()
        pub = ctx.socket(zmq.PUB)
        feed = LiveKVEvents([endpoint], block_size=4)

        async def bind_late():
            await asyncio.sleep(1.0)
            pub.bind(endpoint)

        binder = asyncio.create_task(bind_late())
        task = await feed.start()
        joined = feed.num_joined
        await pub.send_multipart([b"kv", (0).to_bytes(8, "big"), WIRE["0.34.0"]])
        for _ in range(100):
            if feed.num_batches:
                break
            await asyncio.sleep(0.02)
        task.cancel()
        await asyncio.gather(task, binder, return_exceptions=True)
        pub.close(linger=0)
        ctx.term()
        return joined, feed.num_batches, feed.stored_at(0, next(iter(feed._stored_ts[0])))

    joined, batches, ts = asyncio.run(main())
    assert (joined, batches, ts) == (1, 1, TS)


def _frames(seq: int, payload: bytes) -> list[bytes]:
    return [b"kv", seq.to_bytes(8, "big"), payload]


def test_sequence_gaps_count_the_batches_lost_and_nothing_else():
    feed = LiveKVEvents(["ipc:///a", "ipc:///b"], block_size=4)
    empty = msgspec.msgpack.encode([1.0, []])
    for seq in (7, 8, 11, 12, 20):  # joined at 7: 9-10 and 13-19 lost
        feed.receive(0, _frames(seq, empty))
    feed.receive(0, _frames(9, empty))  # a late or repeated number is no gap and moves nothing
    feed.receive(0, _frames(21, empty))
    feed.receive(1, [empty])  # a message without a sequence frame is taken as it is
    assert (feed.num_lost, feed.num_batches) == ([9, 0], 8)
    assert feed.losses() == ["ipc:///a: 9 KV-event batch(es) lost (gaps in the sequence numbers); "
                             "the KV-event index may miss their blocks"]


def test_an_undecodable_payload_costs_that_batch_only():
    """The batch after a bad one is read and indexed, and the bad one is counted and named (a bad
    payload used to end the feed of every server)."""
    feed = LiveKVEvents(["ipc:///a", "ipc:///b"], block_size=4)
    feed.receive(0, _frames(0, b"\xc1"))
    feed.receive(0, _frames(1, WIRE["0.34.0"]))
    feed.receive(0, _frames(2, msgspec.msgpack.encode([1.0, [7]])))
    assert (feed.num_undecodable, feed.num_lost, feed.num_batches) == ([2, 0], [0, 0], 1)
    assert len(feed.index.cached(0)) == 0  # 0.34.0's batch stores three blocks, removes one, clears all
    assert feed.stored_at(0, next(iter(feed._stored_ts[0]))) == TS
    (line,) = feed.losses()
    assert line.startswith("ipc:///a: 2 undecodable payload(s) skipped (first: not a msgpack KV-event batch")
    assert feed.problem(None) is None


def test_a_feed_of_only_undecodable_payloads_is_a_problem_that_says_why():
    feed = LiveKVEvents(["ipc:///a"], block_size=4)
    feed.receive(0, _frames(0, msgspec.msgpack.encode([1.0])))
    assert feed.problem(None) == ("no KV-cache event batch from ipc:///a could be read (1 undecodable; "
                                  "first: a KV-event batch is [ts, events, ...])")


def test_a_bad_payload_on_the_wire_does_not_stop_the_feed(tmp_path):
    """Over a real ZeroMQ socket: a bad payload, then a good one that skips a sequence number;
    the feed task is still running after both and has read the second."""
    import asyncio

    zmq = pytest.importorskip("zmq")
    import zmq.asyncio

    endpoint = f"ipc://{tmp_path}/kv-events"

    async def main():
        ctx = zmq.asyncio.Context()
        pub = ctx.socket(zmq.PUB)
        pub.bind(endpoint)
        feed = LiveKVEvents([endpoint], block_size=4)
        task = await feed.start()
        await pub.send_multipart(_frames(0, b"\xc1"))
        await pub.send_multipart(_frames(2, WIRE["0.11.0"]))
        for _ in range(100):
            if feed.num_batches:
                break
            await asyncio.sleep(0.02)
        running = not task.done()
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        pub.close(linger=0)
        ctx.term()
        return running, feed.num_batches, feed.num_undecodable, feed.num_lost

    assert asyncio.run(main()) == (True, 1, [1], [1])
