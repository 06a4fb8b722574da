"""Immutable descriptors exchanged between the master, the environments and the engine."""

from __future__ import annotations

import abc
import enum
from collections.abc import Iterator
from dataclasses import dataclass
from typing import ClassVar

from shuffle_api.errors import InvalidIdentifierError
from shuffle_api.ids import IntermediateResultPartitionID, ResultPartitionID, validate_id

__all__ = [
    "ConsumingConstraint",
    "DistributionPattern",
    "InputGateDeploymentDescriptor",
    "PartitionDescriptor",
    "PartitionInfo",
    "ProducerDescriptor",
    "ReleaseBy",
    "ResultPartitionDeploymentDescriptor",
    "ResultPartitionType",
    "ShuffleDescriptor",
    "ShuffleDescriptorGroup",
    "SubpartitionRange",
    "UnknownShuffleDescriptor",
]


class ConsumingConstraint(enum.Enum):
    """Whether a consumer must, can, or cannot run while its producer runs."""

    BLOCKING = "blocking"
    CAN_BE_PIPELINED = "can_be_pipelined"
    MUST_BE_PIPELINED = "must_be_pipelined"


class ReleaseBy(enum.Enum):
    """Who decides that a partition is released."""

    SCHEDULER = "scheduler"
    UPSTREAM = "upstream"


class ResultPartitionType(enum.Enum):
    """Flink's partition types with their flags (see the reference, section 1)."""

    # value: (reconsumable, bounded, persistent, consuming constraint, released by)
    BLOCKING = (True, False, False, ConsumingConstraint.BLOCKING, ReleaseBy.SCHEDULER)
    BLOCKING_PERSISTENT = (True, False, True, ConsumingConstraint.BLOCKING, ReleaseBy.SCHEDULER)
    PIPELINED = (False, False, False, ConsumingConstraint.MUST_BE_PIPELINED, ReleaseBy.UPSTREAM)
    PIPELINED_BOUNDED = (
        False,
        True,
        False,
        ConsumingConstraint.MUST_BE_PIPELINED,
        ReleaseBy.UPSTREAM,
    )
    HYBRID_FULL = (True, False, False, ConsumingConstraint.CAN_BE_PIPELINED, ReleaseBy.SCHEDULER)

    @property
    def is_reconsumable(self) -> bool:
        """Can be read more than once (until released)."""
        return bool(self.value[0])

    @property
    def is_bounded(self) -> bool:
        """Uses a bounded amount of buffer memory."""
        return bool(self.value[1])

    @property
    def is_persistent(self) -> bool:
        """Outlives the job that produced it."""
        return bool(self.value[2])

    @property
    def consuming_constraint(self) -> ConsumingConstraint:
        return ConsumingConstraint(self.value[3])

    @property
    def released_by(self) -> ReleaseBy:
        return ReleaseBy(self.value[4])

    @property
    def must_be_pipelined(self) -> bool:
        return self.consuming_constraint is ConsumingConstraint.MUST_BE_PIPELINED

    @property
    def can_be_pipelined(self) -> bool:
        return self.consuming_constraint is not ConsumingConstraint.BLOCKING

    @property
    def is_blocking_or_blocking_persistent(self) -> bool:
        return self in (ResultPartitionType.BLOCKING, ResultPartitionType.BLOCKING_PERSISTENT)

    @property
    def is_released_by_scheduler(self) -> bool:
        return self.released_by is ReleaseBy.SCHEDULER


class DistributionPattern(enum.Enum):
    """How producers connect to consumers."""

    ALL_TO_ALL = "all_to_all"
    POINTWISE = "pointwise"


@dataclass(frozen=True, slots=True)
class SubpartitionRange:
    """An inclusive range ``[start, end]`` of subpartition indexes."""

    start: int
    end: int

    def __post_init__(self) -> None:
        if self.start < 0 or self.end < self.start:
            raise InvalidIdentifierError(
                f"invalid subpartition range [{self.start}, {self.end}]: need 0 <= start <= end"
            )

    def __len__(self) -> int:
        return self.end - self.start + 1

    def __iter__(self) -> Iterator[int]:
        return iter(range(self.start, self.end + 1))

    def __contains__(self, index: object) -> bool:
        return isinstance(index, int) and self.start <= index <= self.end

    @classmethod
    def single(cls, index: int) -> SubpartitionRange:
        return cls(index, index)


@dataclass(frozen=True, slots=True)
class PartitionDescriptor:
    """What the engine knows of a partition before it is produced."""

    result_id: str
    total_number_of_partitions: int
    partition_id: IntermediateResultPartitionID
    partition_type: ResultPartitionType
    number_of_subpartitions: int
    connection_index: int = 0
    is_broadcast: bool = False
    distribution_pattern: DistributionPattern = DistributionPattern.ALL_TO_ALL
    is_number_of_partition_consumers_undefined: bool = False

    def __post_init__(self) -> None:
        validate_id(self.result_id, "result id")
        if self.partition_id.result_id != self.result_id:
            raise InvalidIdentifierError(
                f"partition {self.partition_id} does not belong to result {self.result_id!r}"
            )
        if self.number_of_subpartitions < 1:
            raise InvalidIdentifierError(
                f"number_of_subpartitions must be >= 1, got {self.number_of_subpartitions}"
            )
        if not 0 <= self.partition_id.partition_index < self.total_number_of_partitions:
            raise InvalidIdentifierError(
                f"partition index {self.partition_id.partition_index} outside"
                f" [0, {self.total_number_of_partitions})"
            )

    @property
    def is_all_to_all_distribution(self) -> bool:
        return self.distribution_pattern is DistributionPattern.ALL_TO_ALL


