"""netty_like's shuffle descriptor: producer location, data address and port, store."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import ClassVar

from google.protobuf.message import DecodeError

from netty_like._proto import netty_like_pb2 as pb
from shuffle_api import (
    ProducerDescriptor,
    ResultPartitionID,
    SerializationError,
    ShuffleDescriptor,
)
from shuffle_api.serialization import register_shuffle_descriptor_kind

__all__ = ["NettyShuffleDescriptor"]


# A job's descriptors repeat the details of its few producer processes: a descriptor list of
# 10,000 map tasks on 100 executors encodes 100 of them.
@functools.lru_cache(maxsize=4096)
def _details_bytes(
    producer_location: str,
    host: str,
    data_port: int,
    *,
    connection_index: int,
    store_url: str,
    on_shared_store: bool,
) -> bytes:
    details: bytes = pb.NettyShuffleDescriptorDetails(
        producer_location=producer_location,
        host=host,
        data_port=data_port,
        connection_index=connection_index,
        store_url=store_url,
        on_shared_store=on_shared_store,
    ).SerializeToString()
    return details


@register_shuffle_descriptor_kind
@dataclass(frozen=True, slots=True)
class NettyShuffleDescriptor(ShuffleDescriptor):
    """Where a consumer finds a netty_like partition.

    Same ``producer_location`` as the consumer's environment: read locally. A blocking partition
    whose files the consumer sees under ``store_url`` (same host, shared file system, object
    store): straight from the store. Otherwise through the producer's data port at
    ``host:data_port`` (``-1``: the producer serves none).

    ``on_shared_store``: a blocking partition on a store every host sees (an object store),
    which outlives its producer's process and host: it is read, found and released there.
    """

    kind: ClassVar[str] = "netty_like"
    partition: ResultPartitionID
    producer_location: str
    host: str
    data_port: int
    connection_index: int
    store_url: str
    on_shared_store: bool = False

    @classmethod
    def of_producer(
        cls,
        partition: ResultPartitionID,
        producer: ProducerDescriptor,
        *,
        connection_index: int,
        store_url: str,
        on_shared_store: bool = False,
    ) -> NettyShuffleDescriptor:
        """Where ``producer``'s partition is read: its process and data port, or the shared
        store."""
        return cls(
            partition=partition,
            producer_location=producer.producer_location,
            host=producer.address,
            data_port=producer.data_port,
            connection_index=connection_index,
            store_url=store_url,
            on_shared_store=on_shared_store,
        )

    @property
    def result_partition_id(self) -> ResultPartitionID:
        return self.partition

    def stores_local_resources_on(self) -> str | None:
        return None if self.on_shared_store else self.producer_location

    def is_local_to(self, resource_id: str) -> bool:
        return self.producer_location == resource_id

    def details_to_bytes(self) -> bytes:
        return _details_bytes(
            self.producer_location,
            self.host,
            self.data_port,
            connection_index=self.connection_index,
            store_url=self.store_url,
            on_shared_store=self.on_shared_store,
        )

    @classmethod
    def from_details(
        cls, result_partition_id: ResultPartitionID, details: bytes
    ) -> NettyShuffleDescriptor:
        message = pb.NettyShuffleDescriptorDetails()
        try:
            message.ParseFromString(details)
        except DecodeError as error:
            raise SerializationError(
                f"netty_like descriptor details do not decode: {error}"
            ) from error
        return cls(
            result_partition_id,
            message.producer_location,
            message.host,
            message.data_port,
            message.connection_index,
            message.store_url,
            message.on_shared_store,
        )
