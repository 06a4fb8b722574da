"""Broadcast joins: which side of a join may be broadcast, and the tasks that join every
partition of the other side with the whole broadcast side (which is then never shuffled)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Final

import pyarrow as pa
from pyspark import Broadcast

from pyspark_shuffle.inputs import TaskOutput
from pyspark_shuffle.operations import JOIN_TYPES, Join
from shuffle_api import InvalidOperationError
from shuffle_api.batches import conform

__all__ = ["BROADCAST_CHOICES", "BroadcastSide", "broadcast_join", "broadcast_side", "ipc_bytes"]

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


def ipc_bytes(table: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return bytes(sink.getvalue().to_pybytes())


def broadcast_join(
    streamed: TaskOutput,
    streamed_schema: pa.Schema,
    *,
    side: str,
    shared: Broadcast[bytes],
    operation: Join,
    output_schema: pa.Schema,
) -> TaskOutput:
    """The tasks of the streamed side, each joining its rows with the whole broadcast side
    (Arrow IPC in ``shared``) on ``side``; their rows of ``output_schema``."""
    produce = streamed.produce
    broadcast_left = side == "left"

    def join(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        # Spark loads a broadcast's value once per worker process; Arrow reads it in place.
        small = pa.ipc.open_stream(pa.py_buffer(shared.value)).read_all()
        rows = produce(batches)
        whole = iter(small.to_batches())
        inputs, schemas = (
            ([whole, rows], [small.schema, streamed_schema])
            if broadcast_left
            else ([rows, whole], [streamed_schema, small.schema])
        )
        for batch in operation.apply(inputs, schemas):
            yield conform(batch, output_schema)

    return TaskOutput(streamed.tasks, join, f"broadcast join with {streamed.description}")
