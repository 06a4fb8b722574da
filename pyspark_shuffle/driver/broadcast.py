"""Broadcast joins: which side of a join may be broadcast, and the tasks that join every
partition of the other side with the whole broadcast side (which is then never shuffled)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Final

import pyarrow as pa
import pyarrow.compute as pc
from pyspark import TaskContext

from pyspark_shuffle.driver.inputs import RowTasks
from pyspark_shuffle.kernels.ipc import from_ipc_stream
from pyspark_shuffle.kernels.operations import JOIN_TYPES, Join
from pyspark_shuffle.kernels.ordered_bytes import is_nested
from pyspark_shuffle.spark.link import TaskAccumulator, TaskBroadcast
from pyspark_shuffle.tasks.python_worker import task_starts
from shuffle_api import InvalidOperationError
from shuffle_runtime.batches import conform

__all__ = ["BROADCAST_CHOICES", "BroadcastSide", "broadcast_join", "broadcast_side"]

BROADCAST_CHOICES: Final = ("auto", "left", "right", "none")

# Spark's rule (JoinSelectionHelper.canBuildBroadcastLeft/Right): a side may be broadcast
# when every row of the other side can be joined with it alone, task by task. Auto tries the
# first, as Spark does when both sides are small.
_BROADCASTABLE: Final[dict[str, tuple[str, ...]]] = {
    "inner": ("right", "left"),
    "left": ("right",),
    "semi": ("right",),
    "anti": ("right",),
    "right": ("left",),
    "full": (),
}
assert set(_BROADCASTABLE) == set(JOIN_TYPES)


@dataclass(frozen=True, slots=True)
class BroadcastSide:
    """What the broadcast side of a join wrote, and how many tasks of the other side read it."""

    side: str
    map_tasks: int
    map_seconds: float
    rows: int
    bytes: int
    joining_tasks: int


def broadcast_side(how: str, choice: str, threshold: int) -> str | None:
    """The side to try broadcasting for a ``how`` join: the one ``choice`` names (refused
    where ``how`` does not allow it), or for ``"auto"`` the side Spark would (none when
    ``threshold`` is 0)."""
    if choice not in BROADCAST_CHOICES:
        raise InvalidOperationError(
            f"broadcast={choice!r}: one of {', '.join(map(repr, BROADCAST_CHOICES))}"
        )
    allowed = _BROADCASTABLE[how]
    if choice == "none" or (choice == "auto" and (not allowed or threshold == 0)):
        return None
    if choice == "auto":
        return allowed[0]
    if choice not in allowed:
        sides = " or ".join(allowed) or "neither side"
        raise InvalidOperationError(
            f"a {how} join cannot broadcast its {choice} side (its rows are joined with the"
            f" other side whole, task by task); it may broadcast {sides}"
        )
    return choice


class _UniqueKeyLookup:
    """A broadcast join where the broadcast side has one key column whose values are unique
    (a dimension table, the common case): each streamed batch finds its row of the broadcast
    side by a hash lookup, and its own columns are kept or filtered, never reordered. Batch by
    batch, so a task holds one batch of its partition at a time."""

    def __init__(self, small: pa.Table, operation: Join, side: str) -> None:
        [self._key] = operation.keys
        self._small_keys = small.column(self._key).combine_chunks()
        self._small_rest = small.drop_columns([self._key])
        self._how = operation.how
        self._broadcast_left = side == "left"

    @staticmethod
    def applies(small: pa.Table, operation: Join) -> bool:
        """Whether ``small``, as broadcast for ``operation``, can be joined by lookup."""
        if len(operation.keys) != 1:
            return False
        keys = small.column(operation.keys[0])
        # Floats: Spark's join equates -0.0 with 0.0 and NaN with NaN; they, structs,
        # arrays and void keys (which match nothing) are left to the hash join.
        if pa.types.is_floating(keys.type) or is_nested(keys.type) or pa.types.is_null(keys.type):
            return False
        distinct = pc.count_distinct(keys, mode="only_valid").as_py()
        return bool(distinct == len(keys) - keys.null_count)

    def join(self, batch: pa.RecordBatch) -> pa.Table:
        streamed = pa.Table.from_batches([batch])
        # Null keys match nothing (skip_nulls), as in Spark's equi-join.
        found = pc.index_in(streamed.column(self._key), value_set=self._small_keys, skip_nulls=True)
        matched = pc.is_valid(found)
        if self._how == "semi":
            return streamed.filter(matched)
        if self._how == "anti":
            return streamed.filter(pc.invert(matched))
        if self._how == "inner":
            streamed, found = streamed.filter(matched), found.filter(matched)
        # Left join (or right, broadcasting the left): unmatched rows take nulls.
        looked_up = self._small_rest.take(found)
        keys = streamed.select([self._key])
        rest = streamed.drop_columns([self._key])
        left, right = (looked_up, rest) if self._broadcast_left else (rest, looked_up)
        return pa.Table.from_arrays(
            [*keys.columns, *left.columns, *right.columns],
            names=[self._key, *left.column_names, *right.column_names],
        )


def broadcast_join(
    streamed: RowTasks,
    streamed_schema: pa.Schema,
    small: pa.Table,
    *,
    side: str,
    shared: TaskBroadcast[bytes],
    operation: Join,
    output_schema: pa.Schema,
    tasks_run: TaskAccumulator[frozenset[int]] | None = None,
) -> RowTasks:
    """The tasks of the streamed side, each joining its rows with the whole broadcast side
    ``small`` (which the tasks read from ``shared``, its Arrow IPC) on ``side``; their rows of
    ``output_schema``. Each adds its index to ``tasks_run`` (where the streamed side's tasks
    are not known before they run)."""
    produce = streamed.produce
    broadcast_left = side == "left"
    by_lookup = _UniqueKeyLookup.applies(small, operation)  # once, here in the driver

    def join(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        task_starts()
        # Spark loads a broadcast's value once per worker process; Arrow reads it in place.
        # Not ``small`` itself: the closure would carry the table in every task.
        table = from_ipc_stream(shared.value)
        if tasks_run is not None:
            task = TaskContext.get()
            assert task is not None
            tasks_run.add(frozenset({task.partitionId()}))
        rows = produce(batches)
        if by_lookup:
            lookup = _UniqueKeyLookup(table, operation, side)
            for batch in rows:
                for joined in lookup.join(batch).to_batches():
                    yield conform(joined, output_schema)
            return
        whole = iter(table.to_batches())
        inputs, schemas = (
            ([whole, rows], [table.schema, streamed_schema])
            if broadcast_left
            else ([rows, whole], [streamed_schema, table.schema])
        )
        for batch in operation.apply(inputs, schemas):
            yield conform(batch, output_schema)

    return RowTasks(
        streamed.frame,
        join,
        f"broadcast join with {streamed.description}",
        streamed.number_of_tasks,
    )
