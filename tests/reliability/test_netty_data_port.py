"""The data port under bad input: credits honoured, departed consumers, corrupt or missing
files, hostile frames."""

from __future__ import annotations

import dataclasses
import os
import socket
import struct
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from netty_like import NettyShuffleEnvironment
from netty_like.client import CreditSettings, read_remote
from netty_like.partition_manager import ResultPartitionManager
from netty_like.protocol import (
    BufferHeader,
    FrameType,
    Request,
    decode_error,
    encode_credit,
    error_from_code,
    read_frame,
)
from netty_like.server import DataServer, NettyDataPortLimits
from shuffle_api import (
    AuthenticationError,
    ChecksumMismatchError,
    Configuration,
    IntermediateResultPartitionID,
    InvalidIdentifierError,
    PartitionNotFoundError,
    ResultPartitionID,
    ResultPartitionType,
    ShuffleDescriptor,
    ShuffleEnvironmentContext,
    SubpartitionRange,
    TransportError,
)
from shuffle_api.testing import ConformanceHarness, ShuffleScenario, make_batches
from shuffle_api.testing.harness import route
from shuffle_runtime.connections import ConnectionPool
from shuffle_runtime.format import partition_directory
from shuffle_runtime.sockets import open_handshake, write_frame
from shuffle_runtime.store import Store
from tests.eventually import eventually
from tests.refused_port import refused_port
from tests.tls_files import write_tls_files

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
        request = Request(
            7, (descriptors[0].result_partition_id,), SubpartitionRange(0, 0), 1, False
        )
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
            1, (shuffle_descriptor.result_partition_id,), SubpartitionRange(0, 0), 4, True
        )
        write_frame(sock, FrameType.REQUEST, request.encode())
        frames = [_next_frame(sock)[0] for _ in range(3)]
    assert frames == [FrameType.SCHEMA, FrameType.BUFFER, FrameType.END]


# --- a reader asks a producer once for all its partitions ------------------------------------


def _remote_reader(scenario: ShuffleScenario, **settings: object) -> NettyShuffleEnvironment:
    """A consumer that reads every partition of the producer over its data port."""
    config = scenario.harness.configuration.with_values(settings)
    environment = NettyShuffleEnvironment(
        ShuffleEnvironmentContext(config, host="127.0.0.1", secret=scenario.secret)
    )
    environment.start()
    return environment


def _served(scenario: ShuffleScenario) -> int:
    return _requests(scenario.producer)


def test_statistics_larger_than_a_frame_arrive_in_batches(scenario: ShuffleScenario) -> None:
    """Eight partitions of 8,000 subpartitions: their statistics take 1.5 MiB, more than a
    frame (1 MiB). Asked for in batches that fit, each is reported available with its
    statistics (not all lost with an oversize reply); availability alone is a byte each."""
    descriptors, statistics = scenario.produce(
        make_batches(4_000), partitions=8, subpartitions=8_000
    )
    job = scenario.job.job_id
    metrics = scenario.master.partitions_with_metrics(job).result(timeout=60)
    by_id = {m.shuffle_descriptor.result_partition_id: m for m in metrics}
    assert [by_id[d.result_partition_id].statistics for d in descriptors] == statistics
    held = scenario.master.partitions_with_metrics(job, statistics=False).result(timeout=60)
    assert len(held) == 8 and all(m.available for m in held)
    assert scenario.job.lost == []


def test_a_reader_asks_the_producer_once_for_its_partitions(scenario: ShuffleScenario) -> None:
    data = make_batches(6_000, batch_rows=500)
    descriptors, _ = scenario.produce(data, partitions=12, subpartitions=3)
    reader = _remote_reader(scenario, **{"netty-like.read-from-shared-store": False})
    try:
        for subpartition in range(3):
            expected = scenario.read(
                scenario.consumer, descriptors, SubpartitionRange.single(subpartition)
            )
            before = _served(scenario)
            table = scenario.read(reader, descriptors, SubpartitionRange.single(subpartition))
            assert _served(scenario) - before == 1
            assert sorted(table.column("row").to_pylist()) == sorted(
                expected.column("row").to_pylist()
            )
    finally:
        reader.close()


