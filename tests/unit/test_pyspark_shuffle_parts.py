"""The Spark-free parts of pyspark_shuffle: hashing, partitioners, reducer planning, the reduce
operations and sorting, each checked against a plain-Python reference of Spark's semantics."""

from __future__ import annotations

import decimal
import itertools
import math
import random
import struct
import tracemalloc
from collections import Counter
from collections.abc import Hashable, Iterable, Iterator, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from pyspark_shuffle.kernels.hashing import hash_keys
from pyspark_shuffle.kernels.operations import GroupApply, Join, PassThrough, SortWithin, group_ids
from pyspark_shuffle.kernels.partitioners import (
    HashPartitioner,
    RangePartitioner,
    choose_boundaries,
)
from pyspark_shuffle.kernels.planning import (
    MapOutputBytes,
    adaptive_plan,
    codec_neutral_bytes,
    map_task_count,
    one_reducer_per_map_task,
    one_reducer_per_subpartition,
)
from pyspark_shuffle.kernels.sorting import SortKey, sort_indices, sort_keys_of
from pyspark_shuffle.spark.internals import estimated_bytes
from pyspark_shuffle.tasks.map_reduce import MapReport, merge_map_reports
from scheduling.map_sizes import MapSizes
from scheduling.skew import ConsumerTask, InputSlice, ProducerRange
from shuffle_api import (
    Configuration,
    InvalidOperationError,
    PartitionStatistics,
    SubpartitionRange,
)

NAN = float("nan")


def _hashes(*columns: pa.Array | pa.ChunkedArray) -> list[int]:
    return [int(value) for value in hash_keys(list(columns))]


def _batches(table: pa.Table, rows: int = 3) -> Iterator[pa.RecordBatch]:
    return iter(table.to_batches(max_chunksize=rows))


def _run(operation: Any, *tables: pa.Table) -> pa.Table:
    schemas = [table.schema for table in tables]
    batches = list(operation.apply([_batches(table) for table in tables], schemas))
    result: pa.Table = pa.Table.from_batches(batches) if batches else pa.table({})
    return result


def _canonical(value: object) -> Hashable:
    """A hashable stand-in equal for values Spark considers equal in a result (NaN = NaN)."""
    if isinstance(value, float) and math.isnan(value):
        return ("NaN",)
    if isinstance(value, float) and value == 0.0:
        return 0.0
    if isinstance(value, list):
        return tuple(_canonical(each) for each in value)
    if isinstance(value, dict):
        return tuple(sorted((key, _canonical(each)) for key, each in value.items()))
    return value


def _multiset(rows: Iterable[dict[str, Any]]) -> Counter[Hashable]:
    return Counter(_canonical(row) for row in rows)


# -- hashing -------------------------------------------------------------------------------


def test_integers_of_every_width_hash_alike() -> None:
    values = [0, 1, -1, 127, -128, None, 42]
    expected = _hashes(pa.array(values, pa.int64()))
    for data_type in (pa.int8(), pa.int16(), pa.int32()):
        assert _hashes(pa.array(values, data_type)) == expected, data_type
    unsigned = [0, 1, 200, None]
    assert _hashes(pa.array(unsigned, pa.uint8())) == _hashes(pa.array(unsigned, pa.int64()))


def test_null_differs_from_zero_and_all_nulls_hash_alike() -> None:
    hashes = _hashes(pa.array([None, 0, None], pa.int64()))
    assert hashes[0] == hashes[2] != hashes[1]
    assert _hashes(pa.array([None], pa.int32())) == _hashes(pa.array([None], pa.string()))


@pytest.mark.parametrize(
    "array",
    [
        pa.array(list(range(-20, 20)), pa.int64()),
        pa.array([f"value {i}" if i % 7 else ("" if i % 2 else None) for i in range(40)]),
        pa.array(
            [decimal.Decimal(i) / 4 if i % 5 else None for i in range(40)], pa.decimal128(9, 2)
        ),
        pa.array([i / 3 if i % 6 else None for i in range(40)], pa.float64()),
        pa.array([f"large {i}" for i in range(40)], pa.large_string()),
        pa.array([bytes([i, i + 1]) for i in range(40)], pa.binary()),
    ],
    ids=["int64", "string", "decimal", "float", "large_string", "binary"],
)
def test_a_slice_hashes_as_the_same_rows_of_the_whole_array(array: pa.Array) -> None:
    whole = _hashes(array)
    for offset, length in [(0, 40), (3, 17), (13, 1), (39, 1), (5, 0)]:
        assert _hashes(array.slice(offset, length)) == whole[offset : offset + length]
    chunked = pa.chunked_array([array.slice(0, 11), array.slice(11)])
    assert _hashes(chunked) == whole


