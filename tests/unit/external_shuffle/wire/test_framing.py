"""The hand-framed data messages are the protobuf messages proto/ defines: what we frame parses
with the generated classes, what the generated classes serialize reads back, the data is a
view of the received bytes, and malformed bytes raise a SerializationError naming the fault."""

from __future__ import annotations

import pytest

from external_shuffle.wire.framing import fetch_prefix, frame_push, read_fetch, read_push
from external_shuffle.wire.stubs import pb
from shuffle_api import SerializationError

KEY = pb.PartitionKey(result_id="result-a", partition_index=3, producer_attempt_id="task-7")
DATA = bytes(range(256)) * 700  # 179,200 bytes: a multi-byte length prefix


def test_a_framed_push_is_what_protobuf_serializes() -> None:
    parts = [memoryview(DATA)[:1000], memoryview(DATA)[1000:]]
    header = pb.PushDataRequest(
        partition=KEY, sequence=5, application_id="app-a", placement=b"p" * 32
    )
    framed = frame_push(header, parts, len(DATA))
    header.data = DATA  # framed after the fields numbered past it: equal once parsed
    assert pb.PushDataRequest.FromString(framed) == header


@pytest.mark.parametrize("sequence", [0, 1, 2**40])
@pytest.mark.parametrize("data", [b"", b"x", DATA])
def test_a_push_serialized_by_protobuf_reads_back_with_its_data_as_a_view(
    sequence: int, data: bytes
) -> None:
    message = pb.PushDataRequest(partition=KEY, sequence=sequence, data=data).SerializeToString()
    chunk = read_push(message)
    assert chunk.header.partition == KEY
    assert chunk.header.sequence == sequence
    assert bytes(chunk.data) == data
    assert chunk.data.obj is message  # no copy of the data


@pytest.mark.parametrize("end_of_run", [False, True])
@pytest.mark.parametrize("data", [b"", b"x", DATA])
def test_a_fetch_prefix_and_its_data_parse_with_protobuf(end_of_run: bool, data: bytes) -> None:
    prefix = fetch_prefix(len(data), end_of_run=end_of_run, run_checksum=2**63 + 1)
    parsed = pb.FetchDataResponse.FromString(prefix + data)
    assert parsed.data == data
    assert parsed.end_of_run is end_of_run
    assert parsed.run_checksum == 2**63 + 1
    assert not parsed.manifest


def test_fetch_messages_serialized_by_protobuf_read_back() -> None:
    manifest = read_fetch(pb.FetchDataResponse(manifest=b'{"m": 1}').SerializeToString())
    assert manifest.header.manifest == b'{"m": 1}'
    assert not manifest.data
    message = pb.FetchDataResponse(
        data=DATA, end_of_run=True, run_checksum=12345
    ).SerializeToString()
    chunk = read_fetch(message)
    assert (chunk.header.end_of_run, chunk.header.run_checksum) == (True, 12345)
    assert bytes(chunk.data) == DATA
    assert chunk.data.obj is message


def test_unknown_fields_of_every_wire_type_are_skipped() -> None:
    """A newer peer may add fields: varint (tag 0x78 = field 15), 64-bit (0x81 0x01 = field
    16), length-delimited (0x8a 0x01 = field 17) and 32-bit (0x95 0x01 = field 18)."""
    unknown = b"\x78\x96\x01" + b"\x81\x01" + bytes(8) + b"\x8a\x01\x03abc" + b"\x95\x01" + bytes(4)
    known = pb.PushDataRequest(partition=KEY, sequence=9, data=b"payload").SerializeToString()
    chunk = read_push(unknown + known)
    assert (chunk.header.sequence, bytes(chunk.data)) == (9, b"payload")


def test_the_last_data_field_wins_as_protobuf_parses_it() -> None:
    twice = b"\x1a\x03one" + b"\x1a\x03two"
    assert pb.PushDataRequest.FromString(twice).data == b"two"
    assert bytes(read_push(twice).data) == b"two"


@pytest.mark.parametrize(
    ("message", "fault"),
    [
        (b"\x1a\x05abc", "runs past its end"),  # data field: 5 bytes announced, 3 there
        (b"\x1a", "does not end"),  # data field: no length
        (b"\x10" + b"\xff" * 11, "does not end"),  # sequence: a varint of 11 bytes
        (b"\x0b", "wire type 3"),  # a group (proto2's, unsupported)
        (b"\x0e", "wire type 6"),  # no such wire type
        (b"\x0a\x02\xff\xff", "PushDataRequest"),  # the partition key: not a message
        (b"\x10\x01" * 65, "more than 64 fields"),  # a flood of fields to walk
    ],
)
def test_malformed_bytes_raise_a_serialization_error_naming_the_fault(
    message: bytes, fault: str
) -> None:
    with pytest.raises(SerializationError, match=fault):
        read_push(message)