@pytest.mark.parametrize("in_flight", [1, 2])
def test_a_reader_asks_the_next_producers_ahead_within_its_budget(
    scenario: ShuffleScenario, tmp_path: Path, in_flight: int
) -> None:
    """Three producers of two partitions each: when the reader has its first rows from the
    first producer, the next ``in_flight - 1`` producers have been asked already, and no
    more; in the end each was asked once, and every row arrived."""
    producers = [scenario.producer]
    for number in (1, 2):
        config = scenario.harness.configuration.with_values(
            {"netty-like.storage.url": str(tmp_path / f"store-{number}")}
        )
        environment = NettyShuffleEnvironment(
            ShuffleEnvironmentContext(config, host="127.0.0.1", secret=scenario.secret)
        )
        environment.start()
        producers.append(environment)
    reader = _remote_reader(
        scenario,
        **{
            "netty-like.read-from-shared-store": False,
            "shuffle.read.sources-in-flight": in_flight,
        },
    )
    data = make_batches(6_000, batch_rows=500)
    try:
        descriptors = []
        for index, batch in enumerate(data[:6]):
            partition = scenario.partition_descriptor(index, partitions=6, subpartitions=1)
            producing = dataclasses.replace(scenario, producer=producers[index // 2])
            descriptor, writer = producing.new_writer(partition)
            with writer:
                writer.write(batch, route(batch, 1))
                writer.finish()
            descriptors.append(descriptor)
        with scenario.gate(reader, descriptors, SubpartitionRange(0, 0)) as gate:
            reading = iter(gate)
            rows = next(reading).column("row").to_pylist()
            # A request sent ahead is counted by its producer a moment later; then no more
            # come while the reader waits.
            ahead = [1, 1, 0] if in_flight == 2 else [1, 0, 0]
            eventually(
                lambda: [_requests(producer) for producer in producers] == ahead,
                f"producers asked {ahead} times",
            )
            time.sleep(0.3)
            assert [_requests(producer) for producer in producers] == ahead
            rows.extend(row for batch in reading for row in batch.column("row").to_pylist())
        assert [_requests(producer) for producer in producers] == [1, 1, 1]
        assert sorted(rows) == sorted(
            row for batch in data[:6] for row in batch.column("row").to_pylist()
        )
    finally:
        reader.close()
        for producer in producers[1:]:
            producer.close()


def test_a_producer_that_refuses_when_asked_ahead_is_asked_again_at_its_turn(
    scenario: ShuffleScenario, tmp_path: Path
) -> None:
    """The second producer serves all the channels it may when the reader asks it ahead, and
    refuses; by the reader's turn they are gone, and it answers."""
    config = scenario.harness.configuration.with_values(
        {"netty-like.storage.url": str(tmp_path / "store-b")}
    )
    second = NettyShuffleEnvironment(
        ShuffleEnvironmentContext(config, host="127.0.0.1", secret=scenario.secret)
    )
    second.start()
    reader = _remote_reader(scenario, **{"netty-like.read-from-shared-store": False})
    data = make_batches(4_000, batch_rows=1_000)
    holders: list[socket.socket] = []
    try:
        descriptors = []
        for index, batch in enumerate(data):
            partition = scenario.partition_descriptor(index, partitions=4, subpartitions=1)
            producer = scenario.producer if index < 2 else second
            descriptor, writer = dataclasses.replace(scenario, producer=producer).new_writer(
                partition
            )
            with writer:
                writer.write(batch, route(batch, 1))
                writer.finish()
            descriptors.append(descriptor)
        assert second.data_server is not None
        limits = second.data_server.limits
        never = ResultPartitionID(IntermediateResultPartitionID("never-written", 0), "attempt")
        for _ in range(limits.max_channels // limits.max_channels_per_connection):
            sock = socket.create_connection(("127.0.0.1", _port(second)), timeout=10)
            open_handshake(sock, scenario.secret, "the producer")
            holders.append(sock)
            for channel in range(limits.max_channels_per_connection):
                # Pipelined requests for a partition that never comes: each holds a channel.
                request = Request(channel, (never,), SubpartitionRange(0, 0), 1, True)
                write_frame(sock, FrameType.REQUEST, request.encode())
        server = second.data_server
        deadline = time.monotonic() + 10
        while server.request_count < limits.max_channels:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        with scenario.gate(reader, descriptors, SubpartitionRange(0, 0)) as gate:
            reading = iter(gate)
            rows = next(reading).column("row").to_pylist()  # the second one refused meanwhile
            for sock in holders:
                sock.close()
            while not server.take_channel():  # until the port has a channel free again
                assert time.monotonic() < deadline + 10
                time.sleep(0.05)
            server.return_channel()
            rows.extend(row for batch in reading for row in batch.column("row").to_pylist())
        assert sorted(rows) == sorted(
            row for batch in data for row in batch.column("row").to_pylist()
        )
    finally:
        for sock in holders:
            sock.close()
        reader.close()
        second.close()


def _requests(environment: object) -> int:
    assert isinstance(environment, NettyShuffleEnvironment)
    assert environment.data_server is not None
    return environment.data_server.request_count


def test_a_reader_that_pauses_in_a_batch_gets_every_row(tmp_path: Path) -> None:
    config = Configuration.load(
        {
            "netty-like.storage.url": str(tmp_path / "store"),
            "netty-like.sort-buffer.size": "64k",
            "netty-like.data-port.idle-timeout": 1.0,
        },
        environ={},
    )
    data = make_batches(200_000, batch_rows=5_000)
    expected = sorted(row for batch in data for row in batch.column("row").to_pylist())
    with ShuffleScenario.open(ConformanceHarness(config)) as opened:
        descriptors, _ = opened.produce(data, partitions=4, subpartitions=1)
        reader = _remote_reader(opened, **{"netty-like.read-from-shared-store": False})
        try:
            with opened.gate(reader, descriptors, SubpartitionRange(0, 0)) as gate:
                reading = iter(gate)
                rows = next(reading).column("row").to_pylist()
                # Longer than the idle timeout: credit holds the producer back, and a
                # channel waiting for credit is not idle.
                time.sleep(3.0)
                rows.extend(row for batch in reading for row in batch.column("row").to_pylist())
        finally:
            reader.close()
    assert sorted(rows) == expected


def test_a_reader_connects_again_before_it_gives_a_producer_up() -> None:
    # Refused throughout, as a producer that died.
    with refused_port() as port:
        settings = CreditSettings(
            initial_credit=1,
            max_credit=1,
            max_frame_size=MAX_FRAME,
            connect_timeout=5.0,
            connect_retries=2,
            connect_retry_wait=0.3,
        )
        partition = ResultPartitionID(IntermediateResultPartitionID("result", 0), "attempt")
        connections = ConnectionPool(b"secret")
        started = time.monotonic()
        try:
            with pytest.raises(TransportError, match="3 attempts"):
                list(
                    read_remote(
                        "127.0.0.1",
                        port,
                        [partition],
                        SubpartitionRange(0, 0),
                        pipelined=False,
                        settings=settings,
                        connections=connections,
                    )
                )
        finally:
            connections.close()
        assert time.monotonic() - started >= 0.6


# --- the handshake and the bounds on what a peer can make the data port hold ------------------


def _raw(scenario: ShuffleScenario) -> socket.socket:
    """A connection that has not passed the handshake."""
    return socket.create_connection(("127.0.0.1", _port(scenario.producer)), timeout=10)


def _rss_bytes() -> int:
    return int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def test_a_peer_without_the_secret_is_refused_and_reads_nothing(
    scenario: ShuffleScenario,
) -> None:
    descriptors, _ = scenario.produce(make_batches(1_000), partitions=1, subpartitions=1)
    with _raw(scenario) as sock, pytest.raises(AuthenticationError, match="refused"):
        open_handshake(sock, b"not the application's secret", "the producer")
    # Skipping the handshake: the first frame must be AUTH.
    with _raw(scenario) as sock:
        assert _next_frame(sock)[0] is FrameType.CHALLENGE
        request = Request(
            1, (descriptors[0].result_partition_id,), SubpartitionRange(0, 0), 4, False
        )
        write_frame(sock, FrameType.REQUEST, request.encode())
        frame_type, body = _next_frame(sock)
        assert frame_type is FrameType.ERROR
        _, code, message = decode_error(body)
        assert isinstance(error_from_code(code, message, None), AuthenticationError)
        assert sock.recv(1) == b""  # and hung up
    # The application's own consumers still read.
    table = scenario.read(scenario.consumer, descriptors, SubpartitionRange(0, 0))
    assert table.num_rows == 1_000


def test_a_consumer_with_another_secret_gets_an_authentication_error(
    scenario: ShuffleScenario,
) -> None:
    descriptors, _ = scenario.produce(make_batches(1_000), partitions=1, subpartitions=1)
    outsider = NettyShuffleEnvironment(
        ShuffleEnvironmentContext(
            # It sees the producer's store: made to read through the data port all the same.
            scenario.harness.configuration.with_values(
                {"netty-like.read-from-shared-store": False}
            ),
            host="127.0.0.1",
        )
    )
    with outsider, pytest.raises(AuthenticationError, match="secret"):
        scenario.read(outsider, descriptors, SubpartitionRange(0, 0))


def test_tls_data_ports_refuse_consumers_without_tls_or_trusting_another_authority(
    tmp_path: Path,
) -> None:
    files = write_tls_files(tmp_path / "tls")
    other = write_tls_files(tmp_path / "other")
    config = Configuration.load(
        {
            "netty-like.storage.url": str(tmp_path / "store"),
            "netty-like.read-from-shared-store": False,
            "netty-like.tls.cert-file": files.cert_file,
            "netty-like.tls.key-file": files.key_file,
            "netty-like.tls.ca-file": files.ca_file,
        },
        environ={},
    )
    with ShuffleScenario.open(ConformanceHarness(config)) as scenario:
        descriptors, _ = scenario.produce(make_batches(1_000), partitions=1, subpartitions=1)
        assert scenario.read(scenario.consumer, descriptors, SubpartitionRange(0, 0)).num_rows == (
            1_000
        )
        server = scenario.producer.data_server  # type: ignore[attr-defined]
        assert server.request_count == 1
        trusting_other = config.with_values({"netty-like.tls.ca-file": other.ca_file})
        with (
            scenario.environment(trusting_other) as outsider,
            pytest.raises(AuthenticationError, match="does not trust"),
        ):
            scenario.read(outsider, descriptors, SubpartitionRange(0, 0))
        with _raw(scenario) as sock:  # plaintext, speaking first
            sock.sendall(b"\x00" * 64)
            assert sock.recv(1) == b""
        assert server.request_count == 1
    # A consumer with TLS, of a producer without it.
    plaintext = config.with_values(
        {f"netty-like.tls.{name}": "" for name in ("cert-file", "key-file", "ca-file")}
    )
    with ShuffleScenario.open(ConformanceHarness(plaintext)) as scenario:
        descriptors, _ = scenario.produce(make_batches(1_000), partitions=1, subpartitions=1)
        with (
            scenario.environment(config) as secure,
            pytest.raises(AuthenticationError, match="TLS handshake"),
        ):
            scenario.read(secure, descriptors, SubpartitionRange(0, 0))


def test_huge_frame_headers_from_unauthenticated_peers_hold_no_memory(
    scenario: ShuffleScenario,
) -> None:
    before = _rss_bytes()
    peers = [_raw(scenario) for _ in range(200)]
    try:
        for sock in peers:
            sock.sendall(struct.pack("!IB", 64 << 20, FrameType.AUTH))
        for sock in peers:
            sock.settimeout(10)
            # The challenge, the refusal, then the hang-up: nothing was read past the header.
            assert _next_frame(sock)[0] is FrameType.CHALLENGE
            assert _next_frame(sock)[0] is FrameType.ERROR
            assert sock.recv(1) == b""
    finally:
        for sock in peers:
            sock.close()
    assert _rss_bytes() - before < 64 << 20


def test_requests_beyond_the_channel_cap_are_refused_with_bounded_threads(
    scenario: ShuffleScenario,
) -> None:
    threads_before = threading.active_count()
    partition = ResultPartitionID(IntermediateResultPartitionID("never-written", 0), "attempt")
    with _connect(scenario) as sock:
        for channel in range(2_000):
            # Pipelined requests for a partition that never comes: each would wait 30 s.
            request = Request(channel, (partition,), SubpartitionRange(0, 0), 1, True)
            write_frame(sock, FrameType.REQUEST, request.encode())
        refused = 0
        deadline = time.monotonic() + 20
        while refused < 2_000 - 64 and time.monotonic() < deadline:
            frame_type, body = _next_frame(sock)
            assert frame_type is FrameType.ERROR
            refused += 1
            assert "channels open at once" in decode_error(body)[2]
        assert refused == 2_000 - 64
        assert threading.active_count() - threads_before <= 64 + 2
    # Closing the connection ends its waiting channels.
    deadline = time.monotonic() + 10
    while threading.active_count() > threads_before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert threading.active_count() <= threads_before


def test_idle_and_half_sent_connections_time_out(tmp_path: Path) -> None:
    secret = b"s" * 32
    manager = ResultPartitionManager(Store(str(tmp_path)), request_timeout=1.0)
    limits = NettyDataPortLimits(max_frame_size=MAX_FRAME, handshake_timeout=0.5, idle_timeout=0.5)
    server = DataServer(manager, "127.0.0.1", 0, secret=secret, limits=limits)
    port = server.start()
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=10) as silent:
            assert _next_frame(silent)[0] is FrameType.CHALLENGE
            started = time.monotonic()
            assert _next_frame(silent)[0] is FrameType.ERROR  # no AUTH in time
            assert silent.recv(1) == b""
            assert time.monotonic() - started < 5
        with socket.create_connection(("127.0.0.1", port), timeout=10) as idle:
            open_handshake(idle, secret, "the data port")
            assert idle.recv(1) == b""  # closed after half a second of nothing
        with socket.create_connection(("127.0.0.1", port), timeout=10) as half:
            open_handshake(half, secret, "the data port")
            half.sendall(struct.pack("!IB", 100, FrameType.STATUS) + b"x" * 10)
            assert half.recv(1) == b""
        eventually(lambda: server.connection_count == 0, "both connections closed", timeout=5)
    finally:
        server.stop()
