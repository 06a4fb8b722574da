"""``pyspark_shuffle.kernels.operations``: the reduce operations (pass-through, sort within,
group apply, group ids, joins, cogroup apply), each checked against a plain-Python reference
of Spark's semantics, and the inputs of each a reducer may split."""

from __future__ import annotations

import math
import random
import struct
from collections import Counter
from collections.abc import Hashable, Iterable, Iterator, Sequence
from typing import Any

import pyarrow as pa
import pytest

from pyspark_shuffle.kernels.hashing import hash_keys
from pyspark_shuffle.kernels.operations import (
    CogroupApply,
    GroupApply,
    Join,
    PassThrough,
    SortWithin,
    group_ids,
)
from pyspark_shuffle.kernels.sorting import SortKey
from shuffle_api import InvalidOperationError
from tests.unit.pyspark_shuffle.kernels.spark_reference import NAN, _canonical


def _batches(table: pa.Table, rows: int = 3) -> Iterator[pa.RecordBatch]:
    return iter(table.to_batches(max_chunksize=rows))


def _run(operation: Any, *tables: pa.Table) -> pa.Table:
    schemas = [table.schema for table in tables]
    batches = list(operation.apply([_batches(table) for table in tables], schemas))
    result: pa.Table = pa.Table.from_batches(batches) if batches else pa.table({})
    return result


def _multiset(rows: Iterable[dict[str, Any]]) -> Counter[Hashable]:
    return Counter(_canonical(row) for row in rows)


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


def _nested_keys() -> pa.Table:
    return pa.table(
        {
            "s": pa.array(
                [
                    {"x": 0.0, "tags": ["a"]},
                    {"x": -0.0, "tags": ["a"]},
                    {"x": math.nan, "tags": []},
                    {"x": -math.nan, "tags": []},
                    {"x": 1.0, "tags": None},
                    None,
                    {"x": 1.0, "tags": None},
                ]
            ),
            "row": list(range(7)),
        }
    )


def test_nested_keys_equal_as_in_spark_hash_group_and_join_alike() -> None:
    table = _nested_keys()
    hashes = [int(value) for value in hash_keys([table.column("s")])]
    assert hashes[0] == hashes[1] and hashes[2] == hashes[3] and hashes[4] == hashes[6]
    assert len({hashes[0], hashes[2], hashes[4], hashes[5]}) == 4
    ids, groups = group_ids(table, ["s"])
    assert groups == 4 and ids[0] == ids[1] and ids[2] == ids[3] and ids[4] == ids[6]
    other = table.rename_columns(["s", "other_row"])
    batches = list(
        Join(("s",), "inner").apply(
            [iter(table.to_batches()), iter(other.to_batches())], [table.schema, other.schema]
        )
    )
    pairs = {(row["row"], row["other_row"]) for row in pa.Table.from_batches(batches).to_pylist()}
    # Each row meets the rows equal to it; the null key meets none.
    assert pairs == {(a, b) for a in (0, 1) for b in (0, 1)} | {
        (a, b) for a in (2, 3) for b in (2, 3)
    } | {(a, b) for a in (4, 6) for b in (4, 6)}


# -- cogroup apply --------------------------------------------------------------------------


def _cogroup_sides() -> tuple[pa.Table, pa.Table]:
    """Keys (k, s): (1, a) on the left only, (3, a) on the right only, (2, a), (null, a) and
    (null, null) on both; -0.0 on the left meets 0.0 on the right."""
    left = pa.table(
        {
            "k": pa.array([1.0, 2.0, None, 2.0, None, -0.0, 1.0], pa.float64()),
            "s": ["a", "a", "a", "a", None, "z", "a"],
            "v": pa.array(range(7), pa.int64()),
        }
    )
    right = pa.table(
        {
            "s": ["a", "a", None, "a", "z", "a"],
            "k": pa.array([3.0, 2.0, None, None, 0.0, 2.0], pa.float64()),
            "w": ["p", "q", "r", "s", "t", "u"],
        }
    )
    return left, right


def _rows_by_key(table: pa.Table, keys: Sequence[str], rows: str) -> dict[Hashable, list[Any]]:
    by_key: dict[Hashable, list[Any]] = {}
    for row in table.to_pylist():
        by_key.setdefault(tuple(_canonical(row[key]) for key in keys), []).append(row[rows])
    return by_key


