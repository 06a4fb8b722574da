"""Push and fetch throughput of one ``external_shuffle`` worker over 127.0.0.1, beside raw
grpcio streaming of the same bytes in the same run.

Setup: one :class:`~external_shuffle.local_cluster.LocalCluster` (coordinator + 1 worker as
daemon processes, the worker's store in a temp directory, ``store_shared=False`` so every read
goes to the worker), a shuffle master in this process, and ``max(--writers)`` client processes
(started once with ``spawn``, each with its own environments and its own interpreter, so the GIL
of one writer does not slow another). Arrow record batches (int64 ``key``, float64 ``value``, a
~20-byte string ``text``; ``--megabytes`` of them) are generated once and written to an IPC file
that every client loads into memory before any timing. The subpartition of every row (a cheap
hash of ``key``) is computed before timing too: it is the engine's work.

For each codec (``--codecs``) and each number of writers W (``--writers``), ``--repeat`` times
(in the order push encoded, raw push, raw push into a file, writer alone, push, fetch, fetch
over gRPC, raw fetch, raw fetch from a file, store read: each raw phase right after the one it
is compared with; every timed write to disk starts after ``os.sync()``, so none pays for the
dirty pages another left):

* **push**: W clients at once each write the whole dataset as one partition of
  ``--subpartitions`` subpartitions through ``ExternalShuffleEnvironment``'s writer (split by
  subpartition, Arrow IPC encoding, checksums, ``Worker.PushData`` client stream of
  ``external-shuffle.client.chunk-size`` messages, ``CommitPartition``). Timed from a common
  start instant until the last ``finish()`` returns. Bytes: the partitions' data files as the
  worker committed them (``manifest.data_bytes``: exactly the bytes pushed).
* **push (encoded)**: the same, with the writer's work done beforehand (untimed, kept in
  memory as the writes it made to its data file): W clients at once replay those writes
  through the push sink a writer uses (``ExternalShuffleEnvironment.partition_sink``: chunks,
  ``Worker.PushData``, ``CommitPartition``). This is the transport the raw push compares with:
  the same bytes, already made. Bytes: the same data files.
* **fetch**: W clients at once each read one of those partitions (all subpartitions) through an
  input gate with ``external-shuffle.client.read-from-store = false`` (over the worker's data
  port: a plain socket the worker sends each run into with sendfile(2); checksum
  verification, IPC decoding); each batch's rows are counted as it arrives and checked after
  the clock stops. Nothing more is done with the batches, as the
  raw client does nothing with its messages: the checksums the fetch verifies cover every
  byte, and the store read below checks the values of the same partitions. No batch is
  kept, as the raw fetch keeps no message: kept, every message would need fresh memory,
  which the raw client never pays for. Bytes: the runs read (the partitions'
  ``PartitionStatistics`` total: exactly the bytes the worker streams).
* **fetch over gRPC**: the same, with ``external-shuffle.client.use-data-port = false``
  (``Worker.FetchData`` server stream, one message per run): what a client gets where only
  the gRPC port is reachable, or with TLS.
* **raw push / raw fetch**: the same W client processes stream the same byte counts to a minimal
  grpcio server in its own process (no pyshuffle code: a generic handler, bytes passthrough
  serializers, the same thread pool size and message limits as the daemon): client-streaming
  messages of the same size (the server only counts them), and server-streaming pre-built
  messages of that size back (the client only counts them). pyshuffle's fetch sends each run in
  one message, since the client takes up to ``max-message-size`` (a run is about
  ``sort-buffer.size / subpartitions``: 4 MiB and a little more here). The raw fetch keeps the
  push's message size, where raw grpcio is fastest (8 and 16 MB messages were slower).
* **raw push into a file**: the raw push, with the raw server writing each message to a new
  file (unbuffered, as the worker writes its data files) in a directory beside the worker's
  store, on the same file system; the files are deleted after the round, as the worker's
  partitions are released after theirs. This is raw grpcio plus the one thing a shuffle
  service cannot leave out, storing the bytes, shown as its own % of the raw push: a
  reference for what storing costs, not a strict bound (how much a write costs depends on
  the state of the page cache, which differs from round to round).
* **breakdown** (no transport, not part of the comparison): **writer alone**, the same writer
  (``SortMergePartitionWriter``, same options) into a sink that discards the bytes, and
  **store read**, the same partitions read straight from the worker's store directory with
  ``PartitionFileReader`` (checksums and decoding, no gRPC), with the rows read and their
  sum of ``value`` checked.

MB/s are 10**6 wire bytes per second (with a compressing codec, compressed bytes: raw streams
the same number). Every figure is the median of ``--repeat`` repetitions. The goals stated by
the issue are checked on the transport: ``fetch_ratio`` (the fetch over the raw fetch) >= 0.85
(``fetch_over_grpc_ratio`` beside it) and ``push_ratio_vs_storing`` (the encoded push over the
raw push into a file) >= 0.90; the push with the writer is shown beside it (raw grpcio streams
bytes that already exist, and making them is the writer's cost, shown as "writer alone").
``fetch_ratio_ceiling`` is raw grpcio's own ratio when it reads each message from a file (raw
from a file over the raw fetch): the most any gRPC service that serves stored partitions
reaches, before it verifies or decodes anything. CPU seconds of the client processes and of
the serving process (the worker daemon, or the raw server) are recorded too, read from
``/proc`` (Linux): on a machine with few cores every side competes for them, so CPU seconds
per GB are what the throughput ratios follow.

Run from the repository root::

    python benchmarks/external_throughput.py                    # default: about 5 minutes
    python benchmarks/external_throughput.py --megabytes 16 --repeat 1
    python benchmarks/external_throughput.py --codecs none --writers 1,4
    python benchmarks/external_throughput.py \
        --client-option external-shuffle.client.sort-buffer.size=16m

Results are printed and saved as JSON (``--output``, default
``benchmarks/results/external_throughput.json``).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import multiprocessing
import multiprocessing.context
import os
import shutil
import statistics
import struct
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import google.protobuf
import grpc
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from common import (
    BATCH_ROWS,
    DISTINCT_KEYS,
    MB,
    ROW_BYTES,
    Indexes,
    codec_list,
    format_rows,
    key_value,
    machine,
    positive,
    random_batches,
    save_results,
    settle,
    subpartition_indexes,
)

import external_shuffle.client.descriptor  # noqa: F401 (registers the descriptor kind for deserialize)
from external_shuffle.allocator import keep_message_buffers
from external_shuffle.client.environment import ExternalShuffleEnvironment
from external_shuffle.local_cluster import LocalCluster
from external_shuffle.options import (
    MAX_MESSAGE_SIZE,
    PUSH_CHUNK_SIZE,
    SORT_BUFFER_SIZE,
    USE_DATA_PORT,
)
from shuffle_api import (
    LOCAL_ONLY_PORT,
    Configuration,
    InputGateDeploymentDescriptor,
    IntermediateResultPartitionID,
    PartitionDescriptor,
    ProducerDescriptor,
    RecordingJobContext,
    ResultPartitionDeploymentDescriptor,
    ResultPartitionID,
    ResultPartitionType,
    ShuffleDescriptor,
    ShuffleEnvironment,
    ShuffleEnvironmentContext,
    ShuffleIOOwner,
    ShuffleMaster,
    ShuffleMasterContext,
    SubpartitionRange,
    load_shuffle_service_factory,
    new_id,
)
from shuffle_api.options import COMPRESSION_AUTO_BANDWIDTH, COMPRESSION_CODEC, TARGET_BATCH_SIZE
from shuffle_api.serialization import deserialize, serialize
from shuffle_runtime.format import (
    PartitionFileReader,
    PartitionSink,
    SortMergePartitionWriter,
    write_all,
)
from shuffle_runtime.store import Store

SEED = 20240607
# The goals, for 1 and 2 writers: the fetch over raw grpcio's fetch, and the encoded
# push over raw grpcio storing what it receives (storing is what a push must do).
GOALS = {"fetch_ratio": 0.85, "push_ratio_vs_storing": 0.90}
HANDLER_THREADS = 64  # as the daemon's gRPC server (external_shuffle.daemon.main)
MESSAGE_OVERHEAD = 64 << 10  # as ExternalShuffleEnvironment: room for a push message's fields
START_LEAD = 0.1  # seconds between sending a round's commands and its common start instant
CALL_TIMEOUT = 600.0
DEFAULT_OUTPUT = Path(__file__).resolve().parent / "results" / "external_throughput.json"

RAW_SERVICE = "pyshuffle.bench.RawStream"
RAW_PUSH = f"/{RAW_SERVICE}/Push"
RAW_PUSH_TO_FILE = f"/{RAW_SERVICE}/PushToFile"
RAW_FETCH = f"/{RAW_SERVICE}/Fetch"
RAW_FETCH_FROM_FILE = f"/{RAW_SERVICE}/FetchFromFile"
FETCH_SOURCE_FILE = "fetch-source.data"
_COUNT = struct.Struct("<Q")  # raw push answer: bytes received
_FETCH_REQUEST = struct.Struct("<QQ")  # raw fetch request: bytes to send, message size

PHASES = (
    "push",
    "raw_push",
    "raw_push_to_file",
    "fetch",
    "fetch_over_grpc",
    "raw_fetch",
    "raw_fetch_from_file",
    "push_encoded",
    "write_only",
    "store_read",
)
CPU_PHASES = (
    "push",
    "push_encoded",
    "raw_push",
    "raw_push_to_file",
    "fetch",
    "fetch_over_grpc",
    "raw_fetch",
    "raw_fetch_from_file",
)


# --- data ------------------------------------------------------------------------------------


def generate(megabytes: float, seed: int = SEED) -> list[pa.RecordBatch]:
    """About ``megabytes`` MB of uncompressed Arrow data."""
    return random_batches(max(1, int(megabytes * MB / ROW_BYTES)), seed)


def save(batches: Sequence[pa.RecordBatch], path: Path) -> None:
    with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_file(sink, batches[0].schema) as writer:
        for batch in batches:
            writer.write_batch(batch)


def value_sum(batches: Sequence[pa.RecordBatch]) -> float:
    total = 0.0
    for batch in batches:
        part = pc.sum(batch.column(1)).as_py()
        total += 0.0 if part is None else float(part)
    return total


@dataclass(slots=True)
class Tally:
    """What a reader checks as batches go by: their rows and the sum of ``value``. It keeps no
    batch, so its memory is reused as the raw fetch's messages are."""

    rows: int = 0
    value_sum: float = 0.0

    def add(self, batch: pa.RecordBatch) -> None:
        self.rows += batch.num_rows
        self.value_sum += value_sum([batch])