def test_strings_hash_by_value_whatever_their_encoding() -> None:
    values = ["", "a", "ab", "ba", "a\x00", None, "ü", "a" * 100, ""]
    hashes = _hashes(pa.array(values, pa.string()))
    assert hashes == _hashes(pa.array(values, pa.large_string()))
    assert hashes == _hashes(pa.array(values, pa.string()).dictionary_encode())
    assert hashes[0] == hashes[-1]  # equal empty strings
    distinct = {hashes[index] for index, value in enumerate(values[:-1])}
    assert len(distinct) == len(values) - 1  # "", null, "a", "a\0", "ab", "ba" ... all differ


def test_all_empty_strings_and_all_null_strings() -> None:
    empties = _hashes(pa.array(["", "", ""]))
    assert len(set(empties)) == 1
    nulls = _hashes(pa.array([None, None], pa.string()))
    assert len(set(nulls)) == 1
    assert nulls[0] != empties[0]


def test_decimals_hash_by_value_across_precisions() -> None:
    values = [decimal.Decimal("1.50"), decimal.Decimal("-3.25"), None, decimal.Decimal("0.00")]
    narrow = _hashes(pa.array(values, pa.decimal128(5, 2)))
    wide = _hashes(pa.array(values, pa.decimal128(30, 2)))
    assert narrow == wide
    assert len(set(narrow)) == 4


def test_floats_treat_negative_zero_and_every_nan_as_one_value() -> None:
    other_nan = np.frombuffer(np.uint64(0x7FF8000000000001).tobytes(), dtype=np.float64)[0]
    assert math.isnan(other_nan)
    values = pa.array([0.0, -0.0, NAN, other_nan, -NAN, 1.5, None], pa.float64())
    hashes = _hashes(values)
    assert hashes[0] == hashes[1]
    assert hashes[2] == hashes[3] == hashes[4]
    assert len({hashes[0], hashes[2], hashes[5], hashes[6]}) == 4
    floats32 = pa.array([0.0, -0.0, NAN, 1.5, None], pa.float32())
    assert _hashes(floats32) == [hashes[0], hashes[1], hashes[2], hashes[5], hashes[6]]


def test_temporal_keys_hash_and_unsupported_types_are_refused() -> None:
    timestamps = pa.array([0, 1_000_000, None], pa.timestamp("us", tz="UTC"))
    assert _hashes(timestamps) == _hashes(pa.array([0, 1_000_000, None], pa.int64()))
    dates = pa.array([0, 19_000, None], pa.date32())
    assert _hashes(dates) == _hashes(pa.array([0, 19_000, None], pa.int64()))
    with pytest.raises(InvalidOperationError, match="cannot be a shuffle key"):
        hash_keys([pa.array([[("a", 1)]], pa.map_(pa.string(), pa.int64()))])
    with pytest.raises(InvalidOperationError):
        hash_keys([])


def test_multi_column_keys_hash_equal_rows_alike() -> None:
    first = pa.array([1, 1, 2, 1, None, None], pa.int32())
    second = pa.array(["x", "x", "x", "y", "x", "x"])
    hashes = _hashes(first, second)
    assert hashes[0] == hashes[1]
    assert hashes[4] == hashes[5]
    assert len({hashes[0], hashes[2], hashes[3], hashes[4]}) == 4
    assert _hashes(pa.array([1, 1], pa.int64()), second.slice(0, 2)) == hashes[:2]


# -- partitioners ---------------------------------------------------------------------------


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


def _spark_key(row: dict[str, Any], keys: Sequence[SortKey]) -> tuple[Any, ...]:
    """Spark's order for a row: null smallest, NaN largest; descending negates the rank."""
    parts: list[Any] = []
    for key in keys:
        value = row[key.column]
        if value is None:
            rank: tuple[Any, ...] = (0,)
        elif isinstance(value, float) and math.isnan(value):
            rank = (2,)
        else:
            rank = (1, value)
        parts.append(_Ordered(rank, key.ascending))
    return tuple(parts)


