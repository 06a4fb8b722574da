"""What a reducer does with the batches its input gates yield: pass them on, sort them, apply
a function per key group (of one input, or of two cogrouped), or join two inputs. Pure Arrow;
no Spark here, so each is testable alone."""

from __future__ import annotations

import abc
import itertools
import math
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Final

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from pyspark_shuffle.kernels.ordered_bytes import is_nested, ordered_bytes
from pyspark_shuffle.kernels.sorting import SortKey, sort_indices
from shuffle_api import InvalidOperationError
from shuffle_runtime.batches import (
    chop,
    coalesce,
    conform,
    conform_all,
    nullable_inside,
    reorder_by_subpartition,
)
from shuffle_runtime.ndarrays import arrow_array, number_scalar, numpy_values

__all__ = [
    "JOIN_TYPES",
    "BatchFunction",
    "CogroupApply",
    "CogroupFunction",
    "GroupApply",
    "GroupFunction",
    "Join",
    "MapBatches",
    "PassThrough",
    "ReduceOperation",
    "SortWithin",
    "cogroup_ids",
    "group_bounds",
    "group_ids",
]

GroupFunction = Callable[..., pa.Table | Iterable[pa.RecordBatch]]
"""``f(table)`` or ``f(key, table)`` (key: a tuple of pyarrow scalars), as in Spark's
``applyInArrow``; returns a table or record batches."""

CogroupFunction = Callable[..., pa.Table | Iterable[pa.RecordBatch]]
"""``f(left, right)`` or ``f(key, left, right)`` (key: a tuple of pyarrow scalars), as in
Spark's ``cogroup().applyInArrow``; returns a table or record batches."""

BatchFunction = Callable[[Iterator[pa.RecordBatch]], Iterable[pa.RecordBatch]]
"""As for Spark's ``mapInArrow``: the batches of one partition in, record batches out."""

# Spark's join names -> Arrow's.
JOIN_TYPES: Final[dict[str, str]] = {
    "inner": "inner",
    "left": "left outer",
    "right": "right outer",
    "full": "full outer",
    "semi": "left semi",
    "anti": "left anti",
}

# Batches handed back to Spark: few and large, however many groups made them.
_OUTPUT_BATCH_ROWS = 1 << 16
_OUTPUT_BATCH_BYTES = 4 << 20


class ReduceOperation(abc.ABC):
    """Picklable: built on the driver, applied in every reduce task."""

    @abc.abstractmethod
    def apply(
        self, inputs: Sequence[Iterator[pa.RecordBatch]], schemas: Sequence[pa.Schema]
    ) -> Iterator[pa.RecordBatch]:
        """The reducer's output, from one batch iterator (and its schema) per shuffled input."""

    def splittable_inputs(self, inputs: int) -> tuple[bool, ...]:
        """Per input: may a skewed subpartition's producers be divided among reducers (each
        reading the other inputs' rows of that subpartition whole)? Not by default: a group,
        a sorted range or a repartition's key must stay in one reducer."""
        return (False,) * inputs

    def worth_keeping(self) -> bool:
        """Whether a later reader should read a kept copy of the rows rather than run the
        reduce tasks again: yes, but for a pass-through, whose tasks only read an exchange."""
        return True