@dataclass(frozen=True, slots=True)
class Workload:
    """A client's copy of the data, in memory, with every row's subpartition."""

    batches: list[pa.RecordBatch]
    indexes: list[Indexes]
    rows: int
    nbytes: int
    value_sum: float

    @classmethod
    def load(cls, path: str, subpartitions: int) -> Workload:
        reader = pa.ipc.open_file(pa.py_buffer(Path(path).read_bytes()))
        batches = [reader.get_batch(i) for i in range(reader.num_record_batches)]
        return cls(
            batches=batches,
            indexes=[
                subpartition_indexes(batch.column(0).to_numpy(), subpartitions) for batch in batches
            ],
            rows=sum(int(batch.num_rows) for batch in batches),
            nbytes=sum(int(batch.nbytes) for batch in batches),
            value_sum=value_sum(batches),
        )


# --- CPU time of a process (Linux /proc) -----------------------------------------------------


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds of a process and all its threads, or None off Linux."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2 :].split()  # after "pid (comm) "
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def find_daemon_pid(config: Path) -> int | None:
    """The pid of the daemon started with ``--config config`` (LocalCluster keeps its own)."""
    wanted = str(config).encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"external_shuffle.daemon.main" in argv and wanted in argv:
            return int(entry.name)
    return None


# --- the raw grpcio baseline: a server process with no pyshuffle code --------------------------


def message_options(max_message_size: int) -> list[tuple[str, int]]:
    return [
        ("grpc.max_send_message_length", max_message_size),
        ("grpc.max_receive_message_length", max_message_size),
    ]


def message_source(size: int) -> bytes:
    """Incompressible bytes to cut messages from (grpc does not compress; the content is moot)."""
    return np.random.default_rng(size).bytes(size)


