"""``shuffle_runtime.format.manifest``: manifests of each format version, their
statistics, and manifests that do not decode."""

from __future__ import annotations

import base64
from typing import Any

import numpy as np
import pytest
import zstandard

from shuffle_api import (
    PartitionCorruptedError,
    PartitionStatistics,
    ResultPartitionID,
    UnsupportedFormatVersionError,
)
from shuffle_runtime.format import Layouts, PartitionFileReader
from shuffle_runtime.format.manifest import MANIFEST_FILE, NO_STATISTICS, PartitionManifest
from shuffle_runtime.store import Store
from tests.unit.shuffle_runtime.format.partitions import (
    SPREAD_WRITES,
    edit_manifest,
    expected_keys,
    file_path,
    read_keys,
    rewrite,
    write_partition,
)

# --- statistics ----------------------------------------------------------------------------


def as_format_1(document: dict[str, Any], *, arrow_bytes: bool = True) -> None:
    """``document`` (a manifest of format 2) as format 1 wrote it: statistics as lists."""
    statistics = PartitionStatistics.decode(
        base64.b64decode(document.pop("statistics")), document["number_of_subpartitions"]
    )
    document["format_version"] = 1
    document["rows_per_subpartition"] = list(statistics.rows_per_subpartition)
    document["bytes_per_subpartition"] = list(statistics.bytes_per_subpartition)
    if arrow_bytes:
        document["arrow_bytes_per_subpartition"] = list(statistics.arrow_bytes_per_subpartition)


def test_a_manifest_of_format_1_reads_as_it_was_written(
    store: Store, partition: ResultPartitionID
) -> None:
    write_partition(store, partition, SPREAD_WRITES)
    written = PartitionFileReader(store, partition).manifest.statistics
    edit_manifest(store, partition, as_format_1)

    reader = PartitionFileReader(store, partition)

    assert reader.manifest.format_version == 1
    assert reader.manifest.statistics == written
    assert [read_keys(reader, s) for s in range(3)] == [
        expected_keys(SPREAD_WRITES, s) for s in range(3)
    ]


def test_a_manifest_without_arrow_bytes_takes_the_stored_bytes(
    store: Store, partition: ResultPartitionID
) -> None:
    write_partition(store, partition, SPREAD_WRITES)
    # As pyshuffle wrote manifests before 2026-11-26.
    edit_manifest(store, partition, lambda document: as_format_1(document, arrow_bytes=False))

    statistics = PartitionFileReader(store, partition).manifest.statistics

    assert statistics.arrow_bytes_per_subpartition == statistics.bytes_per_subpartition


def test_decoded_statistics_encode_to_the_bytes_they_came_from() -> None:
    """A worker passes each partition's statistics on as it received them, not encoded anew."""
    built = PartitionStatistics((4, 0, 7), (64, 0, 90), (48, 0, 80))
    # Another level than encode's: what a producer sent need not be what this one makes.
    columns = np.array([(4, 0, 7), (64, 0, 90), (48, 0, 80)], dtype="<i8").tobytes()
    received = zstandard.ZstdCompressor(level=19).compress(columns)
    decoded = PartitionStatistics.decode(received, 3)

    assert decoded == built and hash(decoded) == hash(built)
    assert decoded.encode() == received
    assert PartitionStatistics.decode(built.encode(), 3) == built


@pytest.mark.parametrize(
    "statistics",
    [
        pytest.param("not base64!", id="not-base64"),
        pytest.param(base64.b64encode(b"not zstd").decode(), id="not-zstd"),
        pytest.param(
            base64.b64encode(PartitionStatistics((1,), (2,), (3,)).encode()).decode(),
            id="other-subpartitions",
        ),
        pytest.param(
            base64.b64encode(zstandard.ZstdCompressor().compress(bytes(1 << 20))).decode(),
            id="declares-a-megabyte",
        ),
        pytest.param(None, id="missing"),
    ],
)
def test_manifest_with_bad_statistics_raises_partition_corrupted(
    store: Store, partition: ResultPartitionID, statistics: str | None
) -> None:
    write_partition(store, partition, SPREAD_WRITES)
    edit_manifest(store, partition, lambda document: document.update(statistics=statistics))

    with pytest.raises(PartitionCorruptedError, match=r"statistics|does not decode"):
        PartitionFileReader(store, partition)


def test_readers_of_data_neither_decode_nor_need_the_statistics(
    store: Store, partition: ResultPartitionID
) -> None:
    write_partition(store, partition, SPREAD_WRITES)
    edit_manifest(store, partition, lambda document: document.update(statistics="not base64!"))
    manifest_bytes = store.read_bytes(file_path(store, partition, MANIFEST_FILE))

    manifest = PartitionManifest.from_json(manifest_bytes, "fetched", statistics=False)
    reader = PartitionFileReader(store, partition, Layouts.MAPPED)

    assert manifest.statistics is NO_STATISTICS
    assert manifest.data_bytes > 0
    assert read_keys(reader, 1) == expected_keys(SPREAD_WRITES, 1)


# --- corruption ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "content",
    [
        pytest.param(b"{not json", id="not-json"),
        pytest.param(b"\xff\xfe\x00", id="not-utf8"),
        pytest.param(b"", id="empty"),
        pytest.param(b'{"format": "pyshuffle-partition"}', id="fields-missing"),
        pytest.param(b'{"format": "something-else", "format_version": 1}', id="other-format"),
        pytest.param(b"[]", id="json-array"),
        pytest.param(b"null", id="json-null"),
    ],
)
def test_corrupt_manifest_raises_partition_corrupted(
    store: Store, partition: ResultPartitionID, content: bytes
) -> None:
    write_partition(store, partition, SPREAD_WRITES)
    manifest_path = file_path(store, partition, MANIFEST_FILE)
    rewrite(store, manifest_path, content)

    with pytest.raises(PartitionCorruptedError) as caught:
        PartitionFileReader(store, partition)

    assert manifest_path in str(caught.value)


def test_truncated_manifest_raises_partition_corrupted(
    store: Store, partition: ResultPartitionID
) -> None:
    write_partition(store, partition, SPREAD_WRITES)
    manifest_path = file_path(store, partition, MANIFEST_FILE)
    rewrite(store, manifest_path, store.read_bytes(manifest_path)[:-40])

    with pytest.raises(PartitionCorruptedError):
        PartitionFileReader(store, partition)


def test_manifest_of_a_newer_format_version_is_unsupported(
    store: Store, partition: ResultPartitionID
) -> None:
    write_partition(store, partition, SPREAD_WRITES)
    edit_manifest(store, partition, lambda document: document.update(format_version=99))

    with pytest.raises(UnsupportedFormatVersionError) as caught:
        PartitionFileReader(store, partition)

    assert "99" in str(caught.value)
