"""What the driver keeps of the sizes one map output wrote: exact totals, the exact sizes of
its largest subpartitions, and one average for the rest (after Spark's
``HighlyCompressedMapStatus``). An exchange of M map tasks and R subpartitions then costs the
driver O(M + R) numbers and one bit per block (which blocks are empty), not 3 x M x R; plans
weigh the estimate, whose rows add up to each map task's exact bytes and whose large blocks,
those that make a subpartition skewed, are exact."""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Final

import numpy as np
import numpy.typing as npt
import zstandard

from shuffle_api.io import PartitionStatistics

__all__ = ["ACCURATE_BLOCKS", "MapSizes"]

ACCURATE_BLOCKS: Final = 100
"""At most this many of a map output's largest blocks are kept exactly (Spark's
``spark.shuffle.maxAccurateSkewedBlockNumber``)."""
_ACCURATE_FACTOR: Final = 2
"""A block is kept exactly when larger than this many times its map output's average block."""
_HEADER: Final = struct.Struct("<IqqqII")
"""Subpartitions, rows, stored bytes, Arrow bytes, accurate blocks, compressed empty-mask bytes."""
_MOST_SUBPARTITIONS: Final = 1 << 24

_Sizes = npt.NDArray[np.int64]


@dataclass(frozen=True, slots=True)
class MapSizes:
    """One map output's sizes, compressed: totals exact, blocks estimated."""

    subpartitions: int
    rows: int
    stored_bytes: int
    arrow_bytes: int
    accurate: bytes
    """Its largest blocks, exactly: (subpartition, stored bytes, Arrow bytes) as little-endian
    int64 triples, in subpartition order."""
    empty_mask: bytes
    """One bit per subpartition (``numpy.packbits`` order), set where nothing was written."""

    @classmethod
    def of(cls, statistics: PartitionStatistics) -> MapSizes:
        stored = np.asarray(statistics.bytes_per_subpartition, dtype=np.int64)
        arrow = np.asarray(statistics.arrow_bytes_per_subpartition, dtype=np.int64)
        written = (stored > 0) | (arrow > 0)
        accurate = np.zeros(0, dtype=np.int64)
        if written.any():
            average = stored.sum() / written.sum()
            large = np.flatnonzero(stored > _ACCURATE_FACTOR * average)
            largest = large[np.argsort(stored[large], kind="stable")[::-1][:ACCURATE_BLOCKS]]
            accurate = np.sort(largest)
        triples = np.stack([accurate, stored[accurate], arrow[accurate]], axis=1)
        return cls(
            len(stored),
            statistics.total_rows,
            int(stored.sum()),
            int(arrow.sum()),
            triples.astype("<i8").tobytes(),
            np.packbits(~written).tobytes(),
        )

    def estimate(self) -> tuple[_Sizes, _Sizes]:
        """Stored and Arrow bytes per subpartition: the accurate blocks as written, what
        remains of each total shared out evenly over the other written blocks."""
        written = ~np.unpackbits(
            np.frombuffer(self.empty_mask, dtype=np.uint8), count=self.subpartitions
        ).astype(bool)
        triples = np.frombuffer(self.accurate, dtype="<i8").reshape(-1, 3)
        indexes = triples[:, 0]
        rest = written.copy()
        rest[indexes] = False
        spread = np.flatnonzero(rest)
        estimates = []
        for total, exact in ((self.stored_bytes, triples[:, 1]), (self.arrow_bytes, triples[:, 2])):
            sizes = np.zeros(self.subpartitions, dtype=np.int64)
            sizes[indexes] = exact
            remaining = total - int(exact.sum())
            if len(spread):
                share, extra = divmod(remaining, len(spread))
                sizes[spread] = share
                sizes[spread[:extra]] += 1
            estimates.append(sizes)
        return estimates[0], estimates[1]

    def encode(self) -> bytes:
        """A few dozen bytes where the blocks are all written or all empty; the empty mask
        (compressed) and the accurate blocks beside a fixed header otherwise."""
        mask = zstandard.ZstdCompressor(level=3).compress(self.empty_mask)
        header = _HEADER.pack(
            self.subpartitions,
            self.rows,
            self.stored_bytes,
            self.arrow_bytes,
            len(self.accurate) // 24,
            len(mask),
        )
        return header + self.accurate + mask

    @classmethod
    def decode(cls, data: bytes) -> MapSizes:
        """What :meth:`encode` made; ValueError for anything else."""
        if len(data) < _HEADER.size:
            raise ValueError(f"map sizes of {len(data)} bytes, shorter than their header")
        subpartitions, rows, stored, arrow, accurate_blocks, mask_bytes = _HEADER.unpack_from(data)
        if subpartitions > _MOST_SUBPARTITIONS or accurate_blocks > min(
            ACCURATE_BLOCKS, subpartitions
        ):
            raise ValueError(
                f"map sizes of {subpartitions} subpartitions and {accurate_blocks} accurate blocks"
            )
        if min(rows, stored, arrow) < 0:
            raise ValueError("map sizes with negative totals")
        accurate_end = _HEADER.size + 24 * accurate_blocks
        if len(data) != accurate_end + mask_bytes:
            raise ValueError(f"map sizes of {len(data)} bytes, not {accurate_end + mask_bytes}")
        expected = -(-subpartitions // 8)
        try:
            mask = zstandard.ZstdDecompressor().decompress(
                data[accurate_end:], max_output_size=max(expected, 1)
            )
        except zstandard.ZstdError as error:
            raise ValueError(f"map sizes' empty mask does not decompress: {error}") from None
        if len(mask) != expected:
            raise ValueError(f"an empty mask of {len(mask)} bytes, not {expected}")
        accurate = data[_HEADER.size : accurate_end]
        triples = np.frombuffer(accurate, dtype="<i8").reshape(-1, 3)
        indexes = triples[:, 0]
        if (
            (indexes < 0).any()
            or (indexes >= subpartitions).any()
            or (np.diff(indexes) <= 0).any()
            or (triples[:, 1:] < 0).any()
            or int(triples[:, 1].sum()) > stored
            or int(triples[:, 2].sum()) > arrow
        ):
            raise ValueError("map sizes with accurate blocks out of place or beyond the totals")
        return cls(subpartitions, rows, stored, arrow, accurate, mask)