def raw_messages(total: int, full: bytes, last: bytes) -> Iterator[bytes]:
    """``total`` bytes as messages ``full`` (pre-built), then ``last`` (the remainder)."""
    for _ in range(total // len(full)):
        yield full
    if last:
        yield last


def raw_server_main(conn: Connection, max_message_size: int, chunk_size: int, store: Path) -> None:
    """Serve ``Push`` (client stream, counted and discarded), ``PushToFile`` (the same, each
    message written to a new file under ``store`` as the worker writes its data files) and
    ``Fetch`` (a server stream of pre-built messages) and ``FetchFromFile`` (the same, each
    message read from a file with ``os.pread``, as the worker reads its data files). On
    ``conn``: ``"clear"`` deletes the files, a number writes the file ``FetchFromFile`` reads
    (of that size, the other files deleted), both answered when done; ``"stop"`` stops.
    With malloc set as in the worker daemon and the clients (``external_shuffle.allocator``):
    the same process setup."""
    keep_message_buffers(max_message_size)
    sources = {chunk_size: message_source(chunk_size)}
    lock = threading.Lock()

    def source(size: int) -> bytes:
        with lock:
            if size not in sources:
                sources[size] = message_source(size)
            return sources[size]

    def push(requests: Iterator[bytes], context: grpc.ServicerContext) -> bytes:
        received = 0
        for message in requests:
            received += len(message)
        return _COUNT.pack(received)

    def push_to_file(requests: Iterator[bytes], context: grpc.ServicerContext) -> bytes:
        received = 0
        with open(store / f"{new_id()}.data", "wb", buffering=0) as file:  # as Store's files
            for message in requests:
                write_all(file, message)
                received += len(message)
        return _COUNT.pack(received)

    def fetch(request: bytes, context: grpc.ServicerContext) -> Iterator[bytes]:
        total, size = _FETCH_REQUEST.unpack(request)
        full = source(size)
        yield from raw_messages(total, full, full[: total % size])

    def fetch_from_file(request: bytes, context: grpc.ServicerContext) -> Iterator[bytes]:
        total, size = _FETCH_REQUEST.unpack(request)
        with open(store / FETCH_SOURCE_FILE, "rb", buffering=0) as file:  # as the worker reads
            for offset in range(0, total, size):
                yield os.pread(file.fileno(), min(size, total - offset), offset)

    handler = grpc.method_handlers_generic_handler(
        RAW_SERVICE,
        {
            "Push": grpc.stream_unary_rpc_method_handler(push),
            "PushToFile": grpc.stream_unary_rpc_method_handler(push_to_file),
            "Fetch": grpc.unary_stream_rpc_method_handler(fetch),
            "FetchFromFile": grpc.unary_stream_rpc_method_handler(fetch_from_file),
        },
    )
    server = grpc.server(
        ThreadPoolExecutor(HANDLER_THREADS, thread_name_prefix="raw-rpc"),
        handlers=[handler],
        options=message_options(max_message_size),
    )
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    conn.send(port)
    while (command := conn.recv()) != "stop":
        for path in store.iterdir():
            path.unlink()
        if command != "clear":  # the size of the file FetchFromFile reads
            with open(store / FETCH_SOURCE_FILE, "wb", buffering=0) as file:
                write_all(file, message_source(int(command)))
        conn.send("done")
    server.stop(None).wait()


class RawServer:
    """The raw server's process (:func:`raw_server_main`) and the pipe that drives it."""

    def __init__(
        self,
        context: multiprocessing.context.SpawnContext,
        max_message_size: int,
        chunk_size: int,
        store: Path,
    ) -> None:
        self._connection, child_end = context.Pipe()
        self._process = context.Process(
            target=raw_server_main,
            args=(child_end, max_message_size, chunk_size, store),
            name="bench-raw-server",
            daemon=True,
        )
        self._process.start()
        child_end.close()
        self.target = f"127.0.0.1:{self._connection.recv()}"
        assert self._process.pid is not None
        self.pid: int = self._process.pid

    def clear_store(self) -> None:
        """Delete the files ``PushToFile`` wrote (as the worker's partitions are released)."""
        self._connection.send("clear")
        self._connection.recv()

    def prepare_fetch_source(self, nbytes: int) -> None:
        """Write the file ``FetchFromFile`` reads (``nbytes``, in the page cache after)."""
        self._connection.send(str(nbytes))
        self._connection.recv()

    def stop(self) -> None:
        self._connection.send("stop")
        self._process.join(timeout=30)
        if self._process.is_alive():
            self._process.terminate()
        self._connection.close()


# --- client processes --------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Push:
    """Write the workload as the partition of ``deployment`` (a serialized
    ResultPartitionDeploymentDescriptor)."""

    codec: str
    deployment: bytes
    start_at: float = 0.0  # the round's start instant, set by Clients.round


@dataclass(frozen=True, slots=True)
class Fetch:
    """Read everything of ``gate`` (a serialized InputGateDeploymentDescriptor)."""

    codec: str
    gate: bytes
    over_grpc: bool = False  # not over the worker's data port
    start_at: float = 0.0  # the round's start instant, set by Clients.round


@dataclass(frozen=True, slots=True)
class WriteOnly:
    """Write the workload with the same writer as :class:`Push`, into a sink that discards
    the bytes: the writer's own cost (split, IPC encoding, checksums), no transport."""

    codec: str
    deployment: bytes
    start_at: float = 0.0  # the round's start instant, set by Clients.round


@dataclass(frozen=True, slots=True)
class Encode:
    """Write the workload as the partition of ``deployment`` with the same writer as
    :class:`Push`, keeping the data file's writes, the index and the manifest in memory (for
    :class:`PushEncoded`; its time is not reported)."""

    codec: str
    deployment: bytes
    start_at: float = 0.0  # the round's start instant, set by Clients.round


@dataclass(frozen=True, slots=True)
class PushEncoded:
    """Push what :class:`Encode` kept for ``deployment``, write by write, through the push
    sink a writer of that partition uses: the transport alone (chunking, framing, the
    ``PushData`` stream, ``CommitPartition``), the writer's encoding done beforehand."""

    codec: str
    deployment: bytes
    start_at: float = 0.0  # the round's start instant, set by Clients.round


@dataclass(frozen=True, slots=True)
class StoreRead:
    """Read everything of ``gate`` straight from the worker's store (a local directory here):
    the reader's own cost (checksums, IPC decoding), no transport."""

    store_url: str
    gate: bytes
    start_at: float = 0.0  # the round's start instant, set by Clients.round


@dataclass(frozen=True, slots=True)
class RawPush:
    nbytes: int
    message_size: int
    start_at: float = 0.0  # the round's start instant, set by Clients.round
    to_file: bool = False  # PushToFile: the raw server writes what it receives to a file


@dataclass(frozen=True, slots=True)
class RawFetch:
    nbytes: int
    message_size: int
    from_file: bool = False
    start_at: float = 0.0  # the round's start instant, set by Clients.round


Command = Push | Fetch | RawPush | RawFetch | WriteOnly | StoreRead | Encode | PushEncoded


@dataclass(frozen=True, slots=True)
class Ready:
    pid: int
    rows: int
    nbytes: int


@dataclass(frozen=True, slots=True)
class Done:
    """A command's outcome: when it started and ended (``time.monotonic``, which is the same
    clock in every process on Linux), the client's CPU seconds, and what it moved."""

    started: float
    ended: float
    cpu: float
    nbytes: int
    rows: int


@dataclass(frozen=True, slots=True)
class Failed:
    error: str


def wait_until(instant: float) -> None:
    delay = instant - time.monotonic()
    if delay > 0:
        time.sleep(delay)


class Discard:
    """A data file that goes nowhere; it counts the bytes."""

    def __init__(self) -> None:
        self.written = 0

    def write(self, data: bytes | memoryview, /) -> int:
        self.written += len(data)
        return len(data)

    def flush(self) -> None:
        pass

    def close(self) -> None:
        pass


class Keep(Discard):
    """A data file kept in memory as the writes that made it."""

    def __init__(self) -> None:
        super().__init__()
        self.writes: list[bytes] = []

    def write(self, data: bytes | memoryview, /) -> int:
        self.writes.append(bytes(data))
        return super().write(data)


class DiscardSink(PartitionSink):
    """Where a writer's partition goes nowhere: the data file counted (a :class:`Discard`) or
    kept as its writes (a :class:`Keep`), the index and manifest held."""

    def __init__(self, partition: ResultPartitionID, data: Discard | None = None) -> None:
        self._partition = partition
        self.data = Discard() if data is None else data
        self.index = self.manifest = b""

    @property
    def partition(self) -> ResultPartitionID:
        return self._partition

    @property
    def where(self) -> str:
        return "nowhere"

    def open_data(self) -> Discard:
        return self.data

    def commit(self, index: bytes, manifest: bytes) -> None:
        self.index, self.manifest = index, manifest

    def abort(self) -> None:
        pass


@dataclass(frozen=True, slots=True)
class ClientSpec:
    """What every client process is started with."""

    config: dict[str, object]  # pyshuffle options, the codec aside
    data_path: str
    subpartitions: int
    raw_target: str
    max_message_size: int


class Client:
    """What runs in a client process: one environment per codec, a raw channel, the data."""

    def __init__(self, index: int, spec: ClientSpec) -> None:
        self.index = index
        self.config = spec.config
        self.workload = Workload.load(spec.data_path, spec.subpartitions)
        self._environments: dict[tuple[str, bool], ShuffleEnvironment] = {}
        self._channel = grpc.insecure_channel(
            spec.raw_target, options=message_options(spec.max_message_size)
        )
        self._raw_push: grpc.StreamUnaryMultiCallable[bytes, bytes] = self._channel.stream_unary(
            RAW_PUSH
        )
        self._raw_push_to_file: grpc.StreamUnaryMultiCallable[bytes, bytes] = (
            self._channel.stream_unary(RAW_PUSH_TO_FILE)
        )
        self._raw_fetch: grpc.UnaryStreamMultiCallable[bytes, bytes] = self._channel.unary_stream(
            RAW_FETCH
        )
        self._raw_fetch_from_file: grpc.UnaryStreamMultiCallable[bytes, bytes] = (
            self._channel.unary_stream(RAW_FETCH_FROM_FILE)
        )
        self._sources: dict[int, bytes] = {}
        self._encoded: dict[ResultPartitionID, tuple[DiscardSink, Keep]] = {}

    def configuration(self, codec: str, over_grpc: bool = False) -> Configuration:
        return Configuration.load(
            {**self.config, COMPRESSION_CODEC.key: codec, USE_DATA_PORT.key: not over_grpc},
            environ={},
        )

    def environment(self, codec: str, over_grpc: bool = False) -> ShuffleEnvironment:
        environment = self._environments.get((codec, over_grpc))
        if environment is None:
            config = self.configuration(codec, over_grpc)
            factory = load_shuffle_service_factory(config)
            name = f"client-{self.index}-{codec}" + ("-grpc" if over_grpc else "")
            environment = factory.create_shuffle_environment(
                ShuffleEnvironmentContext(config, resource_id=name, host="127.0.0.1")
            )
            environment.start()
            self._environments[(codec, over_grpc)] = environment
        return environment

    def source(self, size: int) -> bytes:
        if size not in self._sources:
            self._sources[size] = message_source(size)
        return self._sources[size]

    def run(self, command: Command) -> Done:
        match command:
            case Push():
                return self.push(command)
            case Fetch():
                return self.fetch(command)
            case RawPush():
                return self.raw_push(command)
            case RawFetch():
                return self.raw_fetch(command)
            case WriteOnly():
                return self.write_only(command)
            case Encode():
                return self.encode(command)
            case PushEncoded():
                return self.push_encoded(command)
            case StoreRead():
                return self.store_read(command)

    def push(self, command: Push) -> Done:
        deployment = deserialize(command.deployment)
        assert isinstance(deployment, ResultPartitionDeploymentDescriptor)
        environment = self.environment(command.codec)
        owner = ShuffleIOOwner(
            f"writer-{self.index}", deployment.result_partition_id.producer_attempt_id
        )
        wait_until(command.start_at)
        started, cpu = time.monotonic(), time.process_time()
        [writer] = environment.create_result_partition_writers(owner, [deployment])
        with writer:
            for batch, indexes in zip(self.workload.batches, self.workload.indexes, strict=True):
                writer.write(batch, indexes)
            statistics = writer.finish()
        ended, cpu = time.monotonic(), time.process_time() - cpu
        if statistics.total_rows != self.workload.rows:
            raise AssertionError(f"wrote {statistics.total_rows} rows of {self.workload.rows}")
        return Done(started, ended, cpu, statistics.total_bytes, statistics.total_rows)

    def fetch(self, command: Fetch) -> Done:
        descriptor = deserialize(command.gate)
        assert isinstance(descriptor, InputGateDeploymentDescriptor)
        environment = self.environment(command.codec, command.over_grpc)
        owner = ShuffleIOOwner(f"reader-{self.index}", "reader-" + new_id())
        rows = 0
        wait_until(command.start_at)
        started, cpu = time.monotonic(), time.process_time()
        [gate] = environment.create_input_gates(owner, [descriptor])
        with gate:
            for batch in gate:
                rows += batch.num_rows
        ended, cpu = time.monotonic(), time.process_time() - cpu
        self.check_rows(rows)
        return Done(started, ended, cpu, 0, rows)

    def check_rows(self, rows: int) -> None:
        if rows != self.workload.rows:
            raise AssertionError(f"read {rows} rows, {self.workload.rows} were written")

    def check(self, read: Tally) -> None:
        """Fail unless every row came back with the right values."""
        self.check_rows(read.rows)
        expected = self.workload.value_sum
        if abs(read.value_sum - expected) / max(abs(expected), 1e-300) > 1e-6:
            raise AssertionError(f"sum of value read {read.value_sum!r}, wrote {expected!r}")

    def write_only(self, command: WriteOnly) -> Done:
        deployment = deserialize(command.deployment)
        assert isinstance(deployment, ResultPartitionDeploymentDescriptor)
        sink = DiscardSink(deployment.result_partition_id)
        wait_until(command.start_at)
        started, cpu = time.monotonic(), time.process_time()
        rows = self.write_workload(sink, command.codec, deployment)
        ended, cpu = time.monotonic(), time.process_time() - cpu
        return Done(started, ended, cpu, sink.data.written, rows)

    def write_workload(
        self, sink: DiscardSink, codec: str, deployment: ResultPartitionDeploymentDescriptor
    ) -> int:
        """The writer of :class:`Push`, with its options, into ``sink``; the rows written."""
        config = self.configuration(codec)
        writer = SortMergePartitionWriter(
            sink,
            deployment.number_of_subpartitions,
            codec=codec,
            memory_budget=config.get(SORT_BUFFER_SIZE),
            target_batch_bytes=config.get(TARGET_BATCH_SIZE),
            auto_bandwidth=config.get(COMPRESSION_AUTO_BANDWIDTH),
        )
        with writer:
            for batch, indexes in zip(self.workload.batches, self.workload.indexes, strict=True):
                writer.write(batch, indexes)
            statistics = writer.finish()
        if statistics.total_rows != self.workload.rows:
            raise AssertionError(f"wrote {statistics.total_rows} rows of {self.workload.rows}")
        return statistics.total_rows

    def encode(self, command: Encode) -> Done:
        deployment = deserialize(command.deployment)
        assert isinstance(deployment, ResultPartitionDeploymentDescriptor)
        kept = Keep()
        sink = DiscardSink(deployment.result_partition_id, kept)
        wait_until(command.start_at)
        started, cpu = time.monotonic(), time.process_time()
        rows = self.write_workload(sink, command.codec, deployment)
        ended, cpu = time.monotonic(), time.process_time() - cpu
        self._encoded[deployment.result_partition_id] = (sink, kept)
        return Done(started, ended, cpu, kept.written, rows)

    def push_encoded(self, command: PushEncoded) -> Done:
        deployment = deserialize(command.deployment)
        assert isinstance(deployment, ResultPartitionDeploymentDescriptor)
        environment = self.environment(command.codec)
        assert isinstance(environment, ExternalShuffleEnvironment)
        encoded, kept = self._encoded.pop(deployment.result_partition_id)
        wait_until(command.start_at)
        started, cpu = time.monotonic(), time.process_time()
        sink = environment.partition_sink(deployment)
        data = sink.open_data()
        for piece in kept.writes:
            data.write(piece)
        data.close()
        sink.commit(encoded.index, encoded.manifest)
        ended, cpu = time.monotonic(), time.process_time() - cpu
        return Done(started, ended, cpu, kept.written, self.workload.rows)

    def store_read(self, command: StoreRead) -> Done:
        descriptor = deserialize(command.gate)
        assert isinstance(descriptor, InputGateDeploymentDescriptor)
        [partition] = [d.result_partition_id for d in descriptor.shuffle_descriptors]
        read = Tally()
        wait_until(command.start_at)
        started, cpu = time.monotonic(), time.process_time()
        reader = PartitionFileReader(Store(command.store_url), partition)
        for batch in reader.read(descriptor.consumed_subpartitions):
            read.add(batch)
        ended, cpu = time.monotonic(), time.process_time() - cpu
        self.check(read)
        return Done(started, ended, cpu, 0, read.rows)

    def raw_push(self, command: RawPush) -> Done:
        full = self.source(command.message_size)
        last = full[: command.nbytes % command.message_size]
        wait_until(command.start_at)
        started, cpu = time.monotonic(), time.process_time()
        call = self._raw_push_to_file if command.to_file else self._raw_push
        answer: bytes = call(raw_messages(command.nbytes, full, last), timeout=CALL_TIMEOUT)
        ended, cpu = time.monotonic(), time.process_time() - cpu
        (received,) = _COUNT.unpack(answer)
        if received != command.nbytes:
            raise AssertionError(f"raw server received {received} bytes of {command.nbytes}")
        return Done(started, ended, cpu, received, 0)

    def raw_fetch(self, command: RawFetch) -> Done:
        request = _FETCH_REQUEST.pack(command.nbytes, command.message_size)
        received = 0
        wait_until(command.start_at)
        started, cpu = time.monotonic(), time.process_time()
        call = self._raw_fetch_from_file if command.from_file else self._raw_fetch
        for message in call(request, timeout=CALL_TIMEOUT):
            received += len(message)
        ended, cpu = time.monotonic(), time.process_time() - cpu
        if received != command.nbytes:
            raise AssertionError(f"raw fetch got {received} bytes of {command.nbytes}")
        return Done(started, ended, cpu, received, 0)

    def close(self) -> None:
        for environment in self._environments.values():
            environment.close()
        self._channel.close()


def client_main(conn: Connection, index: int, spec: ClientSpec) -> None:
    """A client process: answer each command on ``conn`` until ``None`` arrives."""
    try:
        client = Client(index, spec)
    except Exception:
        conn.send(Failed(traceback.format_exc()))
        return
    conn.send(Ready(os.getpid(), client.workload.rows, client.workload.nbytes))
    try:
        while (command := conn.recv()) is not None:
            try:
                conn.send(client.run(command))
            except Exception:
                conn.send(Failed(f"client {index}: {traceback.format_exc()}"))
    finally:
        client.close()


class Clients:
    """The client processes, driven in rounds: one command each, all starting together."""

    def __init__(
        self, context: multiprocessing.context.SpawnContext, count: int, spec: ClientSpec
    ) -> None:
        self._connections: list[Connection] = []
        self._processes: list[multiprocessing.context.SpawnProcess] = []
        for index in range(count):
            ours, theirs = context.Pipe()
            process = context.Process(
                target=client_main,
                args=(theirs, index, spec),
                name=f"bench-client-{index}",
                daemon=True,
            )
            process.start()
            theirs.close()
            self._connections.append(ours)
            self._processes.append(process)
        self.pids: list[int] = []
        for connection in self._connections:
            ready = connection.recv()
            if isinstance(ready, Failed):
                raise RuntimeError(f"a client process did not start:\n{ready.error}")
            assert isinstance(ready, Ready)
            self.pids.append(ready.pid)

    def round(self, commands: Sequence[Command], server_pid: int | None) -> Round:
        """Send command i to client i; all start at the same instant. The round lasts from that
        instant until the last client is done."""
        if len(commands) > len(self._connections):
            raise ValueError(f"{len(commands)} commands for {len(self._connections)} clients")
        server_cpu = None if server_pid is None else cpu_seconds(server_pid)
        start = start_at()
        for connection, command in zip(self._connections, commands, strict=False):
            connection.send(replace(command, start_at=start))
        replies = [connection.recv() for connection in self._connections[: len(commands)]]
        failures = [reply.error for reply in replies if isinstance(reply, Failed)]
        if failures:
            raise RuntimeError("\n".join(failures))
        done = [reply for reply in replies if isinstance(reply, Done)]
        server_after = None if server_pid is None else cpu_seconds(server_pid)
        return Round(
            seconds=max(reply.ended for reply in done) - start,
            start_skew=max(reply.started for reply in done) - start,
            client_cpu=sum(reply.cpu for reply in done),
            server_cpu=None
            if server_cpu is None or server_after is None
            else server_after - server_cpu,
            done=done,
        )

    def close(self) -> None:
        for connection in self._connections:
            with contextlib.suppress(OSError):
                connection.send(None)
        for process in self._processes:
            process.join(timeout=30)
            if process.is_alive():
                process.terminate()
                process.join(timeout=5)
        for connection in self._connections:
            connection.close()


@dataclass(frozen=True, slots=True)
class Round:
    seconds: float
    start_skew: float
    client_cpu: float
    server_cpu: float | None
    done: list[Done]


def start_at() -> float:
    return time.monotonic() + START_LEAD


# --- measurement -------------------------------------------------------------------------------


@dataclass(slots=True)
class Cell:
    """One codec and number of writers: every repetition of every phase."""

    codec: str
    writers: int
    seconds: dict[str, list[float]] = field(default_factory=lambda: {p: [] for p in PHASES})
    nbytes: dict[str, list[int]] = field(default_factory=lambda: {p: [] for p in PHASES})
    client_cpu: dict[str, list[float]] = field(default_factory=lambda: {p: [] for p in PHASES})
    server_cpu: dict[str, list[float | None]] = field(
        default_factory=lambda: {p: [] for p in PHASES}
    )
    start_skew: dict[str, list[float]] = field(default_factory=lambda: {p: [] for p in PHASES})
    uncompressed_bytes: int = 0

    def add(self, phase: str, result: Round, nbytes: int) -> None:
        self.seconds[phase].append(result.seconds)
        self.nbytes[phase].append(nbytes)
        self.client_cpu[phase].append(result.client_cpu)
        self.server_cpu[phase].append(result.server_cpu)
        self.start_skew[phase].append(result.start_skew)

    def mb_per_s(self, phase: str) -> list[float]:
        return [
            nbytes / seconds / MB
            for nbytes, seconds in zip(self.nbytes[phase], self.seconds[phase], strict=True)
        ]

    def median_mb_per_s(self, phase: str) -> float:
        return float(statistics.median(self.mb_per_s(phase)))

    def ratio(self, phase: str) -> float:
        """Of raw: the fetch is compared with the raw fetch, every push (the raw push into a
        file too) with the raw push."""
        raw = "raw_fetch" if phase.startswith("fetch") else "raw_push"
        return self.median_mb_per_s(phase) / self.median_mb_per_s(raw)

    def cpu_per_gb(self, phase: str, side: str) -> float | None:
        """Median CPU seconds per 10**9 wire bytes of the clients or of the serving process."""
        values = self.client_cpu[phase] if side == "client" else self.server_cpu[phase]
        per_gb = [
            value / nbytes * 1e9
            for value, nbytes in zip(values, self.nbytes[phase], strict=True)
            if value is not None and nbytes
        ]
        return float(statistics.median(per_gb)) if per_gb else None

    def summary(self) -> dict[str, Any]:
        phases = {
            phase: {
                "seconds": self.seconds[phase],
                "bytes": self.nbytes[phase],
                "mb_per_s": self.mb_per_s(phase),
                "median_mb_per_s": self.median_mb_per_s(phase),
                "client_cpu_seconds": self.client_cpu[phase],
                "server_cpu_seconds": self.server_cpu[phase],
                "client_cpu_seconds_per_gb": self.cpu_per_gb(phase, "client"),
                "server_cpu_seconds_per_gb": self.cpu_per_gb(phase, "server"),
                "start_skew_seconds": self.start_skew[phase],
            }
            for phase in PHASES
        }
        ratios = {
            phase: self.ratio(phase)
            for phase in ("push", "push_encoded", "raw_push_to_file", "fetch", "fetch_over_grpc")
        }
        # The goals compare the transport: the encoded push carries the same bytes, already
        # made, as raw grpcio; the push with the writer is beside it (its encoding is the
        # writer's cost, shown as "writer alone").
        storing = self.median_mb_per_s("raw_push_to_file")
        figures = {
            "fetch_ratio": ratios["fetch"],
            "fetch_over_grpc_ratio": ratios["fetch_over_grpc"],
            # The fetch over raw grpcio reading each message from a file, as any service that
            # stores partitions must: a reference for what reading costs.
            "fetch_ratio_vs_reading": self.median_mb_per_s("fetch")
            / self.median_mb_per_s("raw_fetch_from_file"),
            # Raw grpcio's own fetch_ratio when it reads each message from a file: the most a
            # service that serves stored partitions can reach, before verifying or decoding.
            "fetch_ratio_ceiling": self.median_mb_per_s("raw_fetch_from_file")
            / self.median_mb_per_s("raw_fetch"),
            "push_ratio_vs_storing": self.median_mb_per_s("push_encoded") / storing,
            "push_with_writer_ratio_vs_storing": self.median_mb_per_s("push") / storing,
        }
        return {
            "codec": self.codec,
            "writers": self.writers,
            "uncompressed_bytes_per_writer": self.uncompressed_bytes,
            "phases": phases,
            "ratios": ratios,
            **figures,
            "goal_met": {key: figures[key] >= goal for key, goal in GOALS.items()},
        }


class Bench:
    """The cluster, the raw server, the master and the clients of one run."""

    def __init__(
        self,
        args: Namespace,
        cluster: LocalCluster,
        clients: Clients,
        raw_server: RawServer,
        chunk_size: int,
    ) -> None:
        self.args = args
        self.cluster = cluster
        self.clients = clients
        self.raw_server = raw_server
        self.chunk_size = chunk_size
        self.worker_pid = find_daemon_pid(cluster.directory / "worker-0.toml")
        self.worker_store = Store(str(cluster.worker_store(0)))
        config = Configuration.load(cluster.client_config(), environ={})
        factory = load_shuffle_service_factory(config)
        self.master: ShuffleMaster = factory.create_shuffle_master(ShuffleMasterContext(config))
        self.master.start()
        self.job = RecordingJobContext("bench-" + new_id())
        self.master.register_job(self.job)

    def close(self) -> None:
        self.master.unregister_job(self.job.job_id)
        self.master.close()
        if self.job.lost:
            raise AssertionError(f"the service reported lost partitions: {self.job.lost}")

    def register(self, writers: int) -> list[tuple[PartitionDescriptor, ShuffleDescriptor]]:
        result_id = "result-" + new_id()
        registered = []
        for index in range(writers):
            partition = PartitionDescriptor(
                result_id,
                writers,
                IntermediateResultPartitionID(result_id, index),
                ResultPartitionType.BLOCKING,
                self.args.subpartitions,
            )
            producer = ProducerDescriptor(
                f"client-{index}", "attempt-" + new_id(), "127.0.0.1", LOCAL_ONLY_PORT
            )
            descriptor = self.master.register_partition_with_producer(
                self.job.job_id, partition, producer
            ).result(timeout=60)
            registered.append((partition, descriptor))
        return registered

    def repetition(self, cell: Cell) -> None:
        """Every phase once with ``cell.writers`` clients; each raw phase right after the
        pyshuffle phase it is compared with, so both meet the machine in the same state."""
        writers, codec = cell.writers, cell.codec
        registered = self.register(writers)
        registered_encoded = self.register(writers)
        encoded = [
            serialize(ResultPartitionDeploymentDescriptor(p, d)) for p, d in registered_encoded
        ]
        self.clients.round([Encode(codec, deployment) for deployment in encoded], None)
        settle()
        push_encoded = self.clients.round(
            [PushEncoded(codec, deployment) for deployment in encoded], self.worker_pid
        )
        pushed = [done.nbytes for done in push_encoded.done]  # the data files' sizes
        cell.add("push_encoded", push_encoded, sum(pushed))
        raw_push = self.clients.round(
            [RawPush(nbytes, self.chunk_size) for nbytes in pushed], self.raw_server.pid
        )
        cell.add("raw_push", raw_push, sum(pushed))
        settle()
        raw_push_to_file = self.clients.round(
            [RawPush(nbytes, self.chunk_size, to_file=True) for nbytes in pushed],
            self.raw_server.pid,
        )
        cell.add("raw_push_to_file", raw_push_to_file, sum(pushed))
        self.raw_server.clear_store()
        write_only = self.clients.round(
            [
                WriteOnly(codec, serialize(ResultPartitionDeploymentDescriptor(p, d)))
                for p, d in registered
            ],
            None,
        )
        settle()
        push = self.clients.round(
            [
                Push(codec, serialize(ResultPartitionDeploymentDescriptor(p, d)))
                for p, d in registered
            ],
            self.worker_pid,
        )
        manifests = [
            PartitionFileReader(self.worker_store, d.result_partition_id).manifest
            for _, d in registered
        ]
        runs = [manifest.statistics.total_bytes for manifest in manifests]
        if [done.nbytes for done in push.done] != runs:
            raise AssertionError("the writers' statistics differ from the committed manifests")
        if [manifest.data_bytes for manifest in manifests] != pushed:
            raise AssertionError("the encoded push moved other bytes than the writer's push")
        if [done.nbytes for done in write_only.done] != pushed:
            raise AssertionError("the writer made other bytes when it did not push them")
        cell.add("push", push, sum(pushed))
        cell.add("write_only", write_only, sum(pushed))

        everything = SubpartitionRange(0, self.args.subpartitions - 1)
        gates = [
            serialize(
                InputGateDeploymentDescriptor(
                    d.result_partition_id.partition_id.result_id,
                    ResultPartitionType.BLOCKING,
                    everything,
                    (d,),
                )
            )
            for _, d in registered
        ]
        fetch = self.clients.round([Fetch(codec, gate) for gate in gates], self.worker_pid)
        cell.add("fetch", fetch, sum(runs))
        fetch_over_grpc = self.clients.round(
            [Fetch(codec, gate, over_grpc=True) for gate in gates], self.worker_pid
        )
        cell.add("fetch_over_grpc", fetch_over_grpc, sum(runs))
        raw_fetch = self.clients.round(
            [RawFetch(nbytes, self.chunk_size) for nbytes in runs], self.raw_server.pid
        )
        cell.add("raw_fetch", raw_fetch, sum(runs))
        self.raw_server.prepare_fetch_source(max(runs))
        raw_fetch_from_file = self.clients.round(
            [RawFetch(nbytes, self.chunk_size, from_file=True) for nbytes in runs],
            self.raw_server.pid,
        )
        cell.add("raw_fetch_from_file", raw_fetch_from_file, sum(runs))
        self.raw_server.clear_store()
        store_read = self.clients.round(
            [StoreRead(self.worker_store.url, gate) for gate in gates], None
        )
        cell.add("store_read", store_read, sum(runs))
        for _, descriptor in registered + registered_encoded:
            self.master.release_partition_externally(descriptor)
        print(
            f"  {codec} x{writers}: push {push.seconds:.2f} s (encoded"
            f" {push_encoded.seconds:.2f} s, raw {raw_push.seconds:.2f} s, raw into a file"
            f" {raw_push_to_file.seconds:.2f} s, writer alone"
            f" {write_only.seconds:.2f} s), fetch {fetch.seconds:.2f} s (over gRPC"
            f" {fetch_over_grpc.seconds:.2f} s, raw"
            f" {raw_fetch.seconds:.2f} s, raw from a file {raw_fetch_from_file.seconds:.2f} s,"
            f" store read {store_read.seconds:.2f} s);"
            f" {sum(pushed) / MB:.0f} MB pushed, {sum(runs) / MB:.0f} MB fetched",
            file=sys.stderr,
            flush=True,
        )


# --- report ------------------------------------------------------------------------------------


def render_table(summaries: Sequence[dict[str, Any]]) -> str:
    headers = (
        "codec",
        "writers",
        "push MB/s (encoded / with writer)",
        "raw push MB/s (discarded / into a file)",
        "push % of raw (encoded / with writer / raw into a file)",
        "push % of raw into a file (encoded / with writer)",
        "fetch MB/s (data port / gRPC)",
        "raw fetch MB/s (pre-built / from a file)",
        "fetch % of raw (pre-built / from a file / over gRPC)",
        "ceiling: raw from a file % of pre-built",
        "goals (push >= {push_ratio_vs_storing:.0%}, fetch >= {fetch_ratio:.0%})".format(**GOALS),
    )
    rows: list[tuple[str, ...]] = []
    for summary in summaries:
        phases, ratios, met = summary["phases"], summary["ratios"], summary["goal_met"]
        missed = [key for key in GOALS if not met[key]]
        rows.append(
            (
                summary["codec"],
                str(summary["writers"]),
                f"{phases['push_encoded']['median_mb_per_s']:.0f}"
                f" / {phases['push']['median_mb_per_s']:.0f}",
                f"{phases['raw_push']['median_mb_per_s']:.0f}"
                f" / {phases['raw_push_to_file']['median_mb_per_s']:.0f}",
                f"{ratios['push_encoded']:.0%} / {ratios['push']:.0%}"
                f" / {ratios['raw_push_to_file']:.0%}",
                f"{summary['push_ratio_vs_storing']:.0%}"
                f" / {summary['push_with_writer_ratio_vs_storing']:.0%}",
                f"{phases['fetch']['median_mb_per_s']:.0f}"
                f" / {phases['fetch_over_grpc']['median_mb_per_s']:.0f}",
                f"{phases['raw_fetch']['median_mb_per_s']:.0f}"
                f" / {phases['raw_fetch_from_file']['median_mb_per_s']:.0f}",
                f"{ratios['fetch']:.0%} / {summary['fetch_ratio_vs_reading']:.0%}"
                f" / {ratios['fetch_over_grpc']:.0%}",
                f"{summary['fetch_ratio_ceiling']:.0%}",
                "met" if not missed else "missed (" + ", ".join(missed) + ")",
            )
        )
    return format_rows(headers, rows)


def render_breakdown(summaries: Sequence[dict[str, Any]]) -> str:
    """Where the time goes: each side alone without transport, and CPU seconds per GB moved
    (all clients together / the serving process: worker daemon or raw server)."""
    headers = (
        "codec",
        "writers",
        "writer alone MB/s",
        "store read MB/s",
        *(f"CPU s/GB {phase.replace('_', ' ')}" for phase in CPU_PHASES),
    )

    def cpu(value: float | None) -> str:
        return "?" if value is None else f"{value:.1f}"

    rows = [
        (
            summary["codec"],
            str(summary["writers"]),
            f"{summary['phases']['write_only']['median_mb_per_s']:.0f}",
            f"{summary['phases']['store_read']['median_mb_per_s']:.0f}",
            *(
                cpu(summary["phases"][phase]["client_cpu_seconds_per_gb"])
                + " / "
                + cpu(summary["phases"][phase]["server_cpu_seconds_per_gb"])
                for phase in CPU_PHASES
            ),
        )
        for summary in summaries
    ]
    return format_rows(headers, rows)


# --- entry point -------------------------------------------------------------------------------


class Namespace(argparse.Namespace):
    megabytes: float
    writers: list[int]
    subpartitions: int
    repeat: int
    codecs: list[str]
    chunk_size: int
    max_message_size: int
    client_options: list[tuple[str, str]]
    worker_options: list[tuple[str, str]]
    directory: Path | None
    output: Path


def positive_float(text: str) -> float:
    value = float(text)
    if value <= 0:
        raise argparse.ArgumentTypeError("must be > 0")
    return value


def int_list(text: str) -> list[int]:
    try:
        values = [positive(part.strip()) for part in text.split(",") if part.strip()]
    except ValueError as error:
        raise argparse.ArgumentTypeError("a comma-separated list of positive integers") from error
    if not values:
        raise argparse.ArgumentTypeError("a comma-separated list of positive integers")
    return values


def parse_args(argv: list[str] | None) -> Namespace:
    parser = argparse.ArgumentParser(
        description="external_shuffle push/fetch throughput of one worker vs raw grpcio.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument(
        "--megabytes",
        type=positive_float,
        default=400.0,  # 100 MB made rounds of 0.1-0.3 s, short enough for noise to rule
        help="uncompressed Arrow data each writer pushes (10**6 bytes)",
    )
    parser.add_argument(
        "--writers", type=int_list, default=[1, 2, 4], help="concurrent writers (and readers)"
    )
    parser.add_argument("--subpartitions", type=positive, default=16, help="per partition")
    parser.add_argument("--repeat", type=positive, default=3, help="repetitions (median reported)")
    parser.add_argument(
        "--codecs",
        type=codec_list,
        default=["none", "lz4"],
        help="e.g. none,lz4,zstd",
    )
    parser.add_argument(
        "--chunk-size",
        type=positive,
        default=PUSH_CHUNK_SIZE.default,
        help="bytes per pushed or fetched message (external-shuffle.client.chunk-size)",
    )
    parser.add_argument(
        "--max-message-size",
        type=positive,
        default=MAX_MESSAGE_SIZE.default,
        help="gRPC message limit on every channel and server (external-shuffle.max-message-size)",
    )
    parser.add_argument(
        "--client-option",
        dest="client_options",
        metavar="KEY=VALUE",
        type=key_value,
        action="append",
        default=[],
        help="a pyshuffle option of the clients, e.g. external-shuffle.client.sort-buffer.size=16m",
    )
    parser.add_argument(
        "--worker-option",
        dest="worker_options",
        metavar="KEY=VALUE",
        type=key_value,
        action="append",
        default=[],
        help="an option of the worker daemon, e.g. external-shuffle.worker.memory-budget=512m",
    )
    parser.add_argument(
        "--directory",
        type=Path,
        default=None,
        help="where the cluster and the data live (default: a fresh temp directory, deleted)",
    )
    parser.add_argument("--output", type=Path, default=DEFAULT_OUTPUT, help="JSON results file")
    args = parser.parse_args(argv, namespace=Namespace())
    if "auto" in args.codecs:
        # Its phases compare bytes written apart (encoded, written alone, pushed): auto may
        # choose differently each time. benchmarks/codec_choice.py says what it chooses.
        parser.error("give the codec auto chooses, not auto: each phase writes anew")
    if args.max_message_size <= MESSAGE_OVERHEAD:
        parser.error(f"--max-message-size must exceed {MESSAGE_OVERHEAD}")
    return args


def run(args: Namespace, directory: Path) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    started = time.perf_counter()
    batches = generate(args.megabytes)
    data_path = directory / "data.arrow"
    save(batches, data_path)
    data = {
        "rows": sum(int(batch.num_rows) for batch in batches),
        "batches": len(batches),
        "bytes": sum(int(batch.nbytes) for batch in batches),
    }
    del batches
    print(
        f"generated {data['rows']:,} rows in {data['batches']} batches,"
        f" {data['bytes'] / MB:.1f} MB per writer ({time.perf_counter() - started:.1f} s)",
        file=sys.stderr,
    )
    # What pyshuffle puts in a message (ExternalShuffleEnvironment): the raw baseline's size too.
    chunk_size = min(args.chunk_size, args.max_message_size - MESSAGE_OVERHEAD)
    shared = {
        "external-shuffle.client.chunk-size": chunk_size,
        "external-shuffle.max-message-size": args.max_message_size,
    }
    context = multiprocessing.get_context("spawn")
    raw_store = directory / "raw-store"  # beside the worker's store: the same file system
    raw_store.mkdir()
    raw_server = RawServer(context, args.max_message_size, chunk_size, raw_store)
    try:
        worker_settings = {**shared, **dict(args.worker_options)}
        with LocalCluster(
            directory / "cluster", workers=1, store_shared=False, settings=worker_settings
        ) as cluster:
            config = cluster.client_config(
                **shared,
                **dict(args.client_options),
                **{"external-shuffle.client.read-from-store": False},
            )
            spec = ClientSpec(
                config, str(data_path), args.subpartitions, raw_server.target, args.max_message_size
            )
            clients = Clients(context, max(args.writers), spec)
            try:
                bench = Bench(args, cluster, clients, raw_server, chunk_size)
                cells: list[Cell] = []
                try:
                    for codec in args.codecs:
                        for writers in args.writers:
                            cell = Cell(codec, writers, uncompressed_bytes=data["bytes"])
                            for _ in range(args.repeat):
                                bench.repetition(cell)
                            cells.append(cell)
                finally:
                    bench.close()
            finally:
                clients.close()
    finally:
        raw_server.stop()
    data["chunk_size"] = chunk_size
    data["worker_pid_found"] = bench.worker_pid is not None
    return [cell.summary() for cell in cells], data


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    temporary = None
    if args.directory is None:
        temporary = Path(tempfile.mkdtemp(prefix="pyshuffle-external-bench-"))
    directory = args.directory or temporary
    assert directory is not None
    directory.mkdir(parents=True, exist_ok=True)
    environment = machine(
        grpcio=grpc.__version__,
        protobuf=google.protobuf.__version__,
        pyarrow=pa.__version__,
        numpy=np.__version__,
    )
    try:
        summaries, data = run(args, directory)
    finally:
        if temporary is not None:
            shutil.rmtree(temporary, ignore_errors=True)

    print()
    print(
        f"one worker over 127.0.0.1; each writer pushes {data['bytes'] / MB:.1f} MB of Arrow data"
        f" ({data['rows']:,} rows) as one partition of {args.subpartitions} subpartitions;"
        f" {data['chunk_size']:,}-byte messages; median of {args.repeat};"
        f" MB/s = 10^6 wire bytes per second"
    )
    print(render_table(summaries))
    print()
    print(
        "Breakdown: the writer into a discarding sink and a read straight from the worker's"
        " store (no transport);\nCPU seconds per GB moved, all clients / serving process"
        " (worker daemon or raw server):"
    )
    print(render_breakdown(summaries))

    document = {
        "benchmark": "external_throughput",
        "timestamp": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "parameters": {
            "megabytes": args.megabytes,
            "writers": args.writers,
            "subpartitions": args.subpartitions,
            "repeat": args.repeat,
            "codecs": args.codecs,
            "chunk_size": args.chunk_size,
            "effective_chunk_size": data["chunk_size"],
            "max_message_size": args.max_message_size,
            "client_options": dict(args.client_options),
            "worker_options": dict(args.worker_options),
            "batch_rows": BATCH_ROWS,
            "distinct_keys": DISTINCT_KEYS,
            "seed": SEED,
            "clients": "one spawned process per writer/reader",
            "raw_server_threads": HANDLER_THREADS,
        },
        "data": data,
        "environment": environment,
        "load_average_after": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
        "goals": GOALS,
        "results": summaries,
    }
    save_results(args.output, document)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
