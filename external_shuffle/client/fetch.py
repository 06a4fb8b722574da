"""Fetching a partition's runs from a worker: over its data port (see ``data_port``), or over
gRPC. Either gives the manifest, then each run whole, unverified: the gate verifies and
decodes."""

from __future__ import annotations

import functools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import grpc
import pyarrow as pa
from google.protobuf.message import DecodeError

from external_shuffle.wire.channels import translate_rpc_error
from external_shuffle.wire.data_frames import (
    END,
    FAILED,
    FETCH,
    FETCH_BATCH,
    MANIFEST,
    RUN,
    RUN_HEADER,
)
from external_shuffle.wire.errors import error_from_pb
from external_shuffle.wire.framing import fetch_data_call
from external_shuffle.wire.messages import WorkerAddress
from external_shuffle.wire.stubs import pb
from shuffle_api import ResultPartitionID, ShuffleError, TransportError
from shuffle_runtime.connections import Connection, ConnectionPool, StaleConnectionError
from shuffle_runtime.format import PartitionManifest
from shuffle_runtime.gate import END_OF_PARTITION
from shuffle_runtime.sockets import FrameReader, write_frame

__all__ = [
    "DataPortUnreachableError",
    "FetchedRun",
    "Received",
    "fetch_over_data_port",
    "fetch_over_grpc",
]


@dataclass(frozen=True, slots=True)
class FetchedRun:
    data: pa.Buffer
    checksum: int
    """xxh3-64 of ``data``, as the worker's index holds it."""


class DataPortUnreachableError(TransportError):
    """A worker's data port could not be connected to, or refused the connection before the
    request was sent (too busy): nothing was asked or read."""


Received = PartitionManifest | FetchedRun
_CONNECT_TIMEOUT = 5.0
# Decoded manifests kept per process (a reducer's next task fetches the same map outputs),
# each of at most _CACHED_MANIFEST_BYTES: at most 32 MiB of manifests.
_CACHED_MANIFESTS = 2048
_CACHED_MANIFEST_BYTES = 16 << 10


def _manifest(data: bytes, what: str, partition: ResultPartitionID) -> PartitionManifest:
    """The manifest a worker sent before a partition's runs (no statistics): a fetch of a
    small block would otherwise spend more on decoding it (JSON, base64, the Arrow schema)
    than on the block."""
    if len(data) <= _CACHED_MANIFEST_BYTES:
        try:
            return _decoded_manifest(data, partition)
        except ShuffleError:
            pass  # not cached: decoded again below, for an error that says what was fetched
    return PartitionManifest.from_json(data, what, partition, statistics=False)


@functools.lru_cache(maxsize=_CACHED_MANIFESTS)
def _decoded_manifest(data: bytes, partition: ResultPartitionID) -> PartitionManifest:
    return PartitionManifest.from_json(data, "a fetched manifest", partition, statistics=False)


def fetch_over_data_port(
    worker: WorkerAddress,
    fetches: Sequence[tuple[pb.FetchDataRequest, ResultPartitionID]],
    *,
    connections: ConnectionPool,
    timeout: float,
    max_frame_size: int,
) -> Iterator[Received | None]:
    """Every partition of ``fetches`` (at most ``MAX_BATCH``), in order, in one request:
    each one's manifest and runs, then :data:`END_OF_PARTITION`. On a connection of
    ``connections`` (kept for the next request to this worker). ``timeout``: for each read
    (a worker that stops sending); connecting and the handshake get at most a few seconds, as
    gRPC is there to fall back on."""
    address = f"{worker.host}:{worker.data_port}"
    asked = fetches[0][1] if len(fetches) == 1 else f"{len(fetches)} partitions"
    what = f"fetch of {asked} from worker {worker.target}"
    if len(fetches) == 1:
        frame_type, body = FETCH, fetches[0][0].SerializeToString()
    else:
        batch = pb.FetchBatchRequest(fetches=[request for request, _ in fetches])
        frame_type, body = FETCH_BATCH, batch.SerializeToString()

    def fetch(connection: Connection) -> Iterator[Received | None]:
        sock = connection.sock
        reading = what
        try:
            sock.settimeout(timeout)
            write_frame(sock, frame_type, body)
            frames = FrameReader(sock)
            for _, partition in fetches:
                reading = f"fetch of {partition} from worker {worker.target}"
                yield from _receive(frames, max_frame_size, reading, partition)
                yield END_OF_PARTITION
            frames.check_drained()
        except ShuffleError:
            raise  # some are OSErrors too (an AuthenticationError is a PermissionError)
        except OSError as error:
            raise TransportError(
                f"{reading} over the data port {address} failed: {error}"
            ) from error

    def connect(fresh: bool = False) -> Connection:
        try:
            return connections.connect(
                worker.host, worker.data_port, timeout=min(timeout, _CONNECT_TIMEOUT), fresh=fresh
            )
        except ShuffleError as error:  # before OSError: an AuthenticationError is one too
            # Busy, gone, or not a data port of ours (a stale port): nothing was asked, and
            # gRPC, with the same token, serves or says what is wrong.
            raise DataPortUnreachableError(f"{what}: {error}") from error
        except OSError as error:
            raise DataPortUnreachableError(
                f"{what}: cannot connect to the data port {address}: {error}"
            ) from error

    yield from connections.exchange(
        connect(), run=fetch, reconnect=functools.partial(connect, fresh=True)
    )


def _receive(
    frames: FrameReader, max_frame_size: int, what: str, partition: ResultPartitionID
) -> Iterator[Received]:
    manifest: PartitionManifest | None = None
    while True:
        frame = frames.read_frame(max_frame_size)
        if frame is None and manifest is None:
            raise StaleConnectionError(f"{what}: the worker hung up before answering")
        if frame is None:
            raise TransportError(f"{what}: the worker hung up before the end")
        frame_type, body = frame
        if frame_type == MANIFEST and manifest is None:
            manifest = _manifest(body, what, partition)
            yield manifest
        elif frame_type == RUN and manifest is not None and len(body) == RUN_HEADER.size:
            length, checksum = RUN_HEADER.unpack(body)
            if length > manifest.data_bytes:
                raise TransportError(
                    f"{what}: a run of {length} bytes announced, in {manifest.data_bytes} bytes"
                    " of data"
                )
            data = pa.allocate_buffer(length)
            frames.receive_into(memoryview(data))
            yield FetchedRun(data, checksum)
        elif frame_type == END and manifest is not None:
            return
        elif frame_type == FAILED:
            try:
                reported = pb.DataPortError.FromString(body)
            except DecodeError as error:
                raise TransportError(f"{what}: an error report does not decode: {error}") from None
            raise error_from_pb(reported, what, partition)
        else:
            raise TransportError(f"{what}: unexpected frame of type {frame_type}")


def fetch_over_grpc(
    channel: grpc.Channel, request: pb.FetchDataRequest, what: str, partition: ResultPartitionID
) -> Iterator[Received]:
    stream = fetch_data_call(channel)(request)
    pieces: list[memoryview] = []
    try:
        for chunk in stream:
            message = chunk.header
            if message.manifest:
                yield _manifest(message.manifest, what, partition)
                continue
            pieces.append(chunk.data)
            if not message.end_of_run:
                continue
            # A run in one message is decoded where it arrived, with no copy.
            data = pa.py_buffer(pieces[0] if len(pieces) == 1 else b"".join(pieces))
            pieces = []
            yield FetchedRun(data, message.run_checksum)
    except grpc.RpcError as error:
        raise translate_rpc_error(error, what, partition) from error
    finally:
        stream.cancel()