@dataclass(frozen=True, slots=True)
class ProducerDescriptor:
    """Where the producer runs: its process (resource id), attempt, host and data port."""

    producer_location: str
    producer_execution_id: str
    address: str
    data_port: int

    def __post_init__(self) -> None:
        validate_id(self.producer_location, "producer location")
        validate_id(self.producer_execution_id, "producer execution id")


class ShuffleDescriptor(abc.ABC):
    """Where and how a consumer finds a produced partition; made by a ShuffleMaster.

    Implementations are frozen dataclasses with a unique ``kind``; they serialize through
    :mod:`shuffle_api.serialization`, which finds the class by that kind.
    """

    kind: ClassVar[str]

    @property
    @abc.abstractmethod
    def result_partition_id(self) -> ResultPartitionID: ...

    @property
    def is_unknown(self) -> bool:
        """True for a placeholder whose producer is not deployed yet."""
        return False

    @abc.abstractmethod
    def stores_local_resources_on(self) -> str | None:
        """The resource id of the process whose local resources hold the data, if any."""

    def merge_site(self) -> str | None:
        """Where the service would merge this partition with others (see
        ``ShuffleEnvironment.merge_partitions``): only partitions of one site merge together.
        None (the default): with any."""
        return None

    @abc.abstractmethod
    def details_to_bytes(self) -> bytes:
        """The implementation-specific part, as the bytes of its own protobuf message."""

    @classmethod
    @abc.abstractmethod
    def from_details(
        cls, result_partition_id: ResultPartitionID, details: bytes
    ) -> ShuffleDescriptor:
        """Inverse of :meth:`details_to_bytes`."""


@dataclass(frozen=True, slots=True)
class UnknownShuffleDescriptor(ShuffleDescriptor):
    """Placeholder for a partition whose producer is not deployed yet."""

    kind: ClassVar[str] = "unknown"
    partition: ResultPartitionID

    @property
    def result_partition_id(self) -> ResultPartitionID:
        return self.partition

    @property
    def is_unknown(self) -> bool:
        return True

    def stores_local_resources_on(self) -> str | None:
        return None

    def details_to_bytes(self) -> bytes:
        return b""

    @classmethod
    def from_details(
        cls, result_partition_id: ResultPartitionID, details: bytes
    ) -> UnknownShuffleDescriptor:
        return cls(result_partition_id)


@dataclass(frozen=True, slots=True)
class ResultPartitionDeploymentDescriptor:
    """What a producer task needs to create its writer for one partition."""

    partition_descriptor: PartitionDescriptor
    shuffle_descriptor: ShuffleDescriptor

    def __post_init__(self) -> None:
        if self.shuffle_descriptor.result_partition_id.partition_id != (
            self.partition_descriptor.partition_id
        ):
            raise InvalidIdentifierError(
                f"shuffle descriptor for {self.shuffle_descriptor.result_partition_id} does not"
                f" match partition {self.partition_descriptor.partition_id}"
            )

    @property
    def result_partition_id(self) -> ResultPartitionID:
        return self.shuffle_descriptor.result_partition_id

    @property
    def partition_type(self) -> ResultPartitionType:
        return self.partition_descriptor.partition_type

    @property
    def number_of_subpartitions(self) -> int:
        return self.partition_descriptor.number_of_subpartitions


@dataclass(frozen=True, slots=True)
class InputGateDeploymentDescriptor:
    """What a consumer task reads: these partitions x this subpartition range."""

    result_id: str
    consumed_partition_type: ResultPartitionType
    consumed_subpartitions: SubpartitionRange
    shuffle_descriptors: tuple[ShuffleDescriptor, ...]

    def __post_init__(self) -> None:
        validate_id(self.result_id, "result id")
        for descriptor in self.shuffle_descriptors:
            if descriptor.result_partition_id.partition_id.result_id != self.result_id:
                raise InvalidIdentifierError(
                    f"input gate of result {self.result_id!r} holds a descriptor of"
                    f" {descriptor.result_partition_id}"
                )


@dataclass(frozen=True, slots=True)
class ShuffleDescriptorGroup:
    """The shuffle descriptors of the partitions one group of consumers reads: serialized once
    and shared by all of them instead of copied into each consumer's deployment."""

    shuffle_descriptors: tuple[ShuffleDescriptor, ...]


@dataclass(frozen=True, slots=True)
class PartitionInfo:
    """A newly known descriptor for a consumer that was deployed with an unknown one."""

    result_id: str
    shuffle_descriptor: ShuffleDescriptor
