"""``scheduling.graph``: a stage graph refuses cycles, unknown stages and two producers of a
result, and gives its stages in topological order."""

from __future__ import annotations

import pytest

from scheduling.graph import Stage, StageExchange, StageGraph
from shuffle_api import InvalidOperationError, ResultPartitionType


def test_a_stage_graph_rejects_cycles_unknown_stages_and_two_producers_of_a_result() -> None:
    with pytest.raises(InvalidOperationError, match="cycle"):
        StageGraph(
            [Stage("a", 1), Stage("b", 1)],
            [StageExchange("ab", "a", "b"), StageExchange("ba", "b", "a")],
        )
    with pytest.raises(InvalidOperationError, match="unknown stage 'c'"):
        StageGraph([Stage("a", 1)], [StageExchange("ac", "a", "c")])
    with pytest.raises(InvalidOperationError, match="produced by both"):
        StageGraph(
            [Stage("a", 1), Stage("b", 1), Stage("c", 1)],
            [StageExchange("r", "a", "c"), StageExchange("r", "b", "c")],
        )
    with pytest.raises(InvalidOperationError, match="parallelism must be >= 1"):
        Stage("a", 0)


def test_stages_come_in_topological_order() -> None:
    graph = StageGraph(
        [Stage("sink", 1), Stage("join", 2), Stage("left", 2), Stage("right", 2)],
        [
            StageExchange("j", "join", "sink", partition_type=ResultPartitionType.PIPELINED),
            StageExchange("l", "left", "join"),
            StageExchange("r", "right", "join"),
        ],
    )
    assert [stage.name for stage in graph.stages] == ["left", "right", "join", "sink"]
