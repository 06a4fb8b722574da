"""Reads of partitions' blocks from a store, ahead of their reader, several at once.

A reducer reads a block of each of many map outputs. From an object store each block is a
request of its own, whose round trip (milliseconds, tens on S3) would add up one after
another; so the blocks a reader is about to read are fetched on a pool of threads, within a
budget of bytes fetched and not yet decoded, as Spark's reducers keep fetches in flight
(``maxBytesInFlight``) and IBM's S3 shuffle prefetches. Decoding stays in the reader's thread.
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import CancelledError, Future, ThreadPoolExecutor
from typing import TypeVar

import pyarrow as pa

from shuffle_api.descriptors import SubpartitionRange
from shuffle_api.errors import ShuffleError, ShuffleServiceClosedError
from shuffle_api.ids import ResultPartitionID
from shuffle_runtime.format import Layouts, PartitionFileReader
from shuffle_runtime.store import Store

__all__ = ["StoreReads"]

T = TypeVar("T")


class StoreReads:
    """A process's reads ahead from stores, on ``threads`` threads its gates share; each
    request holds at most ``ahead_bytes`` fetched and not yet decoded, besides the piece (at
    most 8 MiB, or one run) its reader waits for."""

    def __init__(self, *, threads: int, ahead_bytes: int) -> None:
        self._pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="store-read")
        self._threads = threads
        self._ahead_bytes = ahead_bytes

    def read(
        self,
        store: Store,
        partitions: Sequence[ResultPartitionID],
        subpartitions: SubpartitionRange,
    ) -> Iterator[pa.RecordBatch | None]:
        """Each partition's batches, then ``None``, partition after partition (the answers
        of a gate's batched request); a partition's error is raised at its turn."""
        request = _Request(
            self._pool,
            store,
            list(partitions),
            subpartitions,
            threads=self._threads,
            ahead_bytes=self._ahead_bytes,
        )
        return request.answers()

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


class _Request:
    """One reader's partitions: their layouts (manifest and index, from the process's cache
    or the store) up to ``threads`` partitions ahead, then their pieces (ranges of at most
    8 MiB, see ``PartitionFileReader.pieces``) in order, within the byte budget."""

    def __init__(
        self,
        pool: ThreadPoolExecutor,
        store: Store,
        partitions: list[ResultPartitionID],
        subpartitions: SubpartitionRange,
        *,
        threads: int,
        ahead_bytes: int,
    ) -> None:
        self._pool = pool
        self._threads = threads
        self._ahead_bytes = ahead_bytes
        self._store = store
        self._partitions = partitions
        self._subpartitions = subpartitions
        self._layouts: dict[int, Future[PartitionFileReader]] = {}
        self._pieces: dict[int, list[list[int]]] = {}
        self._next_layout = 0
        # The next piece to ask for: its partition's turn and its place among its pieces.
        self._next_piece = (0, 0)
        self._asked: collections.deque[tuple[Future[pa.Buffer], int]] = collections.deque()
        self._held = 0  # bytes of the pieces asked for and not yet decoded

    def answers(self) -> Iterator[pa.RecordBatch | None]:
        try:
            for turn in range(len(self._partitions)):
                self._ask_layouts(turn)
                reader = _result(self._layouts[turn])  # this partition's error, if any
                for place in range(len(self._pieces_of(turn, reader))):
                    self._ask_pieces((turn, place))
                    piece, size = self._asked.popleft()
                    try:
                        yield from reader.decode(_result(piece))
                    finally:
                        self._held -= size
                # Every piece of this turn was asked for: the next to ask is in a later one.
                self._next_piece = max(self._next_piece, (turn + 1, 0))
                del self._layouts[turn], self._pieces[turn]
                yield None
        finally:
            for layout in self._layouts.values():
                layout.cancel()
            for piece, _ in self._asked:
                piece.cancel()

    def _pieces_of(self, turn: int, reader: PartitionFileReader) -> list[list[int]]:
        if turn not in self._pieces:
            self._pieces[turn] = list(reader.pieces(self._subpartitions))
        return self._pieces[turn]

    def _ask_layouts(self, turn: int) -> None:
        while self._next_layout < min(len(self._partitions), turn + self._threads):
            partition = self._partitions[self._next_layout]
            self._layouts[self._next_layout] = self._submit(
                PartitionFileReader, self._store, partition, Layouts.MAPPED
            )
            self._next_layout += 1

    def _submit(self, function: Callable[..., T], *arguments: object) -> Future[T]:
        try:
            return self._pool.submit(function, *arguments)
        except RuntimeError as error:  # the pool was shut down: its environment closed
            raise ShuffleServiceClosedError("store reads are closed") from error

    def _ask_pieces(self, wanted: tuple[int, int]) -> None:
        """Ask for pieces in order up to ``wanted`` (its reader waits for it), and on while
        their layouts are in and the budget allows."""
        while self._next_piece[0] < self._next_layout:
            turn, place = self._next_piece
            layout = self._layouts[turn]
            ahead = self._next_piece > wanted
            if ahead and (not layout.done() or layout.exception() is not None):
                return  # known later; a failed one fails at its turn
            reader = layout.result()
            try:
                pieces = self._pieces_of(turn, reader)
            except ShuffleError:
                if ahead:
                    return  # raised again at its turn, as that partition's
                raise
            if place >= len(pieces):
                self._next_piece = (turn + 1, 0)
                continue
            size = reader.piece_bytes(pieces[place])
            if ahead and self._held + size > self._ahead_bytes:
                return
            self._asked.append((self._submit(reader.fetch, pieces[place]), size))
            self._held += size
            self._next_piece = (turn, place + 1)


def _result(future: Future[T]) -> T:
    try:
        return future.result()
    except CancelledError as error:  # by the pool's shutdown: its environment closed
        raise ShuffleServiceClosedError("store reads are closed") from error
