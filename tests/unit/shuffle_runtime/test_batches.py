"""split_by_subpartition, ordered_parts, reorder_by_subpartition, chop, coalesce and
group_nbytes: the vectorized routing and sizing writers share; conform, which gives batches
their declared schema."""

from __future__ import annotations

import datetime
import decimal
import itertools
from collections.abc import Callable

import numpy as np
import pyarrow as pa
import pytest

from shuffle_api import SchemaMismatchError, ShuffleError
from shuffle_api.io import SubpartitionIndexes
from shuffle_runtime.batches import (
    OrderedRows,
    chop,
    coalesce,
    conform,
    conform_all,
    group_nbytes,
    ordered_parts,
    reorder_by_subpartition,
    split_by_subpartition,
)


def numbered_batch(rows: int) -> pa.RecordBatch:
    """Row ``i`` holds ``row = i`` and a string that identifies it."""
    return pa.record_batch(
        {
            "row": pa.array(np.arange(rows, dtype=np.int64)),
            "text": pa.array([f"value-{i}" for i in range(rows)]),
        }
    )


def split(
    batch: pa.RecordBatch, indexes: SubpartitionIndexes, subpartitions: int
) -> dict[int, list[int]]:
    """Subpartition -> the ``row`` values it got, checking each piece keeps the schema."""
    result: dict[int, list[int]] = {}
    for subpartition, piece in split_by_subpartition(batch, indexes, subpartitions):
        assert subpartition not in result, "each subpartition is yielded once"
        assert piece.schema.equals(batch.schema)
        assert piece.num_rows > 0
        rows = piece.column("row").to_pylist()
        assert piece.column("text").to_pylist() == [f"value-{i}" for i in rows]
        result[subpartition] = rows
    return result


def expected_split(indexes: list[int]) -> dict[int, list[int]]:
    expected: dict[int, list[int]] = {}
    for row, subpartition in enumerate(indexes):
        expected.setdefault(subpartition, []).append(row)
    return expected


# --- split_by_subpartition -----------------------------------------------------------------


def test_every_row_lands_in_its_subpartition_once_in_original_order() -> None:
    rng = np.random.default_rng(7)
    indexes = rng.integers(0, 13, size=5000).tolist()

    result = split(numbered_batch(5000), indexes, 13)

    assert result == expected_split(indexes)
    assert sorted(row for rows in result.values() for row in rows) == list(range(5000))


def test_subpartitions_are_yielded_in_ascending_order_and_empty_ones_skipped() -> None:
    indexes = [5, 0, 5, 2, 0, 5]

    pieces = list(split_by_subpartition(numbered_batch(6), indexes, 8))

    assert [subpartition for subpartition, _ in pieces] == [0, 2, 5]
    assert [piece.column("row").to_pylist() for _, piece in pieces] == [[1, 4], [3], [0, 2, 5]]


def test_batch_all_in_one_subpartition_is_returned_unsplit() -> None:
    batch = numbered_batch(100)

    pieces = list(split_by_subpartition(batch, [3] * 100, 4))

    assert len(pieces) == 1
    subpartition, piece = pieces[0]
    assert subpartition == 3
    assert piece.equals(batch)
    assert piece.num_rows == 100


def test_empty_batch_yields_nothing() -> None:
    batch = numbered_batch(0)

    assert list(split_by_subpartition(batch, np.array([], dtype=np.int32), 4)) == []
    assert list(split_by_subpartition(batch, [], 4)) == []


IndexMaker = Callable[[list[int]], SubpartitionIndexes]


@pytest.mark.parametrize(
    "make",
    [
        pytest.param(lambda v: v, id="list"),
        pytest.param(lambda v: np.asarray(v, dtype=np.int64), id="numpy-int64"),
        pytest.param(lambda v: np.asarray(v, dtype=np.uint8), id="numpy-uint8"),
        pytest.param(lambda v: np.asarray(v, dtype=np.int16), id="numpy-int16"),
        pytest.param(lambda v: pa.array(v, type=pa.int32()), id="arrow-int32"),
        pytest.param(lambda v: pa.array(v, type=pa.uint16()), id="arrow-uint16"),
        pytest.param(lambda v: pa.chunked_array([v[:3], v[3:]], type=pa.int64()), id="chunked"),
    ],
)
def test_indexes_may_be_list_numpy_or_arrow(make: IndexMaker) -> None:
    indexes = [1, 0, 2, 1, 1, 0, 2]

    assert split(numbered_batch(7), make(indexes), 3) == expected_split(indexes)


