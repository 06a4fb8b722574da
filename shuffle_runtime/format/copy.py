"""Copying a committed partition from one store to another (a worker moving it to its tier)."""

from __future__ import annotations

from shuffle_api.errors import PartitionCorruptedError, PartitionNotFoundError, ShuffleError
from shuffle_api.ids import ResultPartitionID
from shuffle_runtime.format.layout import partition_directory
from shuffle_runtime.format.manifest import DATA_FILE, INDEX_FILE, MANIFEST_FILE, PartitionManifest
from shuffle_runtime.format.reader import is_readable
from shuffle_runtime.format.sink import StoreSink, write_all
from shuffle_runtime.store import Store, storage_errors

__all__ = ["copy_partition"]

COPY_PIECE_BYTES = 8 << 20
"""Bytes of data held at once while copying: the copy's memory, whatever the partition's size."""


def copy_partition(
    source: Store, target: Store, partition: ResultPartitionID, *, piece: int = COPY_PIECE_BYTES
) -> int:
    """Copy the committed partition's files from ``source`` to ``target`` (the same path under
    each root), data first and manifest last, so a reader of ``target`` sees it whole or not
    at all. A copy committed there already (an earlier move cut off after its manifest) is
    kept. Returns the data bytes copied."""
    directory = partition_directory(source, partition)
    try:
        manifest_bytes = source.read_bytes(source.child(directory, MANIFEST_FILE))
        manifest = PartitionManifest.from_json(manifest_bytes, f"copy of {partition}", partition)
        index = source.read_bytes(source.child(directory, INDEX_FILE))
        # A partition of no rows has no data file (its writer opens one with the first run).
        ranges = (
            source.open_ranges(source.child(directory, DATA_FILE)) if manifest.data_bytes else None
        )
    except FileNotFoundError as error:
        raise PartitionNotFoundError(
            f"copy of {partition}: its files at {directory} are gone", partition
        ) from error
    try:
        sink = StoreSink(target, partition)
    except ShuffleError:
        if is_readable(target, partition):
            return 0
        raise
    try:
        with storage_errors(sink.where):
            output = sink.open_data()
            try:
                for offset in range(0, manifest.data_bytes, piece):
                    assert ranges is not None, "opened when there are data bytes"
                    wanted = min(piece, manifest.data_bytes - offset)
                    data = ranges.read_range(offset, wanted)
                    if data.size != wanted:
                        raise PartitionCorruptedError(
                            f"{partition}'s data at {directory} is shorter than its manifest"
                            f" says ({offset + data.size} of {manifest.data_bytes} bytes)",
                            partition,
                        )
                    write_all(output, memoryview(data))
            finally:
                output.close()
        sink.commit(index, manifest_bytes)
    except BaseException:
        sink.abort()
        raise
    return manifest.data_bytes
