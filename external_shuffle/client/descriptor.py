"""The external service's shuffle descriptor: the workers holding the partition."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from google.protobuf.message import DecodeError

from external_shuffle.wire.messages import WorkerAddress, partition_of
from external_shuffle.wire.stubs import pb
from shuffle_api import (
    InvalidIdentifierError,
    ResultPartitionID,
    SerializationError,
    ShuffleDescriptor,
)
from shuffle_api.serialization import register_shuffle_descriptor_kind

__all__ = ["ExternalShuffleDescriptor"]


@register_shuffle_descriptor_kind
@dataclass(frozen=True, slots=True)
class ExternalShuffleDescriptor(ShuffleDescriptor):
    """Where a consumer finds a partition of the external service: its replicas, in the order
    to try them. A replica whose ``store_shared`` is set may be read straight from its store.
    The data lives in the daemon, so no client process has to stay alive for it. ``placement``:
    the coordinator's signature that it placed the partition for its application, which the
    producer's pushes and commit carry."""

    kind: ClassVar[str] = "external_shuffle"
    partition: ResultPartitionID
    replicas: tuple[WorkerAddress, ...]
    placement: bytes = field(default=b"", repr=False)

    def __post_init__(self) -> None:
        if not self.replicas:
            raise InvalidIdentifierError(f"partition {self.partition} has no worker")

    @classmethod
    def placed(cls, response: pb.RegisterPartitionResponse) -> ExternalShuffleDescriptor:
        """The descriptor of the partition a coordinator placed in ``response``."""
        location = response.location
        return cls(
            partition_of(location.partition),
            tuple(WorkerAddress.from_pb(replica) for replica in location.replicas),
            response.placement,
        )

    @property
    def result_partition_id(self) -> ResultPartitionID:
        return self.partition

    def stores_local_resources_on(self) -> str | None:
        return None

    def merge_site(self) -> str:
        """Its workers: they merge the partitions they all hold."""
        return ",".join(sorted(replica.worker_id for replica in self.replicas))

    def details_to_bytes(self) -> bytes:
        details: bytes = pb.ExternalShuffleDescriptorDetails(
            replicas=[replica.to_pb() for replica in self.replicas], placement=self.placement
        ).SerializeToString()
        return details

    @classmethod
    def from_details(
        cls, result_partition_id: ResultPartitionID, details: bytes
    ) -> ExternalShuffleDescriptor:
        message = pb.ExternalShuffleDescriptorDetails()
        try:
            message.ParseFromString(details)
            replicas = tuple(WorkerAddress.from_pb(replica) for replica in message.replicas)
            return cls(result_partition_id, replicas, message.placement)
        except (DecodeError, InvalidIdentifierError) as error:
            raise SerializationError(
                f"external_shuffle descriptor details do not decode: {error}"
            ) from error
