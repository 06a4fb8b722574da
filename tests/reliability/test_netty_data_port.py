"""The data port under bad input: credits honoured, departed consumers, corrupt or missing
files, hostile frames."""

from __future__ import annotations

import socket
import struct
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from netty_like import NettyShuffleEnvironment
from netty_like.handshake import open_handshake
from netty_like.protocol import (
    BufferHeader,
    FrameType,
    Request,
    decode_error,
    encode_credit,
    error_from_code,
    read_frame,
    write_frame,
)
from shuffle_api import (
    ChecksumMismatchError,
    Configuration,
    InvalidIdentifierError,
    PartitionNotFoundError,
    ResultPartitionType,
    ShuffleDescriptor,
    SubpartitionRange,
)
from shuffle_api.format import partition_directory
from shuffle_api.store import Store
from shuffle_api.testing import ConformanceHarness, ShuffleScenario, make_batches
from shuffle_api.testing.harness import route

MAX_FRAME = 1 << 20


@pytest.fixture
def scenario(tmp_path: Path) -> Iterator[ShuffleScenario]:
    config = Configuration.load(
        {
            "netty-like.storage.url": str(tmp_path / "store"),
            "netty-like.sort-buffer.size": "64k",
            "shuffle.batch.target-size": "16k",
            "netty-like.pipelined.subpartition-buffer": "128k",
            "netty-like.network.max-frame-size": MAX_FRAME,
        },
        environ={},
    )
    with ShuffleScenario.open(ConformanceHarness(config)) as opened:
        yield opened


def _port(environment: object) -> int:
    assert isinstance(environment, NettyShuffleEnvironment)
    assert environment.data_server is not None
    return environment.data_server.port


def _connect(scenario: ShuffleScenario) -> socket.socket:
    """A connection that has passed the handshake with the application's secret."""
    sock = socket.create_connection(("127.0.0.1", _port(scenario.producer)), timeout=10)
    open_handshake(sock, scenario.secret, "the producer")
    return sock


def _next_frame(sock: socket.socket) -> tuple[FrameType, memoryview]:
    frame = read_frame(sock, MAX_FRAME)
    assert frame is not None
    return frame


def _silent(sock: socket.socket, seconds: float = 0.5) -> bool:
    """True if nothing arrives for ``seconds``."""
    sock.settimeout(seconds)
    try:
        sock.recv(1)
    except TimeoutError:
        return True
    finally:
        sock.settimeout(10)
    return False


def test_producer_sends_one_buffer_per_credit_and_reports_its_backlog(
    scenario: ShuffleScenario,
) -> None:
    descriptors, _ = scenario.produce(make_batches(20_000), partitions=1, subpartitions=1)
    with _connect(scenario) as sock:
        request = Request(7, descriptors[0].result_partition_id, SubpartitionRange(0, 0), 1, False)
        write_frame(sock, FrameType.REQUEST, request.encode())
        assert _next_frame(sock)[0] is FrameType.SCHEMA
        frame_type, body = _next_frame(sock)
        assert frame_type is FrameType.BUFFER
        header, _ = BufferHeader.decode(body)
        assert header.channel == 7
        assert header.backlog > 2
        assert _silent(sock), "the producer sent a buffer without credit"
        write_frame(sock, FrameType.CREDIT, encode_credit(7, 2))
        assert [_next_frame(sock)[0] for _ in range(2)] == [FrameType.BUFFER] * 2
        assert _silent(sock), "the producer sent more buffers than credits"


def test_consumer_that_disconnects_frees_the_producer_buffers(scenario: ShuffleScenario) -> None:
    partition_type = ResultPartitionType.PIPELINED
    descriptor = scenario.partition_descriptor(
        0, partitions=1, subpartitions=1, partition_type=partition_type
    )
    shuffle_descriptor, writer = scenario.new_writer(descriptor)
    finished = threading.Event()

    def produce() -> None:
        with writer:
            for batch in make_batches(100_000, batch_rows=1_000):  # ~4.5 MB >> 128 KiB buffer
                writer.write(batch, route(batch, 1))
        finished.set()

    threading.Thread(target=produce, daemon=True).start()
    producer = scenario.producer
    assert isinstance(producer, NettyShuffleEnvironment)
    gate = scenario.gate(
        scenario.consumer,
        [shuffle_descriptor],
        SubpartitionRange(0, 0),
        partition_type=partition_type,
    )
    batches = iter(gate)
    next(batches)
    deadline = time.monotonic() + 10
    while producer.queued_bytes() == 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert producer.queued_bytes() > 0  # the producer is ahead, held back by backpressure
    gate.close()
    assert finished.wait(30), "the producer stayed blocked after its consumer left"
    assert producer.queued_bytes() == 0
    assert (
        shuffle_descriptor.result_partition_id
        not in producer.partitions_occupying_local_resources()
    )
    assert producer.data_server is not None
    deadline = time.monotonic() + 10
    while producer.data_server.connection_count and time.monotonic() < deadline:
        time.sleep(0.01)
    assert producer.data_server.connection_count == 0


