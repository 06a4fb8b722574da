"""The task-side half of a shuffle service (one per executor process)."""

from __future__ import annotations

import abc
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Self

from shuffle_api.descriptors import (
    InputGateDeploymentDescriptor,
    PartitionInfo,
    ProducerDescriptor,
    ResultPartitionDeploymentDescriptor,
    ShuffleDescriptor,
)
from shuffle_api.ids import ResultPartitionID, validate_id
from shuffle_api.io import InputGate, PartitionStatistics, ResultPartitionWriter

__all__ = ["LOCAL_ONLY_PORT", "ShuffleEnvironment", "ShuffleIOOwner"]

LOCAL_ONLY_PORT = -1
"""What :meth:`ShuffleEnvironment.start` returns when the environment serves no data port."""


@dataclass(frozen=True, slots=True)
class ShuffleIOOwner:
    """The task attempt that owns writers and gates (Flink's ShuffleIOOwnerContext)."""

    name: str
    execution_attempt_id: str

    def __post_init__(self) -> None:
        validate_id(self.execution_attempt_id, "execution attempt id")


class ShuffleEnvironment(abc.ABC):
    """Creates writers and input gates for the tasks of one process."""

    @property
    @abc.abstractmethod
    def resource_id(self) -> str:
        """Identifies this environment (its process); descriptors name it as producer location."""

    @abc.abstractmethod
    def start(self) -> int:
        """Start serving; return the data port, or :data:`LOCAL_ONLY_PORT`."""

    @abc.abstractmethod
    def producer_descriptor(self, producer_execution_id: str) -> ProducerDescriptor:
        """How this process appears as the producer of a partition (call after :meth:`start`)."""

    @abc.abstractmethod
    def create_result_partition_writers(
        self, owner: ShuffleIOOwner, descriptors: Sequence[ResultPartitionDeploymentDescriptor]
    ) -> list[ResultPartitionWriter]:
        """One writer per descriptor, in the same order."""

    @abc.abstractmethod
    def create_input_gates(
        self, owner: ShuffleIOOwner, descriptors: Sequence[InputGateDeploymentDescriptor]
    ) -> list[InputGate]:
        """One gate per descriptor, in the same order. Unknown descriptors wait for
        :meth:`update_partition_info`."""

    @abc.abstractmethod
    def release_partitions_locally(self, partition_ids: Collection[ResultPartitionID]) -> None:
        """Free what this process holds of these partitions (idempotent)."""

    @abc.abstractmethod
    def partitions_occupying_local_resources(self) -> frozenset[ResultPartitionID]:
        """Partitions this process must stay alive for; empty means it can go away."""

    @abc.abstractmethod
    def update_partition_info(
        self, consumer_attempt_id: str, partition_info: PartitionInfo
    ) -> bool:
        """Replace an unknown descriptor in the consumer's gates; False if no gate took it.

        Thread-safe: called while the consumer may be reading.
        """

    def describe_unregistered(
        self, partition: ResultPartitionID, producer: ProducerDescriptor
    ) -> ShuffleDescriptor | None:
        """A descriptor of a partition no master registered, from its producer alone: an
        engine reran the producer inside a running stage (Spark, after a fetch failure) and
        its consumers must read the new attempt. ``None`` where only the master can
        describe a partition (the default)."""
        return None

    def merge_partitions(
        self,
        owner: ShuffleIOOwner,
        sources: Sequence[ShuffleDescriptor],
        merged: ResultPartitionDeploymentDescriptor,
    ) -> PartitionStatistics | None:
        """Write the blocking partition ``merged``: each subpartition the data of every one of
        ``sources`` (committed blocking partitions of one schema and subpartition count), in
        their order, so that a consumer reads one partition where it read ``len(sources)``.
        Its statistics; ``None``, and nothing written, where this environment does not merge
        these (the default: a service that merges elsewhere, or a source it cannot read
        from here). A source that is lost or corrupt fails the merge, nothing written."""
        return None

    @abc.abstractmethod
    def close(self) -> None:
        """Stop serving and release every partition this process holds."""

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()
