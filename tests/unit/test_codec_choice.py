"""The ``auto`` codec: the rule, the measured trial, and the writer storing with its choice."""

from __future__ import annotations

import itertools
import uuid
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from shuffle_api import IntermediateResultPartitionID, ResultPartitionID, SubpartitionRange
from shuffle_runtime.format import PartitionFileReader, PartitionFileWriter, StoreSink
from shuffle_runtime.format.codec_choice import CodecTrial, choose_codec, try_codecs
from shuffle_runtime.store import Store

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


def ticking_clock(step: float) -> itertools.count[float]:
    return itertools.count(0.0, step)


def test_the_rule_weighs_bytes_saved_twice_against_the_cpu_they_cost() -> None:
    trial = CodecTrial("lz4", plain_bytes=1_000_000, compressed_bytes=400_000, cost_seconds=0.001)

    assert trial.net_seconds(1_000_000_000) == pytest.approx(2 * 600_000 / 1e9 - 0.001)
    # Break-even at 1.2 GB/s: slower links make it pay, faster ones do not.
    assert trial.net_seconds(600_000_000) > 0
    assert trial.net_seconds(2_000_000_000) < 0


def test_a_trial_measures_the_codec_on_a_sample_of_the_batch() -> None:
    batch = compressible(200_000)

    trial, other = try_codecs(batch, ("lz4", "zstd"), sample_bytes=256 << 10)

    assert (trial.codec, other.codec) == ("lz4", "zstd")
    assert other.plain_bytes == trial.plain_bytes
    assert 256 << 10 <= trial.plain_bytes < 320 << 10  # the sample, with IPC framing
    assert trial.compressed_bytes < trial.plain_bytes // 4
    assert trial.cost_seconds >= 0


def test_an_explicit_codec_is_kept_without_a_trial() -> None:
    def no_clock() -> float:
        raise AssertionError("an explicit codec must not be measured")

    for codec in ("none", "lz4", "zstd"):
        assert choose_codec(codec, compressible(), 1 * MIB, clock=no_clock) == codec


def test_auto_stores_incompressible_data_plain() -> None:
    # Even at a slow 1 MiB/s nothing is saved, so nothing can pay for the CPU.
    assert choose_codec("auto", incompressible(), 1 * MIB) == "none"


def test_auto_compresses_compressible_data() -> None:
    # At 64 MiB/s, the 400 kB lz4 saves of the 512 KiB sample are worth 12 ms: far more than
    # lz4 costs, even on a loaded machine (at the default 256 MiB/s, 3 ms).
    assert choose_codec("auto", compressible(), 64 * MIB) in ("lz4", "zstd")


def test_auto_follows_the_bandwidth_the_saving_is_weighed_at() -> None:
    # Every encode + decode takes one tick: with zstd costing as much as plain, any saving pays.
    free = ticking_clock(0.001)
    assert choose_codec("auto", compressible(), 1 << 40, clock=lambda: next(free)) != "none"
    # zstd costs more CPU than plain storage, measured: a fast enough link makes it not pay.
    assert choose_codec("auto", compressible(), 1 * MIB, candidates=("zstd",)) == "zstd"
    assert choose_codec("auto", compressible(), 1 << 40, candidates=("zstd",)) == "none"


@pytest.mark.parametrize(
    ("batch", "expected"),
    [(incompressible(), ("none",)), (compressible(), ("lz4", "zstd"))],
    ids=["incompressible", "compressible"],
)
def test_the_writer_stores_with_the_codec_auto_chose(
    tmp_path: Path, batch: pa.RecordBatch, expected: tuple[str, ...]
) -> None:
    store = Store(str(tmp_path / "store"))
    partition = ResultPartitionID(IntermediateResultPartitionID("result-1", 0), uuid.uuid4().hex)
    writer = PartitionFileWriter(
        StoreSink(store, partition), 2, codec="auto", memory_budget=MIB, auto_bandwidth=64 * MIB
    )
    writer.add(0, batch)
    writer.add(1, batch.slice(0, 10))
    writer.commit()

    reader = PartitionFileReader(store, partition)

    assert reader.manifest.codec in expected
    back = pa.Table.from_batches(list(reader.read(SubpartitionRange(0, 1))))
    assert back.num_rows == batch.num_rows + 10
    assert pc.sum(back.column("key")).as_py() == (
        pc.sum(batch.column("key")).as_py() + pc.sum(batch.column("key").slice(0, 10)).as_py()
    )
    assert back.slice(0, batch.num_rows).equals(pa.Table.from_batches([batch]))