def _data_file(scenario: ShuffleScenario, descriptor: ShuffleDescriptor) -> Path:
    producer = scenario.producer
    assert isinstance(producer, NettyShuffleEnvironment)
    store: Store = producer.store
    return Path(partition_directory(store, descriptor.result_partition_id)) / "data.arrow"


@pytest.mark.parametrize("remote", [False, True], ids=["local", "remote"])
def test_corrupt_data_file_raises_checksum_error_naming_the_partition(
    scenario: ShuffleScenario, remote: bool
) -> None:
    descriptors, _ = scenario.produce(make_batches(10_000), partitions=1, subpartitions=2)
    path = _data_file(scenario, descriptors[0])
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    environment = scenario.consumer if remote else scenario.producer
    with pytest.raises(ChecksumMismatchError) as raised:
        scenario.read(environment, descriptors, SubpartitionRange(0, 1))
    assert raised.value.partition_id == descriptors[0].result_partition_id
    assert str(descriptors[0].result_partition_id) in str(raised.value)


@pytest.mark.parametrize("remote", [False, True], ids=["local", "remote"])
def test_missing_data_file_raises_partition_not_found_with_the_ids(
    scenario: ShuffleScenario, remote: bool
) -> None:
    descriptors, _ = scenario.produce(make_batches(10_000), partitions=1, subpartitions=2)
    _data_file(scenario, descriptors[0]).unlink()
    environment = scenario.consumer if remote else scenario.producer
    with pytest.raises(PartitionNotFoundError) as raised:
        scenario.read(environment, descriptors, SubpartitionRange(0, 1))
    partition = descriptors[0].result_partition_id
    assert raised.value.partition_id == partition
    assert partition.partition_id.result_id in str(raised.value)
    assert partition.producer_attempt_id in str(raised.value)


@pytest.mark.parametrize("name", [b"../0/attempt", b"result/0/..", b"../../etc/0/passwd"])
def test_request_naming_a_path_outside_the_store_is_refused(
    scenario: ShuffleScenario, name: bytes
) -> None:
    with _connect(scenario) as sock:
        write_frame(sock, FrameType.REQUEST, struct.pack("!IIII?", 3, 0, 0, 1, False) + name)
        frame_type, payload = _next_frame(sock)
    assert frame_type is FrameType.ERROR
    _, code, message = decode_error(payload)
    assert isinstance(error_from_code(code, message, None), InvalidIdentifierError)
    assert ".." in message
    assert [p.name for p in Path(scenario.producer.store.url).iterdir()] == []  # type: ignore[attr-defined]


def test_oversize_frame_closes_only_that_connection(scenario: ShuffleScenario) -> None:
    descriptors, _ = scenario.produce(make_batches(1_000), partitions=1, subpartitions=1)
    with _connect(scenario) as sock:
        sock.sendall(struct.pack("!IB", MAX_FRAME + 1, FrameType.REQUEST))
        sock.settimeout(10)
        assert sock.recv(1) == b""  # the producer hung up
    table = scenario.read(scenario.consumer, descriptors, SubpartitionRange(0, 0))
    assert table.num_rows == 1_000


def test_unknown_frame_type_closes_the_connection(scenario: ShuffleScenario) -> None:
    with _connect(scenario) as sock:
        sock.sendall(struct.pack("!IB", 0, 99))
        sock.settimeout(10)
        assert sock.recv(1) == b""


def test_schema_frame_precedes_data_for_pipelined_batches(scenario: ShuffleScenario) -> None:
    batch = make_batches(10)[0]
    partition_type = ResultPartitionType.PIPELINED
    descriptor = scenario.partition_descriptor(
        0, partitions=1, subpartitions=1, partition_type=partition_type
    )
    shuffle_descriptor, writer = scenario.new_writer(descriptor)
    with writer:
        writer.write(batch, [0] * 10)
    with _connect(scenario) as sock:
        request = Request(
            1, shuffle_descriptor.result_partition_id, SubpartitionRange(0, 0), 4, True
        )
        write_frame(sock, FrameType.REQUEST, request.encode())
        frames = [_next_frame(sock)[0] for _ in range(3)]
    assert frames == [FrameType.SCHEMA, FrameType.BUFFER, FrameType.END]
