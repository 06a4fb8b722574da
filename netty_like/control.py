"""Control requests to a data port: which partitions it holds, release, hand over a
partition (an executor's writers to its host), shut a host down."""

from __future__ import annotations

import ssl
import threading
from collections.abc import Callable, Sequence
from typing import TypeVar

from netty_like.protocol import (
    FrameType,
    HostedState,
    decode_error,
    decode_held,
    decode_statuses,
    encode_hosted,
    encode_partitions,
    error_from_code,
    read_frame,
)
from shuffle_api import (
    PartitionStatistics,
    ResultPartitionID,
    ShuffleError,
    TransportError,
)
from shuffle_runtime.sockets import open_connection, write_frame

__all__ = ["ControlConnection"]

# Partitions named in one STATUS or RELEASE frame: keeps each frame far below the request
# limit of the data port (8 MiB) whatever the ids' lengths.
_BATCH = 10_000

T = TypeVar("T")


class ControlConnection:
    """One authenticated connection for control requests, answered in order (thread-safe);
    ``tls``, ``server_name``: as :func:`shuffle_runtime.sockets.open_connection` takes them."""

    def __init__(
        self,
        host: str,
        port: int,
        secret: bytes,
        *,
        timeout: float,
        max_frame_size: int,
        tls: ssl.SSLContext | None = None,
        server_name: str | None = None,
    ) -> None:
        self.address = f"{host}:{port}"
        self._max_frame_size = max_frame_size
        self._lock = threading.Lock()
        try:
            self._sock = open_connection(
                host, port, secret=secret, timeout=timeout, tls=tls, server_name=server_name
            )
        except ShuffleError:
            raise  # before OSError: an AuthenticationError is one too
        except OSError as error:
            raise TransportError(
                f"cannot connect to the data port {self.address}: {error}"
            ) from error

    def _call(self, frame_type: FrameType, body: bytes, answer: FrameType) -> memoryview:
        with self._lock:
            try:
                write_frame(self._sock, frame_type, body)
                frame = read_frame(self._sock, self._max_frame_size)
            except OSError as error:
                raise TransportError(
                    f"{frame_type.name} to the data port {self.address} failed: {error}"
                ) from error
        if frame is None:
            raise TransportError(f"the data port {self.address} closed the connection")
        got, reply = frame
        if got is FrameType.ERROR:
            _, code, message = decode_error(reply)
            raise error_from_code(code, f"data port {self.address}: {message}", None)
        if got is not answer:
            raise TransportError(
                f"the data port {self.address} answered {got.name} to {frame_type.name}"
            )
        return reply

    def statuses(
        self, partitions: Sequence[ResultPartitionID], subpartitions: int
    ) -> list[PartitionStatistics | None]:
        """Each partition's statistics if the data port holds it, else ``None``. A reply
        holds 24 bytes per subpartition of each (``subpartitions``: the most any has), so
        the partitions are asked for in batches whose replies fit in half a frame."""
        per_partition = 3 * 8 * subpartitions + 64
        most = max(1, min(_BATCH, self._max_frame_size // 2 // per_partition))
        return self._each(
            FrameType.STATUS, FrameType.STATUS_REPLY, decode_statuses, partitions, most
        )

    def held(self, partitions: Sequence[ResultPartitionID]) -> list[bool]:
        """Whether the data port holds each partition (a byte each: no statistics)."""
        return self._each(FrameType.HELD, FrameType.HELD_REPLY, decode_held, partitions, _BATCH)

    def _each(
        self,
        frame_type: FrameType,
        answer: FrameType,
        decode: Callable[[memoryview], list[T]],
        partitions: Sequence[ResultPartitionID],
        most: int,
    ) -> list[T]:
        """One answer per partition, asked for ``most`` partitions at a time."""
        answers: list[T] = []
        for start in range(0, len(partitions), most):
            batch = partitions[start : start + most]
            decoded = decode(self._call(frame_type, encode_partitions(batch), answer))
            if len(decoded) != len(batch):
                raise TransportError(
                    f"the data port {self.address} answered {len(decoded)} to"
                    f" {frame_type.name} of {len(batch)} partitions"
                )
            answers += decoded
        return answers

    def release(self, partitions: Sequence[ResultPartitionID]) -> None:
        for start in range(0, len(partitions), _BATCH):
            batch = partitions[start : start + _BATCH]
            self._call(FrameType.RELEASE, encode_partitions(batch), FrameType.ACK)

    def hand_over(self, state: HostedState, partition: ResultPartitionID) -> None:
        self._call(FrameType.HOST, encode_hosted(state, partition), FrameType.ACK)

    def shutdown(self) -> None:
        self._call(FrameType.SHUTDOWN, b"", FrameType.ACK)

    def close(self) -> None:
        self._sock.close()
