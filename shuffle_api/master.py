"""The driver-side half of a shuffle service (one per application).

Style: calls that may need a remote service return a ``concurrent.futures.Future``, usable from
synchronous code (``.result()``) and from asyncio (``asyncio.wrap_future``).
"""

from __future__ import annotations

import abc
from collections.abc import Collection, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from types import TracebackType
from typing import Self, TypeVar

from shuffle_api.descriptors import PartitionDescriptor, ProducerDescriptor, ShuffleDescriptor
from shuffle_api.ids import ResultPartitionID
from shuffle_api.io import PartitionStatistics

__all__ = [
    "JobShuffleContext",
    "PartitionWithMetrics",
    "RecordingJobContext",
    "ShuffleMaster",
    "completed",
]

T = TypeVar("T")


def completed(value: T) -> Future[T]:
    """A future that is already done, for implementations that answer at once."""
    future: Future[T] = Future()
    future.set_result(value)
    return future


@dataclass(frozen=True, slots=True)
class PartitionWithMetrics:
    """A registered partition, whether its data is still available, and its statistics."""

    shuffle_descriptor: ShuffleDescriptor
    available: bool
    statistics: PartitionStatistics | None


class JobShuffleContext(abc.ABC):
    """The job's side of the conversation: how a service reports partitions it lost."""

    @property
    @abc.abstractmethod
    def job_id(self) -> str: ...

    @abc.abstractmethod
    def stop_tracking_and_release_partitions(
        self, partition_ids: Collection[ResultPartitionID]
    ) -> None:
        """The service lost these partitions: stop tracking them (their producers rerun)."""


class RecordingJobContext(JobShuffleContext):
    """A job context that remembers which partitions the service reported lost."""

    def __init__(self, job_id: str) -> None:
        self._job_id = job_id
        self.lost: list[ResultPartitionID] = []

    @property
    def job_id(self) -> str:
        return self._job_id

    def stop_tracking_and_release_partitions(
        self, partition_ids: Collection[ResultPartitionID]
    ) -> None:
        self.lost.extend(partition_ids)


class ShuffleMaster(abc.ABC):
    """Registers partitions, hands out their descriptors and releases them."""

    @abc.abstractmethod
    def start(self) -> None: ...

    @abc.abstractmethod
    def close(self) -> None: ...

    @abc.abstractmethod
    def register_job(self, context: JobShuffleContext) -> None: ...

    @abc.abstractmethod
    def unregister_job(self, job_id: str) -> None:
        """Forget the job and release every partition it still holds."""

    @abc.abstractmethod
    def register_partition_with_producer(
        self,
        job_id: str,
        partition_descriptor: PartitionDescriptor,
        producer_descriptor: ProducerDescriptor,
    ) -> Future[ShuffleDescriptor]:
        """Place the partition; the descriptor tells consumers where to find it."""

    @abc.abstractmethod
    def release_partition_externally(self, shuffle_descriptor: ShuffleDescriptor) -> None:
        """Free the partition's data wherever it lives (idempotent)."""

    def release_partitions_externally(
        self, shuffle_descriptors: Sequence[ShuffleDescriptor]
    ) -> None:
        """Free these partitions' data (idempotent), as :meth:`release_partition_externally`
        does one's: a service may do it in fewer calls than one a partition (an engine
        releases a stage's thousands of map outputs at once). By default, one by one."""
        for descriptor in shuffle_descriptors:
            self.release_partition_externally(descriptor)

    @abc.abstractmethod
    def partitions_with_metrics(
        self, job_id: str, *, statistics: bool = True
    ) -> Future[list[PartitionWithMetrics]]:
        """The job's registered partitions, whether each is available, and (``statistics``)
        rows and bytes per subpartition of each available one. Without statistics nothing
        that grows with the subpartitions travels or is read: what an engine checks before
        each stage at thousands of map tasks and reducers."""

    def environment_configuration(self) -> Mapping[str, str]:
        """Settings of this master's that the engine adds to the configuration of its tasks'
        shuffle environments (none by default), asked once it has started: what the
        environments must know of the running master, such as the application their
        partitions belong to and its credential."""
        return {}

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
