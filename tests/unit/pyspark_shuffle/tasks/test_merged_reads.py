"""``pyspark_shuffle.tasks.merged_reads``: a reducer's read of merged partitions on the real
default service (in-process, a local store): the rows of its sources in the same order; a
merged partition deleted, or corrupt part-way through, read from its sources instead, every
row once; past the rows it holds, a failure fails the read."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest

from netty_like.descriptor import NettyShuffleDescriptor
from pyspark_shuffle.tasks import merged_reads
from pyspark_shuffle.tasks.merged_reads import MergedSources, input_gates
from shuffle_api import (
    ChecksumMismatchError,
    Configuration,
    InputGateDeploymentDescriptor,
    ResultPartitionDeploymentDescriptor,
    ResultPartitionType,
    ShuffleDescriptor,
    ShuffleIOOwner,
    SubpartitionRange,
)
from shuffle_api.testing import ConformanceHarness, ShuffleScenario, make_batches
from shuffle_runtime.format import partition_directory, reader
from shuffle_runtime.format.manifest import DATA_FILE
from shuffle_runtime.store import Store

SOURCES = 6
SUBPARTITIONS = 3
EVERY = SubpartitionRange(0, SUBPARTITIONS - 1)


@pytest.fixture(autouse=True)
def a_run_a_read(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each run of a partition read on its own (not 8 MiB of neighbours at once), so that a
    corrupt run is found after the runs before it were passed on."""
    monkeypatch.setattr(reader, "_MAX_RANGE_BYTES", 1)


@pytest.fixture
def scenario(tmp_path: Path) -> Iterator[ShuffleScenario]:
    config = Configuration.load(
        {"netty-like.storage.url": str(tmp_path / "store"), "netty-like.sort-buffer.size": "4m"},
        environ={},
    )
    with ShuffleScenario.open(ConformanceHarness(config, merges=True)) as opened:
        yield opened


def _merged(
    scenario: ShuffleScenario,
) -> tuple[list[ShuffleDescriptor], ShuffleDescriptor, MergedSources]:
    """Map outputs 0..5; 1..4 merged into partition 6 (0 and 5 left as they are)."""
    outputs, _ = scenario.produce(
        make_batches(12_000, batch_rows=500), partitions=SOURCES, subpartitions=SUBPARTITIONS
    )
    descriptor = scenario.partition_descriptor(
        SOURCES, partitions=SOURCES + 1, subpartitions=SUBPARTITIONS
    )
    merged = scenario.register(descriptor)
    sources = tuple(outputs[1:5])
    written = scenario.producer.merge_partitions(
        ShuffleIOOwner("merge", merged.result_partition_id.producer_attempt_id),
        sources,
        ResultPartitionDeploymentDescriptor(descriptor, merged),
    )
    assert written is not None
    return outputs, merged, {merged.result_partition_id: sources}


def _rows(
    scenario: ShuffleScenario, read: list[ShuffleDescriptor], sources: MergedSources
) -> list[int]:
    descriptor = InputGateDeploymentDescriptor(
        scenario.result_id, ResultPartitionType.BLOCKING, EVERY, tuple(read)
    )
    [gate] = input_gates(scenario.consumer, ShuffleIOOwner("reducer", "r-1"), [descriptor], sources)
    with gate:
        table = pa.Table.from_batches(list(gate))
    rows: list[int] = table.column("row").to_pylist()
    return rows


def _unmerged(scenario: ShuffleScenario, outputs: list[ShuffleDescriptor]) -> list[int]:
    return _rows(scenario, outputs, {})


def _damage(scenario: ShuffleScenario, merged: ShuffleDescriptor, how: str) -> None:
    if how == "deleted":
        scenario.lose(merged)
        return
    assert isinstance(merged, NettyShuffleDescriptor)
    store = Store(merged.store_url)
    data = Path(partition_directory(store, merged.result_partition_id)) / DATA_FILE
    content = bytearray(data.read_bytes())
    content[-len(content) // 4] ^= 0xFF  # in a late run: earlier ones read well
    data.write_bytes(bytes(content))


def test_a_merged_partition_reads_as_its_sources(scenario: ShuffleScenario) -> None:
    outputs, merged, sources = _merged(scenario)
    read = [outputs[0], merged, outputs[5]]
    assert sorted(_rows(scenario, read, sources)) == sorted(_unmerged(scenario, outputs))
    assert len(_rows(scenario, read, sources)) == 12_000


@pytest.mark.parametrize("how", ["deleted", "corrupt"])
def test_a_merged_partition_that_fails_is_read_from_its_sources(
    scenario: ShuffleScenario, how: str
) -> None:
    outputs, merged, sources = _merged(scenario)
    read = [outputs[0], merged, outputs[5]]
    expected = sorted(_rows(scenario, read, sources))
    _damage(scenario, merged, how)
    got = _rows(scenario, read, sources)
    assert sorted(got) == expected  # every row once: none of the merged one's twice
    assert len(got) == len(set(got)) == 12_000


def test_past_the_rows_it_holds_a_corrupt_merged_partition_fails_the_read(
    scenario: ShuffleScenario, monkeypatch: pytest.MonkeyPatch
) -> None:
    outputs, merged, sources = _merged(scenario)
    monkeypatch.setattr(merged_reads, "MAX_HELD_BYTES", 1)  # each batch passed on at once
    _damage(scenario, merged, "corrupt")
    with pytest.raises(ChecksumMismatchError):
        _rows(scenario, [outputs[0], merged, outputs[5]], sources)
