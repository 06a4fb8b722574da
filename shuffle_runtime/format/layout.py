"""Where a partition's files live on a store.

On a shared store (an object store) a partition's directory starts with one of
:data:`KEY_PREFIXES` spread prefixes, chosen by a stable hash of the map output: object stores
throttle per key prefix (S3: about 5,500 GETs and 3,500 PUTs a second) and scale by splitting
key ranges, so a stage whose thousands of map outputs sat under one ``root/<result id>/`` would
be served by one range. Local stores need no spread and keep the shorter layout.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterator

from shuffle_api.errors import InvalidIdentifierError
from shuffle_api.ids import IntermediateResultPartitionID, ResultPartitionID
from shuffle_runtime.store import Store

__all__ = [
    "KEY_PREFIXES",
    "partition_directory",
    "result_directories",
    "stored_partitions",
]

#: How many prefixes a shared store's keys spread over (one hex digit each).
KEY_PREFIXES = 16


def _spread_prefix(result_id: str, partition_index: int) -> str:
    # crc32, not hash(): every process must place the same map output under the same prefix.
    return f"{zlib.crc32(f'{result_id}/{partition_index}'.encode()) % KEY_PREFIXES:x}"


def partition_directory(store: Store, partition: ResultPartitionID) -> str:
    """``root/[<spread prefix>/]<result id>/<partition index>/<producer attempt id>``: one
    directory per attempt."""
    result_id = partition.partition_id.result_id
    index = partition.partition_id.partition_index
    parts: tuple[str, ...] = (result_id, str(index), partition.producer_attempt_id)
    if store.is_shared:
        parts = (_spread_prefix(result_id, index), *parts)
    return store.path(*parts)


def result_directories(store: Store, result_id: str) -> list[str]:
    """Every directory the partitions of ``result_id`` can be under (one per spread prefix)."""
    if not store.is_shared:
        return [store.path(result_id)]
    return [store.path(f"{prefix:x}", result_id) for prefix in range(KEY_PREFIXES)]


def stored_partitions(store: Store) -> Iterator[tuple[str, ResultPartitionID | None]]:
    """Each partition directory on ``store`` with the partition it holds, or None for a
    directory at that depth whose name is not a partition's."""
    root = store.path()
    depth = 4 if store.is_shared else 3
    found = store.filesystem.glob(root + "/*" * depth)
    for directory in sorted({path.rstrip("/") for path in found}):
        relative = directory[len(root) :].strip("/").split("/")[depth - 3 :]
        try:
            partition = ResultPartitionID(
                IntermediateResultPartitionID(relative[0], int(relative[1])), relative[2]
            )
        except (InvalidIdentifierError, ValueError, IndexError):
            yield directory, None
            continue
        if directory != partition_directory(store, partition):
            yield directory, None  # under another spread prefix than its own
            continue
        yield directory, partition
