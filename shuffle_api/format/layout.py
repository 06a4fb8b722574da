"""Where a partition's files live on a store."""

from __future__ import annotations

from shuffle_api.ids import ResultPartitionID
from shuffle_api.store import Store

__all__ = ["partition_directory"]


def partition_directory(store: Store, partition: ResultPartitionID) -> str:
    """``root/<result id>/<partition index>/<producer attempt id>``: one directory per attempt."""
    return store.path(
        partition.partition_id.result_id,
        str(partition.partition_id.partition_index),
        partition.producer_attempt_id,
    )
