"""``pyspark_shuffle.kernels.partitioners``: hash and range partitioners, checked against
a plain-Python reference of Spark's order, and the boundaries a sample gives."""

from __future__ import annotations

import itertools
import random
from collections import Counter
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from pyspark_shuffle.kernels.partitioners import (
    HashPartitioner,
    RangePartitioner,
    choose_boundaries,
)
from pyspark_shuffle.kernels.sorting import SortKey
from shuffle_api import InvalidOperationError
from tests.unit.pyspark_shuffle.kernels.spark_reference import NAN, _spark_key


def test_hash_partitioner_keeps_equal_keys_together_in_range() -> None:
    rng = random.Random(7)
    keys = [rng.randrange(500) if rng.random() > 0.05 else None for _ in range(20_000)]
    batch = pa.record_batch({"k": pa.array(keys, pa.int64()), "v": pa.array(range(20_000))})
    partitioner = HashPartitioner(("k",), 13)
    indexes = partitioner.subpartitions(batch)
    assert indexes.dtype == np.int64
    assert len(indexes) == 20_000
    assert indexes.min() >= 0
    assert indexes.max() < 13
    home: dict[int | None, int] = {}
    for key, index in zip(keys, indexes.tolist(), strict=True):
        assert home.setdefault(key, index) == index
    # 500 distinct keys spread over every subpartition, none with more than twice its share.
    counts = Counter(home.values())
    assert len(counts) == 13
    assert max(counts.values()) < 2 * 500 / 13
    # The same keys as int32 in another batch (the other side of a join) go to the same place.
    other = pa.record_batch({"k": pa.array(keys[:100], pa.int32())})
    assert partitioner.subpartitions(other).tolist() == indexes[:100].tolist()


def test_hash_partitioner_names_a_count_of_partitions_it_cannot_hash_into() -> None:
    for count in (0, -1, (1 << 32) + 1):
        with pytest.raises(InvalidOperationError, match=f"got {count}"):
            HashPartitioner(("k",), count)
    # The most it can: every index still below the count.
    indexes = HashPartitioner(("k",), 1 << 32).subpartitions(pa.record_batch({"k": range(1000)}))
    assert indexes.min() >= 0 and indexes.max() < 1 << 32
    assert len(set(indexes.tolist())) == 1000


def test_partitioners_name_a_missing_key_column() -> None:
    batch = pa.record_batch({"k": [1, 2]})
    with pytest.raises(InvalidOperationError, match="'nope'"):
        HashPartitioner(("nope",), 4).subpartitions(batch)
    with pytest.raises(InvalidOperationError, match="'nope'"):
        RangePartitioner((SortKey("nope"),), pa.table({"nope": [1]}), 2).subpartitions(batch)


def _sample(rows: int, seed: int) -> pa.Table:
    rng = random.Random(seed)
    return pa.table(
        {
            "a": pa.array([rng.randrange(20) if rng.random() > 0.1 else None for _ in range(rows)]),
            "b": pa.array([rng.choice(["x", "y", "z", None]) for _ in range(rows)]),
        }
    )


@pytest.mark.parametrize(
    "keys",
    [
        (SortKey("a"),),
        (SortKey("a", ascending=False),),
        (SortKey("a"), SortKey("b", ascending=False)),
        (SortKey("b", ascending=False), SortKey("a")),
    ],
    ids=["a", "a-desc", "a-b-desc", "b-desc-a"],
)
def test_range_partitioner_orders_subpartitions(keys: tuple[SortKey, ...]) -> None:
    sample = _sample(2_000, seed=1).select([key.column for key in keys])  # as SparkShuffle
    boundaries = choose_boundaries(sample, keys, 8)
    assert 1 <= boundaries.num_rows <= 7
    bounds = [_spark_key(row, keys) for row in boundaries.to_pylist()]
    assert all(before < after for before, after in itertools.pairwise(bounds)), "not increasing"

    data = _sample(5_000, seed=2)
    partitioner = RangePartitioner(keys, boundaries, 8)
    indexes = partitioner.subpartitions(data.to_batches()[0]).tolist()
    assert min(indexes) >= 0
    assert max(indexes) < 8
    rows = data.to_pylist()
    home: dict[tuple[Any, ...], int] = {}
    for row, index in zip(rows, indexes, strict=True):
        key = _spark_key(row, keys)
        assert home.setdefault(key, index) == index, "equal keys split"
        # Within its subpartition's bounds: boundary[i-1] <= key < boundary[i].
        if index > 0:
            assert not key < bounds[index - 1]
        if index < len(bounds):
            assert key < bounds[index]
    ordered = sorted(zip(rows, indexes, strict=True), key=lambda pair: _spark_key(pair[0], keys))
    assert [index for _, index in ordered] == sorted(indexes)
    assert len(set(indexes)) > 3


def test_range_partitioner_accepts_boundaries_of_another_arrow_type() -> None:
    boundaries = pa.table({"a": pa.array([10, 20], pa.int32())})
    batch = pa.record_batch({"a": pa.array([5, 10, 15, 20, 25, None], pa.int64())})
    indexes = RangePartitioner((SortKey("a"),), boundaries, 3).subpartitions(batch).tolist()
    assert indexes == [0, 1, 1, 2, 2, 0]


def test_choose_boundaries_edge_cases() -> None:
    keys = (SortKey("a"),)
    empty = choose_boundaries(pa.table({"a": pa.array([], pa.int64())}), keys, 8)
    assert empty.num_rows == 0
    assert choose_boundaries(pa.table({"a": [3, 1, 2]}), keys, 1).num_rows == 0
    same = choose_boundaries(pa.table({"a": [5] * 100}), keys, 8)
    assert same.to_pylist() == [{"a": 5}]
    few = choose_boundaries(pa.table({"a": [2, 1]}), keys, 8)
    assert few.column("a").to_pylist() == sorted(set(few.column("a").to_pylist()))
    floats = choose_boundaries(pa.table({"a": [NAN, 1.0, None, 2.0] * 10}), keys, 4)
    assert [_spark_key(row, keys) for row in floats.to_pylist()] == sorted(
        _spark_key(row, keys) for row in floats.to_pylist()
    )