@pytest.mark.parametrize(
    ("indexes", "message"),
    [
        pytest.param([0, 1, 4], "out of range", id="too-large"),
        pytest.param([0, 1, 3], "out of range", id="equal-to-count"),
        pytest.param([0, -1, 1], "out of range", id="negative"),
        pytest.param(np.array([0, -2, 1], dtype=np.int8), "out of range", id="negative-numpy"),
        pytest.param(pa.array([0, None, 1], type=pa.int32()), "null", id="null-arrow"),
        pytest.param([0, None, 1], "integers", id="none-in-list"),
        pytest.param([0.0, 1.0, 2.0], "integers", id="float-list"),
        pytest.param(np.array([0.0, 1.5, 2.0]), "integers", id="float-numpy"),
        pytest.param(pa.array([0.0, 1.0, 2.0]), "integers", id="float-arrow"),
        pytest.param(["0", "1", "2"], "integers", id="strings"),
        pytest.param([True, False, True], "integers", id="booleans"),
        pytest.param([0, 1], "one subpartition index per row", id="too-few"),
        pytest.param([0, 1, 2, 0], "one subpartition index per row", id="too-many"),
        pytest.param([[0], [1], [2]], "one subpartition index per row", id="two-dimensional"),
        pytest.param(np.array([2**63, 0, 1], dtype=np.uint64), "out of range", id="huge-uint64"),
    ],
)
def test_bad_indexes_raise_shuffle_error(indexes: SubpartitionIndexes, message: str) -> None:
    with pytest.raises(ShuffleError, match=message):
        list(split_by_subpartition(numbered_batch(3), indexes, 3))


def test_indexes_for_an_empty_batch_must_still_have_the_right_length() -> None:
    with pytest.raises(ShuffleError):
        list(split_by_subpartition(numbered_batch(0), [0], 3))


def test_split_handles_1024_subpartitions() -> None:
    rng = np.random.default_rng(11)
    indexes = rng.integers(0, 1024, size=20_000)

    result = split(numbered_batch(20_000), indexes, 1024)

    assert result == expected_split(indexes.tolist())
    assert len(result) == len(set(indexes.tolist()))


def test_split_handles_exactly_65536_subpartitions() -> None:
    indexes = [65535, 0, 65535, 1, 0]

    assert split(numbered_batch(5), indexes, 1 << 16) == expected_split(indexes)


def test_split_handles_more_than_65536_subpartitions() -> None:
    # Indexes that collide modulo 2**16 must still go to different subpartitions.
    indexes = [69_999, 65_536, 0, 65_537, 65_536, 1, 4_463, 69_999]

    result = split(numbered_batch(len(indexes)), indexes, 70_000)

    assert result == expected_split(indexes)
    assert sorted(result) == [0, 1, 4_463, 65_536, 65_537, 69_999]


def test_split_with_random_indexes_above_65536_subpartitions() -> None:
    rng = np.random.default_rng(5)
    indexes = rng.integers(0, 200_000, size=3000)

    result = split(numbered_batch(3000), indexes, 200_000)

    assert result == expected_split(indexes.tolist())


@pytest.mark.parametrize(
    ("subpartitions", "skewed"), [(3, False), (300, False), (70_000, False), (300, True)]
)
def test_a_batch_larger_than_the_caches_splits_alike_in_passes(
    monkeypatch: pytest.MonkeyPatch, subpartitions: int, skewed: bool
) -> None:
    # Caches of 256 bytes: runs of subpartitions, runs within runs, and runs of one; skewed,
    # 90 % of the rows in one subpartition.
    monkeypatch.setattr("shuffle_runtime.batches._CACHED_BYTES", 256)
    rng = np.random.default_rng(subpartitions)
    indexes = rng.integers(0, subpartitions, size=5000)
    if skewed:
        indexes = np.where(rng.random(5000) < 0.9, 7, indexes)

    result = split(numbered_batch(5000), indexes, subpartitions)

    assert result == expected_split(indexes.tolist())
    assert list(result) == sorted(result)


