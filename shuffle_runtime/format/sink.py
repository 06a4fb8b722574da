"""Where a :class:`~shuffle_runtime.format.PartitionFileWriter` puts a partition's three files.

The writer makes the bytes; a sink decides where they go: straight onto a store
(:class:`StoreSink`), or elsewhere, e.g. pushed to a remote service that writes them to its own
store. Either way the manifest is written last and its presence is the commit.
"""

from __future__ import annotations

import abc

from shuffle_api.errors import ShuffleError
from shuffle_api.ids import ResultPartitionID
from shuffle_runtime.format.layout import partition_directory
from shuffle_runtime.format.manifest import DATA_FILE, INDEX_FILE, MANIFEST_FILE
from shuffle_runtime.store import DataStream, Store, write_all

__all__ = ["DataStream", "PartitionSink", "StoreSink", "write_all"]


class PartitionSink(abc.ABC):
    """Receives one partition attempt's data file as a stream, then its index and manifest."""

    @property
    @abc.abstractmethod
    def partition(self) -> ResultPartitionID: ...

    @property
    @abc.abstractmethod
    def where(self) -> str:
        """Where the files go, for error messages."""

    @abc.abstractmethod
    def open_data(self) -> DataStream:
        """The data file, opened for writing (called at most once)."""

    @abc.abstractmethod
    def commit(self, index: bytes, manifest: bytes) -> None:
        """Store the index, then the manifest: once this returns the partition is readable.
        The data file is closed before."""

    @abc.abstractmethod
    def abort(self) -> None:
        """Delete whatever was written (the data file may still be open)."""


class StoreSink(PartitionSink):
    """The files under ``partition_directory(store, partition)``."""

    def __init__(self, store: Store, partition: ResultPartitionID) -> None:
        self._store = store
        self._partition = partition
        self._directory = partition_directory(store, partition)
        if store.exists(store.child(self._directory, MANIFEST_FILE)):
            raise ShuffleError(f"partition {partition} is already committed at {self._directory}")

    @property
    def partition(self) -> ResultPartitionID:
        return self._partition

    @property
    def where(self) -> str:
        return self._directory

    def open_data(self) -> DataStream:
        return self._store.open_output(self._store.child(self._directory, DATA_FILE))

    def commit(self, index: bytes, manifest: bytes) -> None:
        # The manifest is the commit point: the index before it needs no atomic write.
        self._store.put(self._store.child(self._directory, INDEX_FILE), index)
        self._store.put_atomic(self._store.child(self._directory, MANIFEST_FILE), manifest)

    def abort(self) -> None:
        self._store.delete_tree(self._directory)
