"""Between the wire messages and shuffle_api's values. Everything a request names is validated
here, so no request can name a path outside a store (ids become path components)."""

from __future__ import annotations

import unicodedata
from dataclasses import dataclass

from external_shuffle.wire.stubs import pb
from shuffle_api import (
    ApplicationIdentity,
    IntermediateResultPartitionID,
    PartitionStatistics,
    ResultPartitionID,
)
from shuffle_api.ids import validate_id

__all__ = [
    "MAX_IDENTITY_FIELD",
    "MAX_REGISTRATIONS_A_CALL",
    "Commit",
    "WorkerAddress",
    "identity_from_pb",
    "identity_to_pb",
    "key_of",
    "partition_of",
    "statistics_from_pb",
    "statistics_to_pb",
]


def key_of(partition: ResultPartitionID) -> pb.PartitionKey:
    return pb.PartitionKey(
        result_id=partition.partition_id.result_id,
        partition_index=partition.partition_id.partition_index,
        producer_attempt_id=partition.producer_attempt_id,
    )


def partition_of(key: pb.PartitionKey) -> ResultPartitionID:
    """The partition a message names; raises InvalidIdentifierError for unsafe ids."""
    return ResultPartitionID(
        IntermediateResultPartitionID(key.result_id, key.partition_index),
        key.producer_attempt_id,
    )


def statistics_to_pb(statistics: PartitionStatistics) -> pb.PartitionStatistics:
    return pb.PartitionStatistics(
        rows_per_subpartition=statistics.rows_per_subpartition,
        bytes_per_subpartition=statistics.bytes_per_subpartition,
        arrow_bytes_per_subpartition=statistics.arrow_bytes_per_subpartition,
    )


def statistics_from_pb(message: pb.PartitionStatistics) -> PartitionStatistics:
    return PartitionStatistics(
        tuple(message.rows_per_subpartition),
        tuple(message.bytes_per_subpartition),
        tuple(message.arrow_bytes_per_subpartition),
    )


MAX_IDENTITY_FIELD = 256
"""Characters kept of each field of an application's identity (a client's input)."""

MAX_REGISTRATIONS_A_CALL = 1000
"""Partitions one ``RegisterPartitions`` call places (~200 KB; a coordinator's thread is held
for a few milliseconds)."""


def identity_to_pb(identity: ApplicationIdentity) -> pb.ApplicationIdentity:
    return pb.ApplicationIdentity(
        engine_id=identity.engine_id, name=identity.name, user=identity.user
    )


def _printable(text: str) -> str:
    """``text`` without control and format characters (a client's: an operator's terminal
    and the logs show it), cut to :data:`MAX_IDENTITY_FIELD`."""
    kept = (c for c in text if unicodedata.category(c) not in ("Cc", "Cf"))
    return "".join(kept)[:MAX_IDENTITY_FIELD]


def identity_from_pb(message: pb.ApplicationIdentity) -> ApplicationIdentity:
    """The identity a message gives, printable (see :func:`_printable`)."""
    return ApplicationIdentity(
        _printable(message.engine_id), _printable(message.name), _printable(message.user)
    )


@dataclass(frozen=True, slots=True)
class Commit:
    """A partition a worker committed, and the application its writer named ("" if none);
    or, ``on_tier``, one it committed before and has moved to its tier store since."""

    partition: ResultPartitionID
    application_id: str = ""
    on_tier: bool = False

    def to_pb(self) -> pb.CommittedPartition:
        return pb.CommittedPartition(
            partition=key_of(self.partition),
            application_id=self.application_id,
            on_tier=self.on_tier,
        )

    @classmethod
    def from_pb(cls, message: pb.CommittedPartition) -> Commit:
        if message.application_id:
            validate_id(message.application_id, "application id")
        return cls(partition_of(message.partition), message.application_id, message.on_tier)


@dataclass(frozen=True, slots=True)
class WorkerAddress:
    """A worker as clients see it: where to call it, and where its store is."""

    worker_id: str
    host: str
    port: int
    store_url: str
    store_shared: bool
    data_port: int = 0
    """Where the worker serves fetches over a plain socket (0: it does not)."""
    tier_url: str = ""
    """The shared store the worker moves committed partitions to ("": none)."""
    hostname: str = ""
    """The worker's host name (a pod's name on Kubernetes; "": not said)."""

    def __post_init__(self) -> None:
        validate_id(self.worker_id, "worker id")

    @property
    def target(self) -> str:
        """``host:port`` for a gRPC channel."""
        return f"{self.host}:{self.port}"

    def to_pb(self) -> pb.WorkerInfo:
        return pb.WorkerInfo(
            worker_id=self.worker_id,
            host=self.host,
            port=self.port,
            store_url=self.store_url,
            store_shared=self.store_shared,
            data_port=self.data_port,
            tier_url=self.tier_url,
            hostname=self.hostname,
        )

    @classmethod
    def from_pb(cls, message: pb.WorkerInfo) -> WorkerAddress:
        return cls(
            message.worker_id,
            message.host,
            message.port,
            message.store_url,
            message.store_shared,
            message.data_port,
            message.tier_url,
            message.hostname,
        )