def test_reorder_gives_the_rows_in_stable_order_of_subpartition_and_the_counts(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("shuffle_runtime.batches._CACHED_BYTES", 256)
    rng = np.random.default_rng(4)
    indexes = rng.integers(0, 100, size=3000)
    indexes[indexes == 13] = 12  # an empty subpartition

    ordered, counts = reorder_by_subpartition(numbered_batch(3000), indexes, 100)

    assert len(ordered) > 1  # in passes: one batch per run of subpartitions
    rows = [row for part in ordered for row in part.column("row").to_pylist()]
    assert rows == np.argsort(indexes, kind="stable").tolist()
    assert counts.tolist() == np.bincount(indexes, minlength=100).tolist()
    empty = reorder_by_subpartition(numbered_batch(0), [], 100)
    assert empty[0] == [] and empty[1].tolist() == [0] * 100


def test_a_large_batch_into_few_subpartitions_is_reordered_in_one_pass(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("shuffle_runtime.batches._CACHED_BYTES", 256)
    indexes = np.random.default_rng(6).integers(0, 16, size=3000)

    ordered, _ = reorder_by_subpartition(numbered_batch(3000), indexes, 16)

    assert len(ordered) == 1
    assert ordered[0].column("row").to_pylist() == np.argsort(indexes, kind="stable").tolist()


# --- chop ----------------------------------------------------------------------------------


def int_batch(rows: int) -> pa.RecordBatch:
    return pa.record_batch({"row": pa.array(np.arange(rows, dtype=np.int64))})


def test_chop_slices_into_pieces_of_about_the_target_size_covering_all_rows_in_order() -> None:
    batch = int_batch(1000)  # 8000 bytes

    pieces = list(chop(batch, 800))

    assert len(pieces) == 10
    assert all(piece.nbytes <= 800 for piece in pieces)
    assert pa.Table.from_batches(pieces).column("row").to_pylist() == list(range(1000))


def test_chop_covers_a_remainder_in_a_last_smaller_piece() -> None:
    batch = int_batch(1001)

    pieces = list(chop(batch, 1000))

    assert sum(piece.num_rows for piece in pieces) == 1001
    assert all(piece.nbytes <= 2 * 1000 for piece in pieces)
    assert pa.Table.from_batches(pieces).column("row").to_pylist() == list(range(1001))
    assert pieces[-1].num_rows < pieces[0].num_rows


def test_chop_of_variable_width_rows_keeps_every_row_in_order() -> None:
    text = [("x" * (i % 50)) for i in range(2000)]
    batch = pa.record_batch({"text": pa.array(text)})

    pieces = list(chop(batch, 4096))

    assert len(pieces) > 1
    assert all(piece.num_rows >= 1 for piece in pieces)
    assert pa.Table.from_batches(pieces).column("text").to_pylist() == text


def test_chop_leaves_a_batch_within_the_target_whole() -> None:
    batch = int_batch(100)

    pieces = list(chop(batch, batch.nbytes))

    assert len(pieces) == 1
    assert pieces[0].equals(batch)


def test_chop_never_yields_a_piece_without_rows() -> None:
    batch = int_batch(50)

    pieces = list(chop(batch, 1))

    assert len(pieces) == 50
    assert [piece.num_rows for piece in pieces] == [1] * 50
    assert pa.Table.from_batches(pieces).column("row").to_pylist() == list(range(50))


def test_chop_keeps_a_single_oversized_row_as_one_piece() -> None:
    batch = pa.record_batch({"blob": pa.array([b"x" * 10_000], type=pa.binary())})

    pieces = list(chop(batch, 100))

    assert len(pieces) == 1
    assert pieces[0].num_rows == 1


# --- coalesce ------------------------------------------------------------------------------


def test_coalesce_joins_consecutive_pieces_up_to_the_target_keeping_row_order() -> None:
    pieces = list(chop(int_batch(1000), 800))  # 10 pieces of 800 bytes

    batches = list(coalesce(pieces, 3 * 800))

    assert [batch.num_rows for batch in batches] == [300, 300, 300, 100]
    assert all(batch.nbytes <= 3 * 800 for batch in batches)
    assert pa.Table.from_batches(batches).column("row").to_pylist() == list(range(1000))


def test_coalesce_passes_a_piece_larger_than_the_target_as_it_is() -> None:
    small, large, last = int_batch(10), int_batch(500), int_batch(20)

    batches = list(coalesce([small, large, last], 1000))

    assert [batch.num_rows for batch in batches] == [10, 500, 20]
    assert batches[1] is large


def test_coalesce_never_joins_pieces_of_two_schemas() -> None:
    first = int_batch(10)
    other = first.cast(pa.schema([pa.field("row", pa.int32())]))  # another map task's types
    pieces = [first, first, other, other, first]

    batches = list(coalesce(pieces, 1 << 20))

    assert [batch.num_rows for batch in batches] == [20, 20, 10]
    assert [batch.schema for batch in batches] == [first.schema, other.schema, first.schema]


def test_coalesce_of_nothing_yields_nothing() -> None:
    assert list(coalesce([], 1000)) == []


# -- conform ---------------------------------------------------------------------------------

_MAP = pa.map_(pa.string(), pa.int64())
_MAP_OF_NON_NULL = pa.map_(pa.string(), pa.field("value", pa.int64(), nullable=False))
_STRUCT = pa.struct([pa.field("x", pa.int64())])
_STRUCT_OF_NON_NULL = pa.struct([pa.field("x", pa.int64(), nullable=False)])


def test_nested_nullability_flags_are_relabelled_without_a_copy() -> None:
    # Spark's physical plan may promise more than the DataFrame's schema says (a filtered
    # column, a map built of non-null values): the same data either way.
    batch = pa.record_batch(
        [pa.array([[("a", 1)], None], _MAP_OF_NON_NULL), pa.array([1, 2])],
        schema=pa.schema([pa.field("m", _MAP_OF_NON_NULL), pa.field("k", pa.int64(), False)]),
    )
    declared = pa.schema([pa.field("m", _MAP), pa.field("k", pa.int64())])
    conformed = conform(batch, declared)
    assert conformed.schema.equals(declared)
    assert conformed.column(0).buffers()[1].address == batch.column(0).buffers()[1].address
    assert conformed.to_pylist() == batch.to_pylist()


@pytest.mark.parametrize(
    ("column", "declared", "where"),
    [
        (pa.array([1, None]), pa.field("k", pa.int64(), nullable=False), "'k'"),
        (pa.array([[("a", None)]], _MAP), pa.field("k", _MAP_OF_NON_NULL), r"'k\.value'"),
        (pa.array([{"x": None}, None], _STRUCT), pa.field("k", _STRUCT_OF_NON_NULL), r"'k\.x'"),
        (
            pa.array([[{"x": 1}], [{"x": None}]], pa.list_(_STRUCT)),
            pa.field("k", pa.list_(pa.field("element", _STRUCT_OF_NON_NULL))),
            r"'k\.element\.x'",
        ),
    ],
)
def test_a_null_where_the_declared_schema_promises_none_is_refused(
    column: pa.Array, declared: pa.Field, where: str
) -> None:
    with pytest.raises(SchemaMismatchError, match=where):
        conform(pa.record_batch([column], names=["k"]), pa.schema([declared]))


def test_a_null_is_refused_even_where_the_batch_schema_is_the_declared_one() -> None:
    schema = pa.schema([pa.field("s", _STRUCT_OF_NON_NULL)])
    inner = pa.StructArray.from_arrays([pa.array([None, 1])], fields=list(_STRUCT_OF_NON_NULL))
    with pytest.raises(SchemaMismatchError, match=r"'s\.x'"):
        conform(pa.RecordBatch.from_arrays([inner], schema=schema), schema)


def test_a_null_struct_may_hide_nulls_in_its_non_null_fields_as_arrow_allows() -> None:
    # As Spark writes them: a null struct's fields are null too, whatever they declare.
    hidden = pa.StructArray.from_arrays(
        [pa.array([1, None])], fields=[pa.field("x", pa.int64())], mask=pa.array([False, True])
    )
    in_a_map = pa.MapArray.from_arrays(
        [0, 2, 2], pa.array(["a", "b"]), hidden, mask=pa.array([False, True])
    )
    batch = pa.record_batch([hidden, in_a_map], names=["s", "m"])
    declared = pa.schema(
        [
            pa.field("s", _STRUCT_OF_NON_NULL),
            pa.field("m", pa.map_(pa.string(), pa.field("value", _STRUCT_OF_NON_NULL))),
        ]
    )
    conformed = conform(batch, declared)
    assert conformed.schema.equals(declared)
    assert conformed.to_pylist() == [
        {"s": {"x": 1}, "m": [("a", {"x": 1}), ("b", None)]},
        {"s": None, "m": None},
    ]


def test_columns_are_taken_by_name_and_cast_to_the_declared_types() -> None:
    batch = pa.record_batch({"b": pa.array(["x"]), "a": pa.array([1], pa.int32())})
    declared = pa.schema([pa.field("a", pa.int64()), pa.field("b", pa.large_string())])
    assert conform(batch, declared).to_pylist() == [{"a": 1, "b": "x"}]
    with pytest.raises(SchemaMismatchError, match="no column 'c'"):
        conform(batch, pa.schema([pa.field("c", pa.int64())]))
    with pytest.raises(SchemaMismatchError, match="'b'"):
        conform(batch, pa.schema([pa.field("b", pa.int64())]))


def test_conform_all_gives_one_table_of_the_declared_schema() -> None:
    declared = pa.schema([pa.field("m", _MAP)])
    batches = [
        pa.record_batch([pa.array([[("a", 1)]], _MAP_OF_NON_NULL)], names=["m"]),
        pa.record_batch([pa.array([[("b", None)]], _MAP)], names=["m"]),
    ]
    table = conform_all(iter(batches), declared)
    assert table.schema.equals(declared)
    assert table.column("m").to_pylist() == [[("a", 1)], [("b", None)]]
    assert conform_all(iter([]), declared).num_rows == 0


# --- ordered_parts, OrderedRows and group_nbytes ---------------------------------------------


def test_ordered_parts_cover_every_subpartition_in_order_as_the_split_does() -> None:
    rng = np.random.default_rng(3)
    batch = numbered_batch(30_000)
    indexes = rng.integers(0, 700, batch.num_rows)
    parts = list(ordered_parts(batch, indexes, 700))
    # Together the parts hold every subpartition once, from the first to the last.
    assert parts[0].first == 0
    assert sum(len(part.counts) for part in parts) == 700
    for before, after in itertools.pairwise(parts):
        assert after.first == before.first + len(before.counts)
    from_parts = {
        subpartition: piece.column("row").to_pylist()
        for part in parts
        for subpartition, piece in part.slices()
    }
    assert from_parts == split(batch, indexes, 700) == expected_split(indexes.tolist())


_COLUMNS = {
    "long": pa.array([1, None, 3, 4] * 25, pa.int64()),
    "bool": pa.array([True, False, None, True] * 25),
    "string": pa.array(["a", "bbb", None, "cccccc"] * 25),
    "large_string": pa.array(["x", None, "yy", "zzz"] * 25, pa.large_string()),
    "decimal": pa.array([decimal.Decimal("1.5")] * 100, pa.decimal128(10, 2)),
    "timestamp": pa.array([datetime.datetime(2020, 1, 1)] * 100, pa.timestamp("us")),
    "list": pa.array([[1, 2], [3], None, []] * 25),
    "struct": pa.array([{"a": 1, "b": "x"}] * 100),
    "fixed": pa.array([b"abcd"] * 100, pa.binary(4)),
    "null": pa.nulls(100),
}


@pytest.mark.parametrize("offset", [0, 3, 8, 13])
@pytest.mark.parametrize(
    "counts", [[0, 5, 13, 1, 0, 40, 21], [80], [0, 0, 80, 0], [1] * 80], ids=str
)
def test_group_nbytes_counts_each_group_as_pyarrow_counts_its_slice(
    offset: int, counts: list[int]
) -> None:
    batch = pa.record_batch(_COLUMNS).slice(offset, 80)
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]]).tolist()
    for name in _COLUMNS:
        column = batch.select([name])
        assert group_nbytes(column, np.array(counts, dtype=np.int64)).tolist() == [
            column.slice(start, count).nbytes for start, count in zip(starts, counts, strict=True)
        ], name