class _Ordered:
    def __init__(self, rank: tuple[Any, ...], ascending: bool) -> None:
        self.rank, self.ascending = rank, ascending

    def __lt__(self, other: _Ordered) -> bool:
        return self.rank < other.rank if self.ascending else other.rank < self.rank

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Ordered) and self.rank == other.rank

    def __hash__(self) -> int:
        return hash(self.rank)


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


# -- planning -------------------------------------------------------------------------------


def test_fixed_reducers_read_one_subpartition_of_every_map_task_each() -> None:
    left = np.array([[1, 2, 3], [4, 5, 6]], dtype=np.int64)
    right = np.array([[10, 0, 0]], dtype=np.int64)
    plan = one_reducer_per_subpartition([left, right])
    assert [task.bytes for task in plan.tasks] == [15, 7, 9]
    assert plan.tasks[1].inputs == (
        InputSlice(SubpartitionRange.single(1), ProducerRange(0, 1)),
        InputSlice(SubpartitionRange.single(1), ProducerRange(0, 0)),
    )
    assert plan.skewed == plan.unsplittable == ()


def test_adaptive_plan_takes_its_bounds_and_skew_limits_from_the_configuration() -> None:
    # 4 map tasks x 8 subpartitions of 10 bytes, but subpartition 5 holds 400 (100 per map).
    matrix = np.full((4, 8), 10, dtype=np.int64)
    matrix[:, 5] = 100
    configuration = Configuration.load(
        {
            "pyspark-shuffle.reducer.target-size": "100",
            "pyspark-shuffle.reducer.min-count": "1",
            "scheduling.skew.threshold": "200",
        }
    )
    split = adaptive_plan(configuration, [matrix], [True], default_parallelism=2)
    assert split.skewed == (5,) and split.unsplittable == ()
    # Subpartition 5 read by 4 reducers, one map task each; the others coalesced.
    assert sorted(t.inputs[0].producers.start for t in split.tasks if t.bytes == 100) == [
        0, 1, 2, 3,
    ]  # fmt: skip
    assert max(task.bytes for task in split.tasks) == 100
    whole = adaptive_plan(configuration, [matrix], [False], default_parallelism=2)
    assert whole.unsplittable == (5,)
    assert max(task.bytes for task in whole.tasks) == 400


