"""Batches no codec compresses and batches every codec compresses well, for the
tests of ``shuffle_runtime.format``'s codecs."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

MIB = 1 << 20


def incompressible(rows: int = 20_000) -> pa.RecordBatch:
    """Random 64-bit keys and random 32-byte values: no codec saves anything."""
    rng = np.random.default_rng(7)
    payload = rng.integers(0, 256, size=rows * 32, dtype=np.uint8).tobytes()
    text = pa.FixedSizeBinaryArray.from_buffers(pa.binary(32), rows, [None, pa.py_buffer(payload)])
    keys = pa.array(rng.integers(-(2**63), 2**63 - 1, size=rows, dtype=np.int64))
    return pa.record_batch([keys, text], names=["key", "text"])


def compressible(rows: int = 20_000) -> pa.RecordBatch:
    """Sorted keys with long runs and a handful of category strings: over 80 % saved."""
    keys = pa.array(np.repeat(np.arange(rows // 100, dtype=np.int64), 100))
    categories = pa.array([f"category-{i % 5}-of-a-small-set".ljust(32) for i in range(rows)])
    categories = categories.cast(pa.binary(32))
    return pa.record_batch([keys, categories], names=["key", "text"])
