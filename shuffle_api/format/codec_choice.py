"""The ``auto`` codec: whether compressing a partition pays, measured on its first batch.

Compression trades CPU for bytes. Each byte it saves is saved twice (written to the store,
read back by a consumer), at the speed of the slowest step it crosses: a disk or a network,
``shuffle.compression.auto.bandwidth`` per writer. The CPU cost is measured here, on this
machine and this data: a sample of the first batch is encoded plain and with each candidate
codec, and decoded back. The codec with the largest net saving wins; ``none`` when no codec
saves more time than it costs. The rule and its figures are in ``docs/format.md``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Final

import pyarrow as pa

__all__ = [
    "AUTO",
    "AUTO_CANDIDATES",
    "SAMPLE_BYTES",
    "CodecTrial",
    "choose_codec",
    "try_codec",
]

_LOG = logging.getLogger(__name__)

AUTO: Final = "auto"
AUTO_CANDIDATES: Final = ("lz4", "zstd")
SAMPLE_BYTES: Final = 1 << 20
"""At most this much of the first batch is tried: enough for stable timings (about a
millisecond per codec), little enough to cost nothing beside a partition's write."""

_TIMINGS: Final = 2  # the fastest of two: one pause of the machine does not decide


@dataclass(frozen=True, slots=True)
class CodecTrial:
    """One codec against plain storage, on one sample."""

    codec: str
    plain_bytes: int
    compressed_bytes: int
    cost_seconds: float
    """Extra seconds to encode and decode the sample with the codec, over doing it plain."""

    def net_seconds(self, bandwidth: int) -> float:
        """Seconds the codec saves on the sample (negative: it costs) at ``bandwidth`` bytes/s:
        the bytes it saves, moved twice, less its CPU cost."""
        saved = self.plain_bytes - self.compressed_bytes
        return 2 * saved / bandwidth - self.cost_seconds


def _round_trip(batch: pa.RecordBatch, codec: str, clock: Callable[[], float]) -> tuple[int, float]:
    """Bytes of ``batch`` as an IPC stream with ``codec``, and the fastest encode + decode."""
    options = pa.ipc.IpcWriteOptions(compression=None if codec == "none" else codec)
    best = float("inf")
    size = 0
    for _ in range(_TIMINGS):
        started = clock()
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, batch.schema, options=options) as writer:
            writer.write_batch(batch)
        encoded = sink.getvalue()
        pa.ipc.open_stream(encoded).read_all()
        best = min(best, clock() - started)
        size = encoded.size
    return size, best


def _sample(batch: pa.RecordBatch, sample_bytes: int) -> pa.RecordBatch:
    if batch.nbytes <= sample_bytes or batch.num_rows <= 1:
        return batch
    rows = max(1, batch.num_rows * sample_bytes // batch.nbytes)
    return batch.slice(0, rows)


def try_codec(
    batch: pa.RecordBatch,
    codec: str,
    *,
    sample_bytes: int = SAMPLE_BYTES,
    clock: Callable[[], float] = time.perf_counter,
) -> CodecTrial:
    """Encode and decode up to ``sample_bytes`` of ``batch`` plain and with ``codec``."""
    sample = _sample(batch, sample_bytes)
    plain_bytes, plain_seconds = _round_trip(sample, "none", clock)
    compressed_bytes, seconds = _round_trip(sample, codec, clock)
    return CodecTrial(codec, plain_bytes, compressed_bytes, max(0.0, seconds - plain_seconds))


def choose_codec(
    setting: str,
    first_batch: pa.RecordBatch,
    bandwidth: int,
    *,
    candidates: Sequence[str] = AUTO_CANDIDATES,
    clock: Callable[[], float] = time.perf_counter,
) -> str:
    """The codec to store with: ``setting`` itself unless it is :data:`AUTO`."""
    if setting != AUTO:
        return setting
    trials = [try_codec(first_batch, codec, clock=clock) for codec in candidates]
    best = max(trials, key=lambda trial: trial.net_seconds(bandwidth))
    chosen = best.codec if best.net_seconds(bandwidth) > 0 else "none"
    _LOG.debug(
        "auto codec: %s (%s at %d bytes/s)",
        chosen,
        ", ".join(
            f"{t.codec} {t.compressed_bytes}/{t.plain_bytes} bytes, {t.cost_seconds * 1e3:.2f} ms"
            for t in trials
        ),
        bandwidth,
    )
    return chosen