def _results_as_batches(result: pa.Table | Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    if isinstance(result, pa.Table):
        yield from result.to_batches()
    elif isinstance(result, pa.RecordBatch):
        yield result
    else:
        yield from result


@dataclass(frozen=True, slots=True)
class PassThrough(ReduceOperation):
    """Hash repartition: the shuffled batches as they come. ``rebalance``: a skewed key may be
    split among reducers (Spark's REBALANCE), so equal keys may land in different ones."""

    rebalance: bool = False

    def splittable_inputs(self, inputs: int) -> tuple[bool, ...]:
        return (self.rebalance,) * inputs

    def worth_keeping(self) -> bool:
        return False

    def apply(
        self, inputs: Sequence[Iterator[pa.RecordBatch]], schemas: Sequence[pa.Schema]
    ) -> Iterator[pa.RecordBatch]:
        yield from inputs[0]


@dataclass(frozen=True, slots=True)
class MapBatches(ReduceOperation):
    """Hash repartition with the consumer in the reducer: ``function`` gets the shuffled
    batches in the reduce task, so they never go back to the JVM in between."""

    function: BatchFunction
    input_schema: pa.Schema | None = None
    """Where set, ``function`` gets the batches conformed to it: the schema Spark's own
    ``mapInArrow`` of a result would hand it."""

    def apply(
        self, inputs: Sequence[Iterator[pa.RecordBatch]], schemas: Sequence[pa.Schema]
    ) -> Iterator[pa.RecordBatch]:
        schema = self.input_schema
        if schema is None:
            yield from self.function(inputs[0])
            return
        yield from self.function(conform(batch, schema) for batch in inputs[0])


@dataclass(frozen=True, slots=True)
class SortWithin(ReduceOperation):
    """Range-partitioned input sorted locally: reducer after reducer, a global order."""

    keys: tuple[SortKey, ...]

    def apply(
        self, inputs: Sequence[Iterator[pa.RecordBatch]], schemas: Sequence[pa.Schema]
    ) -> Iterator[pa.RecordBatch]:
        table = conform_all(inputs[0], schemas[0])
        yield from table.take(sort_indices(table, self.keys)).to_batches(_OUTPUT_BATCH_ROWS)


def _value_codes(column: pa.ChunkedArray) -> tuple[npt.NDArray[np.int32], int]:
    """Per row, a number for its value (equal values alike: null with null, every NaN with
    every NaN, -0.0 with 0.0, as Spark groups them), and how many distinct values there are."""
    values = column.combine_chunks()
    if pa.types.is_dictionary(values.type):
        values = values.dictionary_decode()
    if is_nested(values.type):
        values = ordered_bytes(values)
    elif pa.types.is_floating(values.type):
        # Arrow's hashing tells NaN payloads and the sign of zero apart; Spark does not.
        zero = number_scalar(0, values.type)
        values = pc.if_else(pc.is_nan(values), number_scalar(math.nan, values.type), values)
        values = pc.if_else(pc.equal(values, zero), zero, values)
    encoded = pc.dictionary_encode(values, null_encoding="encode")
    codes: npt.NDArray[Any] = numpy_values(encoded.indices)
    return codes, len(encoded.dictionary)


def group_ids(table: pa.Table, keys: Sequence[str]) -> tuple[npt.NDArray[np.int64], int]:
    """Per row of ``table``, the number of its group of equal ``keys`` (numbered in order of
    first appearance), and the number of groups. Hashing, not sorting: no order is needed."""
    ids, groups = np.zeros(table.num_rows, dtype=np.int64), 1
    for key in keys:
        codes, count = _value_codes(table.column(key))
        if groups == 1:
            ids, groups = codes.astype(np.int64), count
            continue
        # Below rows * rows < 2**63; numbered again so that the next key cannot overflow it.
        pairs = pc.dictionary_encode(arrow_array(ids * count + codes))
        ids, groups = numpy_values(pairs.indices).astype(np.int64), len(pairs.dictionary)
    return ids, groups


def group_bounds(table: pa.Table, keys: Sequence[str]) -> tuple[pa.Table, list[tuple[int, int]]]:
    """The table with each group's rows together (as sorted by key they are: else gathered),
    and each group's first and past-last row (none of a table of no rows)."""
    if not table.num_rows:
        return table, []
    ids, groups = group_ids(table, keys)
    starts = np.flatnonzero(np.r_[True, ids[1:] != ids[:-1]])
    if len(starts) != groups:
        order = np.argsort(ids, kind="stable")
        table, ids = table.take(order), ids[order]
        starts = np.flatnonzero(np.r_[True, ids[1:] != ids[:-1]])
    ends = [*starts[1:].tolist(), table.num_rows]
    return table, list(zip(starts.tolist(), ends, strict=True))


def _gathered(results: Iterable[pa.Table | Iterable[pa.RecordBatch]]) -> Iterator[pa.RecordBatch]:
    """The rows of many small results as few large batches: pieces are counted by rows (a
    byte count of each would cost more than the small function itself), concatenated per
    ``_OUTPUT_BATCH_ROWS`` and only then cut to ``_OUTPUT_BATCH_BYTES``."""
    pieces = (
        piece for result in results for piece in _results_as_batches(result) if piece.num_rows
    )
    for batch in coalesce(pieces, _OUTPUT_BATCH_ROWS, size=lambda piece: piece.num_rows):
        yield from chop(batch, _OUTPUT_BATCH_BYTES)


@dataclass(frozen=True, slots=True)
class GroupApply(ReduceOperation):
    """``function`` per key group (``whole_partition``: once per reducer, on all its rows
    sorted by key)."""

    keys: tuple[str, ...]
    function: GroupFunction
    pass_key: bool = False
    whole_partition: bool = False

    def apply(
        self, inputs: Sequence[Iterator[pa.RecordBatch]], schemas: Sequence[pa.Schema]
    ) -> Iterator[pa.RecordBatch]:
        table = conform_all(inputs[0], schemas[0])
        if table.num_rows == 0:
            return
        if self.whole_partition:
            table = table.take(sort_indices(table, [SortKey(key) for key in self.keys]))
            yield from _results_as_batches(self.function(table))
            return
        yield from _gathered(self._per_group(table))

    def _per_group(self, table: pa.Table) -> Iterator[pa.Table | Iterable[pa.RecordBatch]]:
        ids, groups = group_ids(table, self.keys)
        for group in _groups_of(table, ids, groups):
            if self.pass_key:
                yield self.function(_key_of(group, self.keys), group)
            else:
                yield self.function(group)


def _groups_of(table: pa.Table, ids: npt.NDArray[np.int64], groups: int) -> Iterator[pa.Table]:
    """The rows of each group ``0 .. groups - 1`` of ``table`` (``ids``: a group per row), in
    the order they came; an empty table for a group without rows."""
    if table.num_rows == 0:  # nothing to gather (and no batch to gather it in)
        yield from itertools.repeat(table, groups)
        return
    # One stable gather brings each group's rows together; each group is then a slice.
    [whole] = table.combine_chunks().to_batches()
    ordered, sizes = reorder_by_subpartition(whole, ids, groups)
    gathered = pa.Table.from_batches(ordered, schema=table.schema)
    offset = 0
    for size in sizes.tolist():
        yield gathered.slice(offset, size)
        offset += size


def _key_of(group: pa.Table, keys: Sequence[str]) -> tuple[pa.Scalar, ...]:
    """The key of a group with rows, as Spark hands it to a function: its first row's."""
    return tuple(group.column(name)[0] for name in keys)


def _stacked_keys(left: pa.Table, right: pa.Table, keys: Sequence[str]) -> pa.Table:
    """The key columns of ``left``'s rows, then of ``right``'s, as one table of the left's
    types, every field nullable: the sides' types may differ in nullability flags only (the
    driver checks), which say nothing of the values."""
    schema = nullable_inside(
        pa.schema([pa.field(key, left.schema.field(key).type) for key in keys])
    )
    return conform_all(
        itertools.chain(left.select(keys).to_batches(), right.select(keys).to_batches()), schema
    )


def cogroup_ids(
    left: pa.Table, right: pa.Table, keys: Sequence[str]
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64], int]:
    """Per row of each side, the number of its key (one number for a key on both sides, null
    with null, as Spark cogroups them; numbered in order of first appearance, the left's rows
    first), and the number of keys."""
    ids, groups = group_ids(_stacked_keys(left, right, keys), keys)
    return ids[: left.num_rows], ids[left.num_rows :], groups