def test_cogroup_apply_calls_the_function_once_per_key_of_either_side() -> None:
    left, right = _cogroup_sides()
    calls: list[tuple[pa.Table, pa.Table]] = []

    def per_key(left_rows: pa.Table, right_rows: pa.Table) -> pa.Table:
        calls.append((left_rows, right_rows))
        return pa.table({"n": [left_rows.num_rows], "m": [right_rows.num_rows]})

    result = _run(CogroupApply(("k", "s"), per_key), left, right)
    assert result.num_rows == len(calls) == 6
    lefts, rights = _rows_by_key(left, ["k", "s"], "v"), _rows_by_key(right, ["k", "s"], "w")
    seen: dict[Hashable, tuple[list[Any], list[Any]]] = {}
    for left_rows, right_rows in calls:
        # Each side's own columns, keys included, its rows in the order they came.
        assert left_rows.schema == left.schema and right_rows.schema == right.schema
        [key] = {
            tuple(_canonical(row[name]) for name in ("k", "s"))
            for row in [*left_rows.to_pylist(), *right_rows.to_pylist()]
        }
        assert key not in seen
        seen[key] = (left_rows.column("v").to_pylist(), right_rows.column("w").to_pylist())
    assert seen == {
        key: (lefts.get(key, []), rights.get(key, [])) for key in lefts.keys() | rights.keys()
    }
    assert seen[(None, None)] == ([4], ["r"]) and seen[(3.0, "a")] == ([], ["p"])


def test_cogroup_apply_passes_the_left_rows_key_or_else_the_right_rows() -> None:
    left, right = _cogroup_sides()
    keys: list[tuple[pa.Scalar, ...]] = []

    def per_key(key: tuple[pa.Scalar, ...], left_rows: pa.Table, right_rows: pa.Table) -> pa.Table:
        keys.append(key)
        return pa.table({"n": [left_rows.num_rows + right_rows.num_rows]})

    _run(CogroupApply(("k", "s"), per_key, pass_key=True), left, right)
    assert all(isinstance(scalar, pa.Scalar) for key in keys for scalar in key)
    values = {tuple(scalar.as_py() for scalar in key) for key in keys}
    assert {key for key in values if key[0] is not None} == {
        (1.0, "a"),
        (2.0, "a"),
        (3.0, "a"),
        (0.0, "z"),
    }
    # -0.0 and 0.0 are one key; the left has rows of it, so its -0.0 is passed.
    [zero] = [key[0].as_py() for key in keys if key[1].as_py() == "z"]
    assert math.copysign(1.0, zero) == -1.0


def test_cogroup_apply_groups_nested_keys_whose_nullability_flags_differ() -> None:
    point = [pa.field("x", pa.int64(), nullable=False)]
    left = pa.table({"p": pa.array([{"x": 1}, {"x": 2}], pa.struct(point)), "v": [1, 2]})
    right = pa.table({"p": pa.array([{"x": 2}, None], pa.struct([pa.field("x", pa.int64())]))})
    sizes = CogroupApply(("p",), lambda a, b: pa.table({"n": [a.num_rows], "m": [b.num_rows]}))
    # {x: 1} left only, {x: 2} on both sides, the null struct right only.
    rows = _run(sizes, left, right).to_pylist()
    assert sorted((row["n"], row["m"]) for row in rows) == [(0, 1), (1, 0), (1, 1)]


def test_cogroup_apply_of_empty_inputs() -> None:
    left, right = _cogroup_sides()
    calls: list[tuple[int, int]] = []

    def per_key(left_rows: pa.Table, right_rows: pa.Table) -> pa.Table:
        calls.append((left_rows.num_rows, right_rows.num_rows))
        assert left_rows.schema == left.schema and right_rows.schema == right.schema
        return pa.table({"n": [left_rows.num_rows]})

    operation = CogroupApply(("k", "s"), per_key)
    assert list(operation.apply([iter(()), iter(())], [left.schema, right.schema])) == []
    assert calls == []
    # One side empty: each key of the other once, with an empty table of the empty side's
    # schema (the null keys of each side one group).
    list(operation.apply([iter(()), _batches(right)], [left.schema, right.schema]))
    assert sorted(calls) == [(0, 1), (0, 1), (0, 1), (0, 1), (0, 2)]
    calls.clear()
    list(operation.apply([_batches(left), iter(())], [left.schema, right.schema]))
    assert sorted(calls) == [(1, 0), (1, 0), (1, 0), (2, 0), (2, 0)]


def test_cogroup_apply_function_may_return_batches_or_nothing() -> None:
    left, right = _cogroup_sides()

    def batches(left_rows: pa.Table, right_rows: pa.Table) -> Iterator[pa.RecordBatch]:
        if left_rows.num_rows and right_rows.num_rows:
            for row in right_rows.column("w").to_pylist():
                yield pa.record_batch({"w": [row], "n": [left_rows.num_rows]})

    result = _run(CogroupApply(("k", "s"), batches), left, right)
    # Keys on both sides: (2, a) twice on each, (null, a), (null, null), (0, z).
    assert sorted(result.to_pylist(), key=repr) == sorted(
        [
            {"w": "q", "n": 2},
            {"w": "u", "n": 2},
            {"w": "s", "n": 1},
            {"w": "r", "n": 1},
            {"w": "t", "n": 1},
        ],
        key=repr,
    )
    assert CogroupApply(("k",), batches).splittable_inputs(2) == (False, False)
