"""The generated data the throughput benchmarks move: deterministic Arrow batches of an int64
key (100k distinct values), a float64 value and a 16-24 byte ASCII string, and the cheap key
hash that routes each row to a subpartition."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
import pyarrow as pa

__all__ = [
    "BATCH_ROWS",
    "DISTINCT_KEYS",
    "MB",
    "ROW_BYTES",
    "Indexes",
    "random_batches",
    "subpartition_indexes",
]

BATCH_ROWS = 65_536
DISTINCT_KEYS = 100_000
TEXT_MIN_BYTES = 16
TEXT_MAX_BYTES = 24  # inclusive: 20 bytes on average
ROW_BYTES = 8 + 8 + 4 + 20  # key, value, text offset, text characters (on average)
MB = 1_000_000

Indexes = npt.NDArray[np.int64]


def random_batches(rows: int, seed: int) -> list[pa.RecordBatch]:
    """``rows`` rows in batches of at most :data:`BATCH_ROWS`: ``key``, ``value``, ``text``."""
    rng = np.random.default_rng(seed)
    batches: list[pa.RecordBatch] = []
    for start in range(0, rows, BATCH_ROWS):
        count = min(BATCH_ROWS, rows - start)
        keys = rng.integers(0, DISTINCT_KEYS, size=count, dtype=np.int64)
        values = rng.random(count)
        lengths = rng.integers(TEXT_MIN_BYTES, TEXT_MAX_BYTES + 1, size=count, dtype=np.int32)
        offsets = np.zeros(count + 1, dtype=np.int32)
        np.cumsum(lengths, out=offsets[1:])
        chars = rng.integers(ord("a"), ord("z") + 1, size=int(offsets[-1]), dtype=np.uint8)
        text = pa.StringArray.from_buffers(
            count, pa.py_buffer(offsets.tobytes()), pa.py_buffer(chars.tobytes())
        )
        batches.append(
            pa.record_batch(
                [pa.array(keys), pa.array(values), text], names=["key", "value", "text"]
            )
        )
    return batches


def subpartition_indexes(keys: npt.NDArray[np.int64], subpartitions: int) -> Indexes:
    """A cheap hash of the key (Fibonacci hashing: multiply, keep the high bits) mod n."""
    mixed = keys.astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15)
    return ((mixed >> np.uint64(32)) % np.uint64(subpartitions)).astype(np.int64)
