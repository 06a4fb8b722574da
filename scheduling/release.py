"""When a partition can go (after Flink's RegionPartitionGroupReleaseStrategy and the job
master's partition tracker): a consumed group is releasable once every region that consumes it
has finished, and a partition is released once every group holding it is releasable. Only
partitions the scheduler releases are tracked (pipelined ones go after their one consumption)
and persistent ones are kept. Release goes through ``ShuffleMaster.release_partition_externally``.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable

from scheduling.deployment import DescriptorCache
from scheduling.groups import ConsumedPartitionGroup, PartitionGroups
from scheduling.regions import PipelinedRegion, RegionTopology
from shuffle_api import ShuffleDescriptor, ShuffleMaster

__all__ = ["PartitionReleaser"]


class PartitionReleaser:
    """Tracks produced partitions and releases them as their consumer regions finish."""

    def __init__(
        self,
        partition_groups: PartitionGroups,
        regions: RegionTopology,
        master: ShuffleMaster,
        *,
        descriptor_cache: DescriptorCache | None = None,
    ) -> None:
        self._groups = partition_groups
        self._master = master
        self._cache = descriptor_cache
        self._lock = threading.Lock()
        self._unfinished_consumers: dict[ConsumedPartitionGroup, set[int]] = {}
        self._consumed_by_region: dict[int, list[ConsumedPartitionGroup]] = {}
        for groups in partition_groups.exchanges:
            for consumed, consumers in zip(groups.consumed, groups.consumer_groups, strict=True):
                region_ids = {
                    regions.region_of(vertex).region_id for vertex in consumers.vertices()
                }
                self._unfinished_consumers[consumed] = region_ids
                for region_id in region_ids:
                    self._consumed_by_region.setdefault(region_id, []).append(consumed)
        self._tracked: dict[tuple[str, int], ShuffleDescriptor] = {}

    def track(self, result_id: str, partition: int, descriptor: ShuffleDescriptor) -> None:
        """The producer of the partition finished and registered ``descriptor``."""
        partition_type = self._groups.groups_of_partition(result_id, partition)[0].partition_type
        if partition_type.is_released_by_scheduler and not partition_type.is_persistent:
            with self._lock:
                self._tracked[(result_id, partition)] = descriptor

    def tracked(self) -> list[ShuffleDescriptor]:
        with self._lock:
            return list(self._tracked.values())

    def region_finished(self, region: PipelinedRegion) -> list[ShuffleDescriptor]:
        """Release what no unfinished region needs any more; return the released descriptors."""
        releasable: list[ConsumedPartitionGroup] = []
        with self._lock:
            for group in self._consumed_by_region.get(region.region_id, ()):
                unfinished = self._unfinished_consumers[group]
                unfinished.discard(region.region_id)
                if not unfinished:
                    releasable.append(group)
            released = [
                self._tracked.pop(key)
                for key in self._releasable_partitions(releasable)
                if key in self._tracked
            ]
        if self._cache is not None:
            for group in releasable:
                self._cache.invalidate(group)
        self._master.release_partitions_externally(released)
        return released

    def _releasable_partitions(
        self, groups: Iterable[ConsumedPartitionGroup]
    ) -> Iterable[tuple[str, int]]:
        for group in groups:
            for partition in group.partitions:
                holders = self._groups.groups_of_partition(group.result_id, partition)
                if all(not self._unfinished_consumers[holder] for holder in holders):
                    yield group.result_id, partition

    def region_restarted(self, region: PipelinedRegion) -> None:
        """A consumer region runs again (failover): what it reads is needed again."""
        with self._lock:
            for group in self._consumed_by_region.get(region.region_id, ()):
                self._unfinished_consumers[group].add(region.region_id)

    def producer_rerun(self, result_id: str, partition: int) -> ShuffleDescriptor | None:
        """The partition's producer runs again: its groups wait for the partition again and
        their shared descriptor lists are stale. Returns the old attempt's descriptor (no
        longer tracked; the caller releases it once nothing reads it)."""
        with self._lock:
            descriptor = self._tracked.pop((result_id, partition), None)
            self._groups.partition_unfinished(result_id, partition)
        if self._cache is not None:
            for group in self._groups.groups_of_partition(result_id, partition):
                self._cache.invalidate(group)
        return descriptor