@dataclass(frozen=True, slots=True)
class CogroupApply(ReduceOperation):
    """``function`` once per key present in either of two inputs hash-partitioned on ``keys``
    alike, as Spark's ``cogroup().applyInArrow``: each side's rows of the key (all its
    columns), an empty table of that side's schema where it has none. The key passed
    (``pass_key``) is the left rows', or the right's where the left has none."""

    keys: tuple[str, ...]
    function: CogroupFunction
    pass_key: bool = False
    whole_partition: bool = False
    """Call ``function`` once per reducer, on both sides' rows whole (it cogroups them)."""

    def apply(
        self, inputs: Sequence[Iterator[pa.RecordBatch]], schemas: Sequence[pa.Schema]
    ) -> Iterator[pa.RecordBatch]:
        left, right = conform_all(inputs[0], schemas[0]), conform_all(inputs[1], schemas[1])
        if self.whole_partition:
            yield from _results_as_batches(self.function(left, right))
            return
        yield from _gathered(self._per_key(left, right))

    def _per_key(
        self, left: pa.Table, right: pa.Table
    ) -> Iterator[pa.Table | Iterable[pa.RecordBatch]]:
        left_ids, right_ids, groups = cogroup_ids(left, right, self.keys)
        pairs = zip(
            _groups_of(left, left_ids, groups),
            _groups_of(right, right_ids, groups),
            strict=True,
        )
        for left_group, right_group in pairs:
            if self.pass_key:
                keyed = left_group if left_group.num_rows else right_group
                yield self.function(_key_of(keyed, self.keys), left_group, right_group)
            else:
                yield self.function(left_group, right_group)