def test_map_tasks_that_stored_the_same_rows_with_different_codecs_weigh_alike() -> None:
    # Four map tasks wrote the same rows to subpartition 1 (skewed) and a few to the 7
    # others; tasks 0 and 1 compressed theirs to a third. Split by stored bytes, one reducer
    # would read the rows of tasks 0 and 1 together, twice those of each other reducer.
    arrow = np.full((4, 8), 300, dtype=np.int64)
    arrow[:, 1] = 30_000
    stored = arrow.copy()
    stored[:2] //= 3
    weighed = codec_neutral_bytes(stored, arrow, int(stored.sum()), int(arrow.sum()))
    assert (weighed[:, 1] == weighed[0, 1]).all()
    assert 0 <= int(weighed.sum()) - int(stored.sum()) < weighed.size  # rounded up, cell by cell
    configuration = Configuration.load(
        {
            "pyspark-shuffle.reducer.target-size": str(int(weighed[0, 1])),
            "pyspark-shuffle.reducer.min-count": "1",
            "scheduling.skew.threshold": str(int(weighed[:, 1].sum()) // 2),
        }
    )
    plan = adaptive_plan(configuration, [weighed], [True], default_parallelism=1)
    assert plan.skewed == (1,)
    map_tasks_per_reducer = sorted(
        len(task.inputs[0].producers)
        for task in plan.tasks
        if task.inputs[0].subpartitions == SubpartitionRange.single(1)
    )
    assert map_tasks_per_reducer == [1, 1, 1, 1]


def _map_sizes(maps: int, subpartitions: int, seed: int) -> list[MapSizes]:
    """Map outputs of random sizes, a few subpartitions empty and one skewed; half the map
    tasks compressed theirs to a third."""
    rng = np.random.default_rng(seed)
    sizes = []
    for m in range(maps):
        arrow = rng.integers(1, 1_000, subpartitions) * (rng.random(subpartitions) > 0.1)
        arrow[3] *= 200
        stored = arrow // 3 if m % 2 else arrow
        rows = tuple((arrow // 10).tolist())
        statistics = PartitionStatistics(rows, tuple(stored.tolist()), tuple(arrow.tolist()))
        sizes.append(MapSizes.of(statistics))
    return sizes


@pytest.mark.parametrize("min_count", ["0", "7"])
def test_plans_from_map_output_sizes_equal_those_of_the_whole_matrix(min_count: str) -> None:
    sizes = _map_sizes(40, 60, seed=int(min_count))
    estimates = [map_sizes.estimate() for map_sizes in sizes]
    stored = np.stack([stored for stored, _ in estimates])
    arrow = np.stack([arrow for _, arrow in estimates])
    matrix = codec_neutral_bytes(stored, arrow, int(stored.sum()), int(arrow.sum()))
    configuration = Configuration.load(
        {
            "pyspark-shuffle.reducer.target-size": "20000",
            "pyspark-shuffle.reducer.min-count": min_count,
            "scheduling.skew.threshold": "100000",
        }
    )
    by_rows = adaptive_plan(configuration, [MapOutputBytes(sizes)], [True], 2)
    assert by_rows == adaptive_plan(configuration, [matrix], [True], 2)
    assert by_rows.skewed == (3,), "the skewed subpartition is split: its column was read"
    assert one_reducer_per_map_task(MapOutputBytes(sizes)).tasks == tuple(
        ConsumerTask((InputSlice(SubpartitionRange(0, 59), ProducerRange(m, m)),), int(row))
        for m, row in enumerate(matrix.sum(axis=1).tolist())
    )


def test_planning_from_map_output_sizes_holds_no_matrix_of_every_block() -> None:
    maps, subpartitions = 400, 5_000  # a matrix of their bytes: 16 MB
    written = MapOutputBytes(_map_sizes(maps, subpartitions, seed=1))
    tracemalloc.start()
    try:
        configuration = Configuration.load(
            {"scheduling.skew.threshold": "1000000", "pyspark-shuffle.reducer.target-size": "4MiB"}
        )
        plan = adaptive_plan(configuration, [written], [True], 2)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert plan.skewed == (3,)
    assert peak < maps * subpartitions * 8 // 8, f"{peak:,} bytes at the peak"


def test_a_subpartition_with_rows_never_weighs_nothing() -> None:
    arrow = np.array([[1, 0, 1_000_000]], dtype=np.int64)
    weighed = codec_neutral_bytes(
        arrow // 1000, arrow, int((arrow // 1000).sum()), int(arrow.sum())
    )
    assert weighed[0, 0] > 0 and weighed[0, 1] == 0


def test_adaptive_plan_gives_every_core_a_reducer_by_default() -> None:
    matrix = np.full((2, 8), 10, dtype=np.int64)  # 160 bytes: one reducer by size alone
    plan = adaptive_plan(Configuration.load({}), [matrix], [False], default_parallelism=4)
    assert len(plan.tasks) == 4


def test_adaptive_plan_rounds_reducers_up_to_whole_waves_of_cores_sharing_bytes_evenly() -> None:
    configuration = Configuration.load({"pyspark-shuffle.reducer.target-size": "100"})
    matrix = np.full((1, 8), 30, dtype=np.int64)  # 240 bytes: 3 reducers by size alone
    assert len(adaptive_plan(configuration, [matrix], [False], default_parallelism=1).tasks) == 3
    waves = adaptive_plan(configuration, [matrix], [False], default_parallelism=2)
    assert [task.bytes for task in waves.tasks] == [60, 60, 60, 60]  # even, not 90 90 30 30
    few = np.full((1, 3), 80, dtype=np.int64)  # no fourth subpartition to make a reducer of
    assert len(adaptive_plan(configuration, [few], [False], default_parallelism=2).tasks) == 3


def test_adaptive_plan_keeps_a_min_count_the_user_set_without_rounding_to_waves() -> None:
    configuration = Configuration.load(
        {"pyspark-shuffle.reducer.target-size": "100", "pyspark-shuffle.reducer.min-count": "1"}
    )
    tiny = np.full((1, 64), 1, dtype=np.int64)  # 64 bytes: one reducer by size
    assert len(adaptive_plan(configuration, [tiny], [False], default_parallelism=8).tasks) == 1


@pytest.mark.parametrize(
    ("how", "splittable"),
    [
        ("inner", (True, True)),
        ("left", (True, False)),
        ("semi", (True, False)),
        ("anti", (True, False)),
        ("right", (False, True)),
        ("full", (False, False)),
    ],
)
def test_a_join_splits_only_sides_whose_rows_meet_the_other_side_once(
    how: str, splittable: tuple[bool, bool]
) -> None:
    assert Join(("key",), how).splittable_inputs(2) == splittable


def test_only_a_rebalance_splits_a_key_among_reducers() -> None:
    assert PassThrough(rebalance=True).splittable_inputs(1) == (True,)
    assert PassThrough().splittable_inputs(1) == (False,)
    assert GroupApply(("key",), lambda table: table).splittable_inputs(1) == (False,)


# -- sorting --------------------------------------------------------------------------------


def test_sort_indices_places_nulls_as_spark_does() -> None:
    table = pa.table({"a": [3, None, 1, None, 2]})
    ascending = table.take(sort_indices(table, [SortKey("a")])).column("a").to_pylist()
    assert ascending == [None, None, 1, 2, 3]
    descending = table.take(sort_indices(table, [SortKey("a", False)])).column("a").to_pylist()
    assert descending == [3, 2, 1, None, None]


def test_sort_indices_places_nan_as_spark_does() -> None:
    # Spark: NaN is larger than every other value, null smaller.
    table = pa.table({"x": pa.array([1.0, NAN, None, -1.0, 2.0], pa.float64())})

    def sorted_by(ascending: bool) -> list[Any]:
        order = sort_indices(table, [SortKey("x", ascending)])
        return [_canonical(v) for v in table.take(order).column("x").to_pylist()]

    assert sorted_by(True) == [None, -1.0, 1.0, 2.0, ("NaN",)]
    assert sorted_by(False) == [("NaN",), 2.0, 1.0, -1.0, None]


def test_sort_indices_mixed_directions_is_stable() -> None:
    rng = random.Random(3)
    rows = [
        {
            "a": rng.choice([1, 2, None]),
            "b": rng.choice(["p", "q", None]),
            "c": rng.choice([0.5, NAN, None]),
            "i": i,
        }
        for i in range(300)
    ]
    table = pa.Table.from_pylist(rows)
    keys = sort_keys_of(["a", "b", "c"], [True, False, False])
    got = table.take(sort_indices(table, keys)).column("i").to_pylist()
    expected = [row["i"] for row in sorted(rows, key=lambda row: _spark_key(row, keys))]
    assert got == expected


def test_sort_keys_of_checks_its_arguments() -> None:
    assert sort_keys_of(["a", "b"], False) == (SortKey("a", False), SortKey("b", False))
    with pytest.raises(InvalidOperationError, match="ascending"):
        sort_keys_of(["a", "b"], [True])
    with pytest.raises(InvalidOperationError):
        sort_keys_of([], True)
    with pytest.raises(InvalidOperationError, match="'z'"):
        sort_indices(pa.table({"a": [1]}), [SortKey("z")])


# -- reduce operations ----------------------------------------------------------------------


def test_pass_through_and_sort_within() -> None:
    table = pa.table({"k": [3, 1, None, 2, 1], "v": ["a", "b", "c", "d", "e"]})
    assert _run(PassThrough(), table).equals(table)
    ordered = _run(SortWithin((SortKey("k", False), SortKey("v"))), table)
    assert ordered.to_pylist() == [
        {"k": 3, "v": "a"},
        {"k": 2, "v": "d"},
        {"k": 1, "v": "b"},
        {"k": 1, "v": "e"},
        {"k": None, "v": "c"},
    ]


def _group_input() -> pa.Table:
    keys = [1.0, NAN, None, 2.0, NAN, None, 1.0, -0.0, 0.0, 2.0, NAN]
    return pa.table(
        {
            "k": pa.array(keys, pa.float64()),
            "s": pa.array(["a", "b", None, "a", "b", None, "a", "z", "z", "c", "b"]),
            "v": pa.array(range(len(keys)), pa.int64()),
        }
    )


def test_group_apply_sees_every_group_once_including_null_and_nan() -> None:
    seen: list[tuple[Any, ...]] = []

    def per_group(key: tuple[pa.Scalar, ...], group: pa.Table) -> pa.Table:
        seen.append(tuple(_canonical(each.as_py()) for each in key))
        assert len({_canonical(v) for v in group.column("k").to_pylist()}) == 1
        return pa.table(
            {
                "k": group.column("k").slice(0, 1),
                "s": group.column("s").slice(0, 1),
                "n": [group.num_rows],
                "total": [sum(group.column("v").to_pylist())],
            }
        )

    result = _run(GroupApply(("k", "s"), per_group, pass_key=True), _group_input())
    expected: Counter[Hashable] = Counter()
    totals: dict[tuple[Hashable, ...], list[int]] = {}
    for row in _group_input().to_pylist():
        totals.setdefault((_canonical(row["k"]), row["s"]), []).append(row["v"])
    for (k, s), values in totals.items():
        expected[_canonical({"k": k, "s": s, "n": len(values), "total": sum(values)})] += 1
    assert _multiset(result.to_pylist()) == expected
    # (1, a) (2, a) (2, c) (NaN, b) (null, null) and (0.0, z) holding both -0.0 and 0.0.
    assert len(seen) == len(totals) == 6
    assert sorted(seen, key=repr) == sorted(totals, key=repr)


@pytest.mark.parametrize("cached_bytes", [4 << 20, 64], ids=["one-pass", "passes"])
def test_group_apply_hands_each_group_all_its_rows_in_arrival_order(
    monkeypatch: pytest.MonkeyPatch, cached_bytes: int
) -> None:
    # Tiny caches make the reducer gather its rows by group in passes.
    monkeypatch.setattr("shuffle_runtime.batches._CACHED_BYTES", cached_bytes)
    rng = random.Random(3)
    choices = [NAN, -NAN, -0.0, 0.0, None, 2.5, *map(float, range(40))]
    keys = [rng.choice(choices) for _ in range(3000)]
    table = pa.table({"k": pa.array(keys, pa.float64()), "v": pa.array(range(3000), pa.int64())})
    seen: dict[Hashable, list[int]] = {}

    def per_group(group: pa.Table) -> pa.Table:
        key = _canonical(group.column("k")[0].as_py())
        assert key not in seen
        seen[key] = group.column("v").to_pylist()
        return group.slice(0, 1)

    result = _run(GroupApply(("k",), per_group), table)
    expected: dict[Hashable, list[int]] = {}
    for row in table.to_pylist():
        expected.setdefault(_canonical(row["k"]), []).append(row["v"])
    assert seen == expected
    assert result.num_rows == len(expected)


def test_group_apply_function_may_return_batches_or_nothing() -> None:
    table = pa.table({"k": [1, 1, 2, 3, 3, 3], "v": [1, 2, 3, 4, 5, 6]})

    def one_batch(group: pa.Table) -> pa.RecordBatch:
        return pa.record_batch({"k": group.column("k").chunk(0)[:1], "n": [group.num_rows]})

    def batches_or_none(group: pa.Table) -> Iterator[pa.RecordBatch]:
        if group.column("k")[0].as_py() != 2:
            yield one_batch(group)
            yield one_batch(group)

    counted = _run(GroupApply(("k",), one_batch), table)
    assert sorted(counted.to_pylist(), key=repr) == [
        {"k": 1, "n": 2},
        {"k": 2, "n": 1},
        {"k": 3, "n": 3},
    ]
    doubled = _run(GroupApply(("k",), batches_or_none), table)
    assert Counter(row["k"] for row in doubled.to_pylist()) == {1: 2, 3: 2}
    nothing = GroupApply(("k",), lambda group: iter(()))
    assert list(nothing.apply([_batches(table)], [table.schema])) == []


def test_group_apply_whole_partition_gets_all_rows_sorted_by_key() -> None:
    calls: list[pa.Table] = []

    def whole(table: pa.Table) -> pa.Table:
        calls.append(table)
        return table.group_by("k").aggregate([("v", "sum")])

    table = pa.table({"k": [3, None, 1, 3, 1, None], "v": [1, 2, 3, 4, 5, 6]})
    result = _run(GroupApply(("k",), whole, whole_partition=True), table)
    assert len(calls) == 1
    assert calls[0].column("k").to_pylist() == [None, None, 1, 1, 3, 3]
    assert sorted(result.to_pylist(), key=repr) == sorted(
        [{"k": None, "v_sum": 8}, {"k": 1, "v_sum": 8}, {"k": 3, "v_sum": 5}], key=repr
    )
    empty = pa.table({"k": pa.array([], pa.int64()), "v": pa.array([], pa.int64())})
    assert list(GroupApply(("k",), whole).apply([_batches(empty)], [empty.schema])) == []


def test_group_ids_number_groups_of_equal_keys_in_order_of_appearance() -> None:
    table = pa.table({"a": [None, 1, None, 1, 1, 2], "b": ["x", "x", "x", "y", "y", "y"]})
    ids, groups = group_ids(table, ["a"])
    assert (ids.tolist(), groups) == ([0, 1, 0, 1, 1, 2], 3)
    ids, groups = group_ids(table, ["a", "b"])
    assert (ids.tolist(), groups) == ([0, 1, 0, 2, 2, 3], 4)
    assert group_ids(table.slice(0, 0), ["a"])[0].tolist() == []


def test_group_ids_hold_every_nan_together_and_zero_with_minus_zero() -> None:
    other_nan = struct.unpack("<d", struct.pack("<Q", 0x7FF8000000000001))[0]
    table = pa.table({"k": pa.array([NAN, other_nan, -NAN, -0.0, 0.0, None], pa.float64())})
    ids, groups = group_ids(table, ["k"])
    assert (ids.tolist(), groups) == ([0, 0, 0, 1, 1, 2], 3)


def _spark_equal(left: object, right: object) -> bool:
    """Spark's join equality: null matches nothing, NaN matches NaN, -0.0 matches 0.0."""
    if left is None or right is None:
        return False
    return _canonical(left) == _canonical(right)


def _reference_join(
    left: list[dict[str, Any]], right: list[dict[str, Any]], keys: Sequence[str], how: str
) -> Counter[Hashable]:
    left_rest = [name for name in left[0] if name not in keys]
    right_rest = [name for name in right[0] if name not in keys]

    def matches(a: dict[str, Any], b: dict[str, Any]) -> bool:
        return all(_spark_equal(a[key], b[key]) for key in keys)

    out: list[dict[str, Any]] = []
    matched_right: set[int] = set()
    for a in left:
        partners = [index for index, b in enumerate(right) if matches(a, b)]
        matched_right.update(partners)
        if how == "semi":
            out += [a] if partners else []
        elif how == "anti":
            out += [] if partners else [a]
        else:
            for index in partners:
                out.append({**a, **{name: right[index][name] for name in right_rest}})
            if not partners and how in ("left", "full"):
                out.append({**a, **dict.fromkeys(right_rest)})
    if how in ("right", "full"):
        for index, b in enumerate(right):
            if index not in matched_right:
                out.append({**{key: b[key] for key in keys}, **dict.fromkeys(left_rest), **b})
    return _multiset(out)


def _join_sides() -> tuple[pa.Table, pa.Table]:
    rng = random.Random(11)

    def side(rows: int, payload: str) -> pa.Table:
        return pa.table(
            {
                "k": pa.array([rng.choice([0.0, -0.0, 1.0, 2.5, NAN, None]) for _ in range(rows)]),
                "s": pa.array([rng.choice(["a", "b", "", None]) for _ in range(rows)]),
                payload: pa.array([[i, i] if i % 3 else None for i in range(rows)]),
            }
        )

    return side(40, "left_list"), side(30, "right_list")


@pytest.mark.parametrize("how", ["inner", "left", "right", "full", "semi", "anti"])
@pytest.mark.parametrize("keys", [("k",), ("k", "s"), ("s",)], ids=["float", "float-str", "str"])
def test_join_matches_a_reference_of_spark_semantics(how: str, keys: tuple[str, ...]) -> None:
    left, both_keys = _join_sides()
    right = both_keys.select([*keys, "right_list"])  # no column on both sides but the keys
    result = _run(Join(keys, how), left, right)
    expected = _reference_join(left.to_pylist(), right.to_pylist(), keys, how)
    assert _multiset(result.to_pylist()) == expected
    left_rest = [name for name in left.column_names if name not in keys]
    right_rest = [] if how in ("semi", "anti") else ["right_list"]
    assert result.column_names == [*keys, *left_rest, *right_rest]


def test_join_of_empty_sides_and_unknown_type() -> None:
    left = pa.table({"k": pa.array([], pa.int64()), "a": pa.array([], pa.string())})
    right = pa.table({"k": pa.array([1, 2], pa.int64()), "b": ["x", "y"]})
    assert _run(Join(("k",), "inner"), left, right).num_rows == 0
    full = _run(Join(("k",), "full"), left, right)
    assert sorted(full.to_pylist(), key=repr) == [
        {"k": 1, "a": None, "b": "x"},
        {"k": 2, "a": None, "b": "y"},
    ]
    with pytest.raises(InvalidOperationError, match="outer"):
        Join(("k",), "outer")


@pytest.mark.parametrize("how", ["inner", "left", "right", "full", "semi", "anti"])
def test_a_void_key_matches_nothing_as_in_spark(how: str) -> None:
    left = pa.table({"k": pa.nulls(3), "a": [1, 2, 3]})
    right = pa.table({"k": pa.nulls(2), "b": ["x", "y"]})
    result = _run(Join(("k",), how), left, right)
    expected = _reference_join(left.to_pylist(), right.to_pylist(), ("k",), how)
    assert _multiset(result.to_pylist()) == expected


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


@pytest.mark.parametrize(
    ("partitions", "estimated", "target", "cores", "tasks"),
    [
        (1_000, 16 << 20, 64 << 20, 2, 4),  # small partitions: two map tasks a core
        (1_000, 640 << 20, 64 << 20, 2, 10),  # one per target's bytes
        (1_000, 1 << 40, 64 << 20, 2, 1_000),  # never more than one a partition
        (16, 1 << 20, 64 << 20, 8, 16),  # no fewer than two a core: as they are
        (1_000, 16 << 20, 0, 2, 1_000),  # off
        (1_000, 0, 64 << 20, 200, 400),
        # Partitions not known (Spark Connect): as many as the bytes say, two a core at least.
        (None, 16 << 20, 64 << 20, 2, 4),
        (None, 640 << 20, 64 << 20, 2, 10),
        (None, 16 << 20, 0, 2, None),
    ],
)
def test_map_tasks_read_about_the_target_size_each_two_a_core_at_least(
    partitions: int | None, estimated: int, target: int, cores: int, tasks: int | None
) -> None:
    assert map_task_count(partitions, estimated, target, cores) == tasks


class _PrintedPlan:
    """A Spark Connect DataFrame as the estimate sees it: what ``explain(mode="cost")`` prints."""

    def __init__(self, text: str) -> None:
        self._text = text

    def _explain_string(self, *, mode: str) -> str:
        assert mode == "cost"
        return self._text


_COST_PLAN = """== Optimized Logical Plan ==
Project [(id#0L % 7) AS k#2L, id#0L], Statistics(sizeInBytes={root})
+- Range (0, 4000, step=1, splits=Some(40)), Statistics(sizeInBytes=31.3 KiB, rowCount=4.00E+3)

== Physical Plan ==
*(1) Project [(id#0L % 7) AS k#2L, id#0L]
+- *(1) Range (0, 4000, step=1, splits=40)
"""


@pytest.mark.parametrize(
    ("root", "estimated"),
    [
        ("62.5 KiB", 64_000),
        ("1024.0 B", 1024),
        ("3.0 MiB, rowCount=1.00E+5", 3 << 20),
        ("8.0 EiB", 8 << 60),  # what Spark prints for a size it does not know
    ],
)
def test_a_connect_frame_is_sized_by_its_optimized_plans_root(root: str, estimated: int) -> None:
    frame = _PrintedPlan(_COST_PLAN.format(root=root))
    assert estimated_bytes(frame) == estimated  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "text", ["", "== Physical Plan ==\nRange (0, 10)", "== Optimized Logical Plan ==\nRange (0, 1)"]
)
def test_a_plan_printed_without_statistics_gives_no_estimate(text: str) -> None:
    assert estimated_bytes(_PrintedPlan(text)) is None  # type: ignore[arg-type]
