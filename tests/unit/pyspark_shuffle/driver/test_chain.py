"""The job graph of one SparkShuffle's operations, in-process: which exchanges may be released
as results are dropped, and which dropped results a rerun may still run."""

from __future__ import annotations

import pytest

from pyspark_shuffle.driver.chain import Chain, ChainExchange, ChainStage


def _fused_chain(*, on_executors: bool, length: int = 3) -> Chain:
    """source -> x1 -> r1 -> x2 -> r2 -> ... : each exchange after the first is written by
    the reduce tasks of the result before it (a fused stage)."""
    chain = Chain()
    producer = "map-x1"
    for step in range(1, length + 1):
        chain.add_exchange(ChainExchange(f"x{step}", producer, 4, on_executors))
        chain.add_stage(ChainStage(f"r{step}", 3, (f"x{step}",)))
        producer = f"r{step}"
    return chain


@pytest.mark.parametrize("on_executors", [True, False])
def test_nothing_goes_while_every_result_is_held(on_executors: bool) -> None:
    chain = _fused_chain(on_executors=on_executors)
    assert chain.releasable(recomputable=True) == []
    assert chain.releasable(recomputable=False) == []
    assert chain.rerunnable() == set()


def test_a_dropped_result_s_exchange_goes_on_the_external_service() -> None:
    chain = _fused_chain(on_executors=False)
    chain.drop("r1")
    # No later rerun reads x1: the partitions of x2 outlive their executors.
    assert chain.releasable(recomputable=False) == ["x1"]
    assert chain.rerunnable() == set()
    assert chain.rerun_inputs() == set()


def test_on_executors_a_dropped_result_s_exchange_goes_only_if_spark_can_remake_it() -> None:
    chain = _fused_chain(on_executors=True)
    chain.drop("r1")
    # A lost map output of x2 reruns r1's reduce tasks, which read x1.
    assert chain.releasable(recomputable=False) == []
    assert chain.releasable(recomputable=True) == ["x1"]
    assert chain.rerunnable() == {"r1"}
    assert chain.rerun_inputs() == {"x1", "x2"}


def test_reruns_reach_up_the_whole_chain_from_what_live_results_read() -> None:
    chain = _fused_chain(on_executors=True)
    chain.drop("r1")
    chain.drop("r2")
    assert chain.releasable(recomputable=True) == ["x1", "x2"]
    assert chain.rerunnable() == {"r1", "r2"}
    for result_id in ("x1", "x2"):
        chain.released(result_id)
    chain.prune()
    # Released, yet a rerun of r2 and r1 still goes through them.
    assert chain.rerunnable() == {"r1", "r2"}
    chain.drop("r3")
    assert chain.releasable(recomputable=True) == ["x3"]
    chain.released("x3")
    assert chain.rerunnable() == set()
    chain.prune()
    assert chain.graph().stages == ()


def test_an_exchange_read_by_two_results_waits_for_both() -> None:
    chain = _fused_chain(on_executors=False, length=1)
    chain.add_stage(ChainStage("again", 2, ("x1",)))  # a second read of the same exchange
    chain.drop("r1")
    assert chain.releasable(recomputable=True) == []
    chain.drop("again")
    assert chain.releasable(recomputable=True) == ["x1"]


def test_pinned_and_unread_exchanges_stay() -> None:
    chain = Chain()
    chain.add_exchange(ChainExchange("pinned", "map-pinned", 2, False), pinned=True)
    chain.add_exchange(ChainExchange("unread", "map-unread", 2, False))
    chain.add_stage(ChainStage("reader", 1, ("pinned",)))
    chain.drop("reader")
    assert chain.releasable(recomputable=True) == []


def test_a_join_s_sides_go_together_and_the_graph_has_one_edge_per_read() -> None:
    chain = Chain()
    chain.add_exchange(ChainExchange("left", "map-left", 3, True))
    chain.add_exchange(ChainExchange("right", "map-right", 2, True))
    chain.add_stage(ChainStage("joined", 4, ("left", "right")))
    graph = chain.graph()
    assert [stage.name for stage in graph.stages] == ["map-left", "map-right", "joined"]
    assert [(e.result_id, e.producer, e.consumer) for e in graph.exchanges] == [
        ("left", "map-left", "joined"),
        ("right", "map-right", "joined"),
    ]
    chain.drop("joined")
    # Their producers are map stages over a source: nothing to rerun.
    assert chain.releasable(recomputable=False) == ["left", "right"]
    assert chain.rerunnable() == set()


def test_a_stage_running_another_s_tasks_keeps_that_one_while_it_may_run() -> None:
    chain = _fused_chain(on_executors=False, length=1)
    # A broadcast join over r1: its tasks are r1's reduce tasks, reading x1.
    chain.add_stage(ChainStage("joined", 3, ("x1",), wraps="r1"))
    chain.drop("r1")
    assert chain.releasable(recomputable=True) == []
    assert chain.rerunnable() == {"r1"}
    chain.drop("joined")
    assert chain.rerunnable() == set()
    assert chain.releasable(recomputable=True) == ["x1"]


@pytest.mark.parametrize("pinned", [True, False])
def test_what_a_pinned_or_unread_exchange_is_made_from_is_rerun_input(pinned: bool) -> None:
    chain = _fused_chain(on_executors=True, length=1)
    # Written from r1's reduce tasks; a pinned one (hash_exchange) or one about to be read.
    chain.add_exchange(ChainExchange("next", "r1", 3, True), pinned=pinned)
    chain.drop("r1")
    assert chain.rerunnable() == {"r1"}
    assert chain.rerun_inputs() == {"x1"}
    assert chain.releasable(recomputable=False) == []


def test_stages_and_exchanges_of_no_task_are_one_vertex() -> None:
    chain = Chain()
    chain.add_exchange(ChainExchange("empty", "map-empty", 0, True))
    chain.add_stage(ChainStage("reader", 0, ("empty",)))
    assert [stage.parallelism for stage in chain.graph().stages] == [1, 1]
    assert chain.releasable(recomputable=True) == []
    chain.drop("reader")
    assert chain.releasable(recomputable=True) == ["empty"]