def _join_keys(table: pa.Table, keys: Sequence[str]) -> pa.Table:
    """The key columns, with -0.0 made 0.0 (Spark joins them as equal, Arrow's join does
    not), structs and arrays as their ordered bytes and a void key as nulls of a type Arrow's
    join takes (it takes none of them)."""
    columns = []
    for key in keys:
        column = table.column(key)
        if pa.types.is_null(column.type):
            column = pa.nulls(len(column), pa.int8())
        elif is_nested(column.type):
            column = ordered_bytes(column)
        elif pa.types.is_floating(column.type):
            zero = number_scalar(0, column.type)
            column = pc.if_else(pc.equal(column, zero), zero, column)
        columns.append(column)
    return pa.Table.from_arrays(columns, names=list(keys))


@dataclass(frozen=True, slots=True)
class Join(ReduceOperation):
    """Both inputs hash-partitioned on ``keys`` the same way; Spark's ``join(on=keys)``
    columns: the keys, then the left's other columns, then the right's (none for semi/anti)."""

    keys: tuple[str, ...]
    how: str

    def __post_init__(self) -> None:
        if self.how not in JOIN_TYPES:
            raise InvalidOperationError(
                f"unknown join type {self.how!r}; known: {', '.join(JOIN_TYPES)}"
            )

    def splittable_inputs(self, inputs: int) -> tuple[bool, ...]:
        # A side may be split when each of its rows meets the other side's rows of the key
        # once and the other side emits nothing unmatched: Spark's rule for skew joins.
        return (
            self.how in ("inner", "left", "semi", "anti"),
            self.how in ("inner", "right"),
        )

    def apply(
        self, inputs: Sequence[Iterator[pa.RecordBatch]], schemas: Sequence[pa.Schema]
    ) -> Iterator[pa.RecordBatch]:
        left, right = conform_all(inputs[0], schemas[0]), conform_all(inputs[1], schemas[1])
        keys = list(self.keys)
        # Arrow joins keys only (payloads such as lists are not supported by its hash join);
        # the payload columns follow by row number.
        left_row, right_row = "__pyshuffle_left_row", "__pyshuffle_right_row"
        matches = (
            _join_keys(left, keys)
            .append_column(left_row, arrow_array(np.arange(left.num_rows, dtype=np.int64)))
            .join(
                _join_keys(right, keys).append_column(
                    right_row, arrow_array(np.arange(right.num_rows, dtype=np.int64))
                ),
                keys,
                join_type=JOIN_TYPES[self.how],
                use_threads=False,
            )
        )
        left_rest = [name for name in left.column_names if name not in keys]
        if self.how in ("semi", "anti"):
            kept = left.select([*keys, *left_rest]).take(matches.column(left_row))
            yield from kept.to_batches(_OUTPUT_BATCH_ROWS)
            return
        right_rest = [name for name in right.column_names if name not in keys]
        # Each key as its row has it (-0.0 stays -0.0), from the side Spark takes it from.
        left_keys = left.select(keys).take(matches.column(left_row)).columns
        right_keys = right.select(keys).take(matches.column(right_row)).columns
        if self.how == "right":
            columns = right_keys
        elif self.how == "full":
            columns = [pc.coalesce(*pair) for pair in zip(left_keys, right_keys, strict=True)]
        else:
            columns = left_keys
        columns += left.select(left_rest).take(matches.column(left_row)).columns
        columns += right.select(right_rest).take(matches.column(right_row)).columns
        joined = pa.Table.from_arrays(columns, names=[*keys, *left_rest, *right_rest])
        yield from joined.to_batches(_OUTPUT_BATCH_ROWS)