def test_ordered_rows_cut_into_parts_of_about_the_target_size() -> None:
    batch = numbered_batch(2_000)
    # Subpartition 3 is 1,500 rows: larger than the target alone.
    counts = np.array([100, 100, 0, 1_500, 200, 100], dtype=np.int64)
    rows = OrderedRows(batch, 10, counts)
    sizes = group_nbytes(batch, counts)
    target = int(sizes[0] + sizes[1])
    parts = list(rows.cut(sizes, target))
    got = [(part.first, part.counts.tolist()) for part, _ in parts]
    assert got[0] == (10, [100, 100, 0])  # neighbours together, up to the target
    # Subpartitions 13 and 14 (4,400 bytes) alone, in slices of about the target; then 15.
    assert [first for first, _ in got] == sorted(first for first, _ in got)
    assert sum(counts[0] for first, counts in got if first == 13) == 1_500
    assert len([first for first, _ in got if first == 13]) == 8
    assert got[-1] == (15, [100])
    assert all(part.batch.nbytes <= 1.1 * target for part, _ in parts)
    # Every row once, in order.
    assert pa.Table.from_batches([part.batch for part, _ in parts]).column("row").to_pylist() == (
        list(range(2_000))
    )
    assert sum(int(part_sizes.sum()) for _, part_sizes in parts) == pytest.approx(
        int(sizes.sum()), rel=0.01
    )
