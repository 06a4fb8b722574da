"""A merged partition fetched from a worker: its runs as stored, its manifest without the list
of its sources (thousands of map outputs name hundreds of KB, which no reducer needs and each
would receive and decode with every fetch)."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import xxhash

from external_shuffle.wire.messages import key_of
from shuffle_api import IntermediateResultPartitionID, ResultPartitionID, new_id
from shuffle_runtime.format import (
    PartitionFileReader,
    StoreSink,
    merge_partitions,
    partition_directory,
)
from shuffle_runtime.format.manifest import MANIFEST_FILE, PartitionManifest
from shuffle_runtime.store import Store, write_all
from tests.reliability.raw_worker import build_partition, fetch_all, serving

SOURCES = 6


def _stored(store: Store, rows: int) -> tuple[ResultPartitionID, list[int]]:
    built = build_partition(rows=rows)
    sink = StoreSink(store, built.partition)
    data = sink.open_data()
    write_all(data, built.data)
    data.close()
    sink.commit(built.index, built.manifest)
    return built.partition, built.rows


def test_a_merged_partition_is_fetched_whole_without_its_sources(tmp_path: Path) -> None:
    store = Store(str(tmp_path / "store"))
    sources = [_stored(store, rows=500 + 100 * number) for number in range(SOURCES)]
    merged_id = ResultPartitionID(IntermediateResultPartitionID("merged", 0), "merge-" + new_id())
    merged = merge_partitions([(store, source) for source, _ in sources], store, merged_id)
    stored = store.read_bytes(store.child(partition_directory(store, merged_id), MANIFEST_FILE))

    with serving(store) as (_, stub, _):  # it finds the partitions on its store
        manifest_bytes, runs = fetch_all(stub, key_of(merged_id), [])

    assert b"merged_from" in stored
    assert b"merged_from" not in manifest_bytes
    manifest = PartitionManifest.from_json(manifest_bytes, "fetched")
    assert manifest.merged_from == ()
    assert manifest.schema is not None
    assert manifest.statistics == merged.statistics
    assert manifest.data_bytes == PartitionFileReader(store, merged_id).manifest.data_bytes
    rows: list[int] = []
    for data, checksum in runs:
        assert xxhash.xxh3_64_intdigest(data) == checksum
        stream = pa.py_buffer(manifest.schema.serialize().to_pybytes() + data)
        rows += pa.ipc.open_stream(stream).read_all().column("row").to_pylist()
    assert sorted(rows) == sorted(row for _, source_rows in sources for row in source_rows)
