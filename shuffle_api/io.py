"""Task-side data interfaces: the result-partition writer and the input gate."""

from __future__ import annotations

import abc
from collections.abc import Iterator
from dataclasses import dataclass, field
from types import TracebackType
from typing import Self, TypeAlias

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import zstandard

from shuffle_api.descriptors import SubpartitionRange
from shuffle_api.ids import ResultPartitionID

__all__ = [
    "BROADCAST",
    "InputGate",
    "PartitionStatistics",
    "ResultPartitionWriter",
    "SubpartitionIndexes",
]

BROADCAST = -1
"""Subpartition index that stands for "every subpartition"."""

SubpartitionIndexes: TypeAlias = "pa.Array | pa.ChunkedArray | npt.ArrayLike"
"""A subpartition index per row of a batch."""


@dataclass(frozen=True, slots=True)
class PartitionStatistics:
    """Rows and bytes a reader of each subpartition gets (broadcast data included): bytes as
    stored, and as Arrow buffers (``RecordBatch.nbytes``), which the codec does not change.
    Arrow bytes not counted (an empty tuple) are taken as the stored bytes."""

    rows_per_subpartition: tuple[int, ...]
    bytes_per_subpartition: tuple[int, ...]
    arrow_bytes_per_subpartition: tuple[int, ...] = ()
    _encoded: bytes | None = field(default=None, init=False, repr=False, compare=False)
    """What :meth:`decode` decoded these from: :meth:`encode` gives it back (a worker passes
    on every partition's statistics as it received them)."""

    def __post_init__(self) -> None:
        if not self.arrow_bytes_per_subpartition:
            object.__setattr__(self, "arrow_bytes_per_subpartition", self.bytes_per_subpartition)

    def encode(self) -> bytes:
        """The three columns as one zstd-compressed array of little-endian int64: a few KiB
        where the numbers of thousands of subpartitions take tens as text, and decoding costs
        microseconds where parsing text costs milliseconds (it happens once per fetch)."""
        if self._encoded is not None:
            return self._encoded
        columns = np.array(
            [
                self.rows_per_subpartition,
                self.bytes_per_subpartition,
                self.arrow_bytes_per_subpartition,
            ],
            dtype="<i8",
        )
        # A compressor per call: one may not be shared by threads, and making one is cheap.
        return zstandard.ZstdCompressor(level=3).compress(columns.tobytes())

    @classmethod
    def decode(cls, data: bytes, number_of_subpartitions: int) -> PartitionStatistics:
        """What :meth:`encode` made of statistics of ``number_of_subpartitions``; ValueError
        for anything else (never more bytes than those columns take are decompressed)."""
        expected = 3 * 8 * number_of_subpartitions
        try:
            # The frame's own size first: decompressing allocates what it declares.
            declared = zstandard.frame_content_size(data)
            if declared != expected:
                raise ValueError(
                    f"statistics of {declared} bytes, for {number_of_subpartitions} subpartitions"
                )
            plain = zstandard.ZstdDecompressor().decompress(data, max_output_size=expected)
        except zstandard.ZstdError as error:
            raise ValueError(f"statistics do not decompress: {error}") from None
        if len(plain) != expected:
            raise ValueError(f"statistics decompress to {len(plain)} bytes, not {expected}")
        rows, stored, arrow = np.frombuffer(plain, dtype="<i8").reshape(3, -1).tolist()
        statistics = cls(tuple(rows), tuple(stored), tuple(arrow))
        object.__setattr__(statistics, "_encoded", bytes(data))
        return statistics

    @property
    def total_rows(self) -> int:
        return sum(self.rows_per_subpartition)

    @property
    def total_bytes(self) -> int:
        return sum(self.bytes_per_subpartition)


class ResultPartitionWriter(abc.ABC):
    """Writes one result partition. Use as a context manager: an exception fails the writer."""

    @property
    @abc.abstractmethod
    def result_partition_id(self) -> ResultPartitionID: ...

    @property
    @abc.abstractmethod
    def number_of_subpartitions(self) -> int: ...

    @abc.abstractmethod
    def write(self, batch: pa.RecordBatch, subpartitions: SubpartitionIndexes) -> None:
        """Write each row of ``batch`` to the subpartition named by its row of ``subpartitions``."""

    @abc.abstractmethod
    def write_to_subpartition(self, batch: pa.RecordBatch, subpartition: int) -> None:
        """Write the whole batch to one subpartition."""

    @abc.abstractmethod
    def broadcast(self, batch: pa.RecordBatch) -> None:
        """Write the batch to every subpartition (stored once where the format allows)."""

    @abc.abstractmethod
    def finish(self) -> PartitionStatistics:
        """Commit the partition; it becomes readable. Returns rows and bytes per subpartition."""

    @abc.abstractmethod
    def fail(self, error: BaseException | None = None) -> None:
        """Discard everything written; consumers of a pipelined partition see the error."""

    @property
    @abc.abstractmethod
    def is_finished(self) -> bool: ...

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if exc is not None:
            self.fail(exc)
        elif not self.is_finished:
            self.finish()


class InputGate(abc.ABC):
    """Reads one intermediate result: its partitions x a subpartition range.

    Iterating yields record batches. A failure raises a :class:`~shuffle_api.errors.PartitionError`
    whose ``partition_id`` names the partition it came from. Use as a context manager.
    """

    @property
    @abc.abstractmethod
    def result_id(self) -> str: ...

    @property
    @abc.abstractmethod
    def subpartitions(self) -> SubpartitionRange: ...

    @abc.abstractmethod
    def __iter__(self) -> Iterator[pa.RecordBatch]: ...

    @abc.abstractmethod
    def close(self) -> None:
        """Stop reading and free buffers and connections."""

    def read_all(self, schema: pa.Schema | None = None) -> pa.Table:
        """Every batch as one table (``schema`` is needed when the gate may yield nothing)."""
        batches = list(self)
        if not batches and schema is None:
            return pa.table({})
        return pa.Table.from_batches(batches, schema=schema)

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()
