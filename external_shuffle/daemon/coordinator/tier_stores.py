"""The coordinator's reads and deletes on workers' tier stores: for a partition moved there
whose workers are all gone, the coordinator answers whether it is committed, and deletes it."""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from collections.abc import Sequence

from shuffle_api import PartitionStatistics, ResultPartitionID
from shuffle_runtime.format import PartitionFileReader, partition_directory
from shuffle_runtime.store import Store

__all__ = ["TierStores"]

logger = logging.getLogger(__name__)

_OPEN_STORES = 64
"""Tier stores kept open (one per URL the workers name: a cluster has one or a few)."""
_REFUSED_PROTOCOLS = frozenset({"file", "local", "memory", "http", "https", "ftp", "sftp", "ssh"})
"""A local path (this host's, not the worker's), or a web address (a request to anywhere)."""


class TierStores:
    def __init__(self) -> None:
        self._stores: OrderedDict[str, Store] = OrderedDict()
        self._lock = threading.Lock()

    def _store(self, url: str) -> Store | None:
        """The store at ``url``; None for one this coordinator cannot or must not open (a
        worker's word names it: only a store every host shares, never a local path or a web
        address, and only with its fsspec driver installed here)."""
        with self._lock:
            store = self._stores.get(url)
            if store is not None:
                self._stores.move_to_end(url)
                return store
        scheme, separator, _ = url.partition("://")
        if not separator or scheme.lower() in _REFUSED_PROTOCOLS:
            logger.warning("tier store %s refused: not a shared store", url)
            return None
        try:
            store = Store(url)
        except Exception as error:  # an unknown protocol, a driver not installed, ...
            logger.warning("tier store %s cannot be opened here: %s", url, error)
            return None
        if not store.is_shared:
            logger.warning("tier store %s refused: not a shared store", url)
            return None
        with self._lock:
            self._stores[url] = store
            if len(self._stores) > _OPEN_STORES:
                self._stores.popitem(last=False)
        return store

    def statistics(self, url: str, partition: ResultPartitionID) -> PartitionStatistics | None:
        """The partition's statistics if it is committed on the tier store at ``url``."""
        store = self._store(url)
        if store is None:
            return None
        try:
            return PartitionFileReader(store, partition).manifest.statistics
        except Exception as error:  # the store's errors: the partition is not available
            logger.warning("%s is not readable on the tier store %s: %s", partition, url, error)
            return None

    def delete(self, url: str, partitions: Sequence[ResultPartitionID]) -> None:
        store = self._store(url)
        if store is None:
            return
        for partition in partitions:
            try:
                store.delete_tree(partition_directory(store, partition), empty_parents=2)
            except Exception as error:  # the store's lifecycle rules are the backstop
                logger.warning("deleting %s from tier store %s failed: %s", partition, url, error)
