"""Copies of partitions' manifests and indexes from a shared store on the reading host's disk:
an executor's Python workers (one per core, and more) fetch each map output's metadata once
between them, not once each.

Committed files never change (each attempt writes under an id of its own), so a copy stays
true; a copy of a partition released since is harmless (its data's first read finds it gone).
Copies live under the executor's own local directory (``SPARK_LOCAL_DIRS``, which Spark gives
its Python workers and deletes with the executor), and are pruned oldest first past a bound.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import logging
import os
import struct
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Final

from shuffle_api.ids import ResultPartitionID, new_id

__all__ = ["HostCopies", "host_copies"]

_LOG = logging.getLogger(__name__)

_HEADER: Final = struct.Struct("<Q")  # the manifest's length; the index follows it
MAX_COPIES: Final = 20_000
"""Copies kept per executor: a few KiB each, tens of MiB at most."""
_PRUNE_EVERY: Final = 512
"""Copies written between two counts of the directory."""


class HostCopies:
    """The copies under ``directory``, at most about ``max_copies`` of them."""

    def __init__(self, directory: Path, max_copies: int = MAX_COPIES) -> None:
        self._directory = directory
        self._max_copies = max_copies
        self._written = 0
        self._lock = threading.Lock()

    def _path(self, store_url: str, partition: ResultPartitionID) -> Path:
        return self._directory / hashlib.sha256(f"{store_url}\0{partition}".encode()).hexdigest()

    def read(
        self, store_url: str, partition: ResultPartitionID, fetch: Callable[[], tuple[bytes, bytes]]
    ) -> tuple[bytes, bytes]:
        """The partition's manifest and index: the host's copy, else ``fetch``ed and copied
        (by one process of the host at a time: the others wait for its copy)."""
        path = self._path(store_url, partition)
        found = _read_copy(path)
        if found is not None:
            return found
        with self._fetching(path):
            found = _read_copy(path)
            if found is not None:
                return found
            manifest, index = fetch()
            self._write(path, _HEADER.pack(len(manifest)) + manifest + index)
        return manifest, index

    @contextlib.contextmanager
    def _fetching(self, path: Path) -> Iterator[None]:
        """An exclusive lock of the copy's path among the host's processes (released by the
        kernel if its holder dies); none if the disk refuses one."""
        try:
            self._directory.mkdir(mode=0o700, parents=True, exist_ok=True)
            lock = open(path.with_name(f"{path.name}.lock"), "ab")  # noqa: SIM115 (held below)
        except OSError:
            yield
            return
        with lock:
            try:
                fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
            except OSError as error:  # a file system without locks: fetches may overlap
                _LOG.debug("no lock for %s: %s", path.name, error)
            yield

    def discard(self, store_url: str, partition: ResultPartitionID) -> None:
        """Delete the host's copy (one that does not decode: the next read fetches anew)."""
        self._path(store_url, partition).unlink(missing_ok=True)

    def _write(self, path: Path, data: bytes) -> None:
        """Write the copy whole or not at all (readers in other processes race it); a host
        whose disk refuses gets no copy."""
        temporary = path.with_name(f".{path.name}.{new_id()}")
        try:
            temporary.write_bytes(data)
            os.replace(temporary, path)
        except OSError as error:
            _LOG.debug("no host copy of %s: %s", path.name, error)
            temporary.unlink(missing_ok=True)
            return
        with self._lock:
            # On a process's first copy too: Spark stops idle Python workers early.
            due = self._written % _PRUNE_EVERY == 0
            self._written += 1
        if due:
            self.prune()

    def prune(self) -> None:
        """Delete the oldest copies beyond the bound (down to 80% of it), with their locks."""
        entries = []
        try:
            with os.scandir(self._directory) as found:
                for entry in found:
                    with contextlib.suppress(OSError):  # renamed or pruned meanwhile
                        entries.append((entry.stat().st_mtime, entry.path))
        except OSError:
            return
        files = 2 * self._max_copies  # a copy and its lock
        if len(entries) <= files:
            return
        entries.sort()
        for _, path in entries[: len(entries) - files * 4 // 5]:
            with contextlib.suppress(OSError):  # another process pruned it
                os.unlink(path)


def _read_copy(path: Path) -> tuple[bytes, bytes] | None:
    try:
        data = path.read_bytes()
    except OSError:
        return None
    if len(data) < _HEADER.size:
        return None
    (length,) = _HEADER.unpack_from(data)
    end = _HEADER.size + length
    return None if end > len(data) else (data[_HEADER.size : end], data[end:])


_COPIES: dict[str, HostCopies] = {}
_COPIES_LOCK = threading.Lock()


def host_copies() -> HostCopies | None:
    """This process's host copies: under the first of ``SPARK_LOCAL_DIRS`` (in an executor's
    Python worker), else none (a driver reads each partition's metadata once anyway)."""
    local_dirs = os.environ.get("SPARK_LOCAL_DIRS", "")
    first = local_dirs.split(",")[0].strip()
    if not first:
        return None
    with _COPIES_LOCK:
        copies = _COPIES.get(first)
        if copies is None:
            copies = _COPIES[first] = HostCopies(Path(first) / "pyshuffle-metadata")
        return copies
