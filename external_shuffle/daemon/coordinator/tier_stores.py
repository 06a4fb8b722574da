"""The coordinator's reads and deletes on workers' tier stores: for a partition moved there
whose workers are all gone, the coordinator answers whether it is committed, and deletes it."""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from collections.abc import Sequence

from shuffle_api import PartitionStatistics, ResultPartitionID, ShuffleError
from shuffle_api.format import PartitionFileReader, partition_directory
from shuffle_api.store import Store

__all__ = ["TierStores"]

logger = logging.getLogger(__name__)

_OPEN_STORES = 64
"""Tier stores kept open (one per URL the workers name: a cluster has one or a few)."""


class TierStores:
    def __init__(self) -> None:
        self._stores: OrderedDict[str, Store] = OrderedDict()
        self._lock = threading.Lock()

    def _store(self, url: str) -> Store:
        with self._lock:
            store = self._stores.get(url)
            if store is None:
                store = self._stores[url] = Store(url)
                if len(self._stores) > _OPEN_STORES:
                    self._stores.popitem(last=False)
            self._stores.move_to_end(url)
            return store

    def statistics(self, url: str, partition: ResultPartitionID) -> PartitionStatistics | None:
        """The partition's statistics if it is committed on the tier store at ``url``."""
        try:
            return PartitionFileReader(self._store(url), partition).manifest.statistics
        except ShuffleError as error:
            logger.warning("%s is not readable on the tier store %s: %s", partition, url, error)
            return None

    def delete(self, url: str, partitions: Sequence[ResultPartitionID]) -> None:
        store = self._store(url)
        for partition in partitions:
            try:
                store.delete_tree(partition_directory(store, partition), empty_parents=2)
            except ShuffleError as error:  # the store's lifecycle rules are the backstop
                logger.warning("deleting %s from tier store %s failed: %s", partition, url, error)
