"""Codecs: the Arrow IPC write options of each, and the ``auto`` codec, which decides whether
compressing a partition pays, measured on its first batch.

Compression trades CPU for bytes. Each byte it saves is saved twice (written to the store,
read back by a consumer), at the speed of the slowest step it crosses: a disk or a network,
``shuffle.compression.auto.bandwidth`` per writer. The CPU cost is measured here, on this
machine and this data: a sample of the first batch is encoded as Arrow IPC plain and with
each candidate codec, and decoded back. The codec with the largest net saving wins; ``none``
when no codec saves more time than it costs. The rule and its figures are in ``docs/format.md``.
"""

from __future__ import annotations

import logging
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Final

import pyarrow as pa

from shuffle_api.errors import ShuffleError
from shuffle_runtime.format.manifest import CODECS

__all__ = [
    "AUTO",
    "AUTO_CANDIDATES",
    "SAMPLE_BYTES",
    "TRIAL_SECONDS",
    "CodecTrial",
    "choose_codec",
    "ipc_write_options",
    "try_codecs",
]

_LOG = logging.getLogger(__name__)

AUTO: Final = "auto"
AUTO_CANDIDATES: Final = ("lz4",)
"""zstd saves more bytes at twice lz4's CPU or more: it wins on slow links only, where a
fixed ``zstd`` is the better setting; trying it too would double the trial."""
SAMPLE_BYTES: Final = 512 << 10
"""At most this much of the first batch is tried: enough to amortize a codec's fixed cost per
buffer and for stable timings (about a millisecond each), little enough to cost next to
nothing beside a partition's write (about 2 ms for the whole trial, on the spill thread)."""

TRIAL_SECONDS: Final = 0.001
"""About the least a trial costs (on the 2-core development machine: 0.7 ms on a batch of 5
rows, 1.2 ms on 80 KB, 2 ms on the whole sample): a partition whose bytes, all saved and moved
twice, are worth less than this at the bandwidth is stored plain without a trial."""

_TIMINGS: Final = 3
"""Each encoding is timed this many times, interleaved, and the median kept: one pause of the
machine, or one lucky run, must not decide a sub-millisecond timing."""


def ipc_write_options(codec: str) -> pa.ipc.IpcWriteOptions:
    """How Arrow IPC writes with one of the stored :data:`CODECS`."""
    if codec not in CODECS:
        raise ShuffleError(f"unknown codec {codec!r}; choose one of {', '.join(CODECS)}")
    return pa.ipc.IpcWriteOptions(compression=None if codec == "none" else codec)


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
    """Bytes of ``batch`` as an IPC stream with ``codec``, and seconds to encode and decode it
    (into fresh buffers, as a writer and a reader do)."""
    options = ipc_write_options(codec)
    started = clock()
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, batch.schema, options=options) as writer:
        writer.write_batch(batch)
    encoded = sink.getvalue()
    pa.ipc.open_stream(encoded).read_all()
    return encoded.size, clock() - started


def try_codecs(
    batch: pa.RecordBatch,
    codecs: Sequence[str],
    *,
    sample_bytes: int = SAMPLE_BYTES,
    clock: Callable[[], float] = time.perf_counter,
) -> list[CodecTrial]:
    """Encode and decode up to ``sample_bytes`` of ``batch`` plain and with each codec, each
    :data:`_TIMINGS` times, interleaved; a codec's cost is its median over plain's."""
    if batch.nbytes > sample_bytes and batch.num_rows > 1:
        batch = batch.slice(0, max(1, batch.num_rows * sample_bytes // batch.nbytes))
    encodings = ("none", *codecs)
    seconds: dict[str, list[float]] = {codec: [] for codec in encodings}
    sizes = dict.fromkeys(encodings, 0)
    for _ in range(_TIMINGS):
        for codec in encodings:
            sizes[codec], taken = _round_trip(batch, codec, clock)
            seconds[codec].append(taken)
    plain = statistics.median(seconds["none"])
    return [
        CodecTrial(
            codec, sizes["none"], sizes[codec], max(0.0, statistics.median(seconds[codec]) - plain)
        )
        for codec in codecs
    ]


def choose_codec(
    setting: str,
    first_batch: pa.RecordBatch,
    bandwidth: int,
    *,
    known_bytes: int | None = None,
    candidates: Sequence[str] = AUTO_CANDIDATES,
    clock: Callable[[], float] = time.perf_counter,
) -> str:
    """The codec to store with: ``setting`` itself unless it is :data:`AUTO`. ``known_bytes``:
    what the partition holds at least (its first region), when the writer knows it."""
    if setting != AUTO:
        return setting
    if known_bytes is not None and 2 * known_bytes / bandwidth < TRIAL_SECONDS:
        return "none"  # no codec could save what the trial costs
    trials = try_codecs(first_batch, candidates, clock=clock)
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
