"""``pyspark_shuffle.tasks.map_reduce``: a map report's sizes and schema, and reports merged
in place."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from pyspark_shuffle.tasks.map_reduce import MapReport, merge_map_reports
from scheduling.map_sizes import MapSizes
from shuffle_api import PartitionStatistics


@pytest.mark.parametrize("subpartitions", [0, 1, 4_000])
def test_a_map_report_gives_back_its_sizes_and_schema(subpartitions: int) -> None:
    rng = np.random.default_rng(subpartitions)
    rows = rng.integers(0, 10, subpartitions).tolist()
    written = (rng.integers(0, 2**40, subpartitions) * 7).tolist()
    statistics = PartitionStatistics(tuple(rows), tuple(written), tuple(w + 3 for w in written))
    schema = pa.schema({"k": pa.int64(), "tags": pa.map_(pa.string(), pa.int32())})
    report = MapReport.of(statistics, schema)
    assert report.map_sizes() == MapSizes.of(statistics)
    assert report.schema() == schema
    assert MapReport.of(statistics, None).schema() is None


def test_a_map_report_does_not_grow_with_subpartitions_all_written() -> None:
    counts = tuple(int(n) for n in np.random.default_rng(1).integers(1, 8, 4_000))
    report = MapReport.of(PartitionStatistics(counts, counts, counts), None)
    assert len(report.sizes) < 100


def test_map_reports_merge_in_place_keeping_every_attempt() -> None:
    empty = PartitionStatistics((), (), ())
    first, second = (
        MapReport.of(empty, None),
        MapReport.of(PartitionStatistics((1,), (2,), (3,)), None),
    )
    merged: dict[tuple[int, str], MapReport] = {}
    total = merged
    for update in ({(0, "task-1"): first}, {(0, "task-2"): second}, {(1, "task-3"): first}):
        total = merge_map_reports(total, update)
    assert total is merged  # in place: M reports cost O(M), not O(M^2)
    assert merged == {(0, "task-1"): first, (0, "task-2"): second, (1, "task-3"): first}
