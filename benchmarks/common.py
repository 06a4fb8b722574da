"""What the benchmarks share: the generated data the throughput benchmarks move
(deterministic Arrow batches of an int64 key with 100k distinct values, a float64 value and a
16-24 byte ASCII string, and the cheap key hash that routes each row to a subpartition), the
machine every run records beside its figures and the results file it writes, command-line
argument types, and the plain-text tables they print."""

from __future__ import annotations

import argparse
import json
import os
import platform
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa

__all__ = [
    "BATCH_ROWS",
    "CODECS",
    "DISTINCT_KEYS",
    "MB",
    "ROW_BYTES",
    "Indexes",
    "codec_list",
    "format_rows",
    "machine",
    "mb_per_s",
    "positive",
    "random_batches",
    "save_results",
    "settle",
    "subpartition_indexes",
]

BATCH_ROWS = 65_536
DISTINCT_KEYS = 100_000
TEXT_MIN_BYTES = 16
TEXT_MAX_BYTES = 24  # inclusive: 20 bytes on average
ROW_BYTES = 8 + 8 + 4 + 20  # key, value, text offset, text characters (on average)
MB = 1_000_000
CODECS = ("auto", "none", "lz4", "zstd")

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


def settle() -> None:
    """Before a timed write: flush what earlier phases left dirty in the page cache (and the
    discards of the files they deleted), so that no side pays for another's writes."""
    os.sync()


def mb_per_s(nbytes: int, seconds: float) -> float:
    """Throughput in MB (10**6 bytes) per second."""
    return nbytes / seconds / MB if seconds > 0 else float("inf")


# --- what every run records -----------------------------------------------------------------


def machine(**versions: str) -> dict[str, Any]:
    """The interpreter, the hardware, the load, and ``versions`` of the libraries measured."""
    return {
        "python": platform.python_version(),
        **versions,
        "machine": platform.machine(),
        "processor": platform.processor(),
        "cpu_count": os.cpu_count(),
        "platform": platform.platform(),
        "load_average": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
    }


def save_results(path: Path, document: dict[str, Any]) -> None:
    """Write ``document`` as indented JSON to ``path`` and say where."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(document, indent=2) + "\n", encoding="utf-8")
    print(f"\nsaved {path}")


# --- command line and printing --------------------------------------------------------------


def positive(text: str) -> int:
    """An argument type: an integer >= 1 (``10_000_000`` allowed)."""
    value = int(text.replace("_", ""))
    if value < 1:
        raise argparse.ArgumentTypeError("must be >= 1")
    return value


def key_value(text: str) -> tuple[str, str]:
    """An argument type: ``KEY=VALUE``, both stripped."""
    key, equals, value = text.partition("=")
    if not equals or not key.strip():
        raise argparse.ArgumentTypeError("expected KEY=VALUE")
    return key.strip(), value.strip()


def codec_list(text: str) -> list[str]:
    """An argument type: a comma-separated subset of :data:`CODECS`."""
    codecs = [codec.strip() for codec in text.split(",") if codec.strip()]
    if not codecs or any(codec not in CODECS for codec in codecs):
        raise argparse.ArgumentTypeError(
            f"codecs are a comma-separated subset of {','.join(CODECS)}"
        )
    return codecs


def format_rows(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A plain-text table, columns padded to their widest cell."""
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers)]
    lines = [
        " | ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)),
        "-|-".join("-" * w for w in widths),
        *(" | ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in rows),
    ]
    return "\n".join(line.rstrip() for line in lines)
