"""Pipelined regions: logical regions along must-be-pipelined exchanges, one region per logical
region with an all-to-all exchange inside, otherwise raw regions merged on cycles."""

from __future__ import annotations

import random
from collections.abc import Iterable

import pytest

from scheduling.graph import ExecutionVertexID, Stage, StageExchange, StageGraph
from scheduling.pointwise import partitions_of_consumer
from scheduling.regions import (
    PipelinedRegion,
    RegionTopology,
    _strongly_connected,
    build_regions,
)
from shuffle_api import DistributionPattern, InvalidOperationError, ResultPartitionType

A2A = DistributionPattern.ALL_TO_ALL
PW = DistributionPattern.POINTWISE
PIPELINED = ResultPartitionType.PIPELINED
BLOCKING = ResultPartitionType.BLOCKING

Vertex = tuple[str, int]


def _graph(
    stages: dict[str, int],
    exchanges: Iterable[tuple[str, str, DistributionPattern, ResultPartitionType]],
) -> StageGraph:
    return StageGraph(
        [Stage(name, parallelism) for name, parallelism in stages.items()],
        [
            StageExchange(f"{producer}-{consumer}", producer, consumer, pattern, kind)
            for producer, consumer, pattern, kind in exchanges
        ],
    )


def _members(region: PipelinedRegion) -> set[Vertex]:
    return {(vertex.stage, vertex.index) for vertex in region}


def _regions(topology: RegionTopology) -> list[set[Vertex]]:
    return [_members(region) for region in topology.regions]


def _vertices(stage: str, *indexes: int) -> set[Vertex]:
    return {(stage, index) for index in indexes}


# --- no merging ------------------------------------------------------------------------------


def test_single_stage_makes_one_region_per_vertex() -> None:
    topology = build_regions(_graph({"a": 3}, []))

    assert _regions(topology) == [{("a", 0)}, {("a", 1)}, {("a", 2)}]


def test_blocking_all_to_all_makes_one_region_per_vertex() -> None:
    topology = build_regions(_graph({"a": 3, "b": 2}, [("a", "b", A2A, BLOCKING)]))

    assert _regions(topology) == [
        {("a", 0)},
        {("a", 1)},
        {("a", 2)},
        {("b", 0)},
        {("b", 1)},
    ]


@pytest.mark.parametrize(
    "kind",
    [
        ResultPartitionType.BLOCKING,
        ResultPartitionType.BLOCKING_PERSISTENT,
        ResultPartitionType.HYBRID_FULL,
    ],
)
@pytest.mark.parametrize("pattern", [PW, A2A])
def test_exchange_that_need_not_be_pipelined_merges_nothing(
    kind: ResultPartitionType, pattern: DistributionPattern
) -> None:
    topology = build_regions(_graph({"a": 2, "b": 2}, [("a", "b", pattern, kind)]))

    assert _regions(topology) == [{("a", 0)}, {("a", 1)}, {("b", 0)}, {("b", 1)}]


# --- pipelined exchanges ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "kind", [ResultPartitionType.PIPELINED, ResultPartitionType.PIPELINED_BOUNDED]
)
def test_pipelined_all_to_all_makes_one_region_of_everything(kind: ResultPartitionType) -> None:
    topology = build_regions(_graph({"a": 3, "b": 2}, [("a", "b", A2A, kind)]))

    assert _regions(topology) == [_vertices("a", 0, 1, 2) | _vertices("b", 0, 1)]


@pytest.mark.parametrize(
    "kind", [ResultPartitionType.PIPELINED, ResultPartitionType.PIPELINED_BOUNDED]
)
def test_pipelined_pointwise_groups_producers_of_each_consumer(
    kind: ResultPartitionType,
) -> None:
    # 4 -> 2: consumer 0 reads partitions 0-1, consumer 1 reads 2-3.
    topology = build_regions(_graph({"a": 4, "b": 2}, [("a", "b", PW, kind)]))

    assert _regions(topology) == [
        _vertices("a", 0, 1) | {("b", 0)},
        _vertices("a", 2, 3) | {("b", 1)},
    ]


def test_pipelined_pointwise_groups_consumers_of_each_producer() -> None:
    # 2 -> 4: partition 0 feeds consumers 0-1, partition 1 feeds 2-3.
    topology = build_regions(_graph({"a": 2, "b": 4}, [("a", "b", PW, PIPELINED)]))

    assert _regions(topology) == [
        {("a", 0)} | _vertices("b", 0, 1),
        {("a", 1)} | _vertices("b", 2, 3),
    ]


def test_pipelined_pointwise_chain_of_three_stages_with_uneven_parallelism() -> None:
    # a(3) -> b(2): b0 reads a0, b1 reads a1-a2.  b(2) -> c(3): b0 feeds c0-c1, b1 feeds c2.
    topology = build_regions(
        _graph({"a": 3, "b": 2, "c": 3}, [("a", "b", PW, PIPELINED), ("b", "c", PW, PIPELINED)])
    )

    assert _regions(topology) == [
        {("a", 0), ("b", 0), ("c", 0), ("c", 1)},
        {("a", 1), ("a", 2), ("b", 1), ("c", 2)},
    ]


def test_one_to_one_exchanges_make_region_i_of_vertex_i_of_every_stage() -> None:
    # A forward chain a -> b -> c, all as wide, with a blocking one-to-one shortcut a -> c
    # inside the logical region (vertex i feeds vertex i: no cycle between regions).
    topology = build_regions(
        _graph(
            {"a": 4, "b": 4, "c": 4},
            [("a", "b", PW, PIPELINED), ("b", "c", PW, PIPELINED), ("a", "c", PW, BLOCKING)],
        )
    )

    assert _regions(topology) == [{("a", i), ("b", i), ("c", i)} for i in range(4)]
    assert [region.region_id for region in topology.regions] == [0, 1, 2, 3]
    assert topology.region_of(ExecutionVertexID("c", 2)) is topology.regions[2]
    assert topology.regions[1].vertex_ranges == (
        ("a", range(1, 2)),
        ("b", range(1, 2)),
        ("c", range(1, 2)),
    )


# --- logical regions with blocking exchanges inside ------------------------------------------


def test_blocking_exchanges_that_make_raw_regions_wait_for_each_other_merge_them() -> None:
    # Pipelined: a(2) -> d(2), b(6) -> c(3) -> d(2), so one logical region and two raw regions:
    #   R0 = {a0, d0, c0, b0, b1}  (d0 reads c0, c0 reads b0-b1)
    #   R1 = {a1, d1, c1, c2, b2..b5}
    # Blocking a(2) -> b(6): a0 feeds b0-b2, so R1 (b2) waits for R0 (a0) to finish.
    # Blocking b(6) -> d(2): d0 reads b0-b2, so R0 (d0) waits for R1 (b2) to finish.
    # Scheduled apart they would deadlock, so they are one region.
    stages = {"a": 2, "b": 6, "c": 3, "d": 2}
    pipelined = [("a", "d", PW, PIPELINED), ("b", "c", PW, PIPELINED), ("c", "d", PW, PIPELINED)]
    raw = build_regions(_graph(stages, pipelined))
    assert _regions(raw) == [
        {("a", 0), ("b", 0), ("b", 1), ("c", 0), ("d", 0)},
        {("a", 1), *_vertices("b", 2, 3, 4, 5), ("c", 1), ("c", 2), ("d", 1)},
    ]

    blocking = [("a", "b", PW, BLOCKING), ("b", "d", PW, BLOCKING)]
    topology = build_regions(_graph(stages, pipelined + blocking))

    everything = {(name, index) for name, width in stages.items() for index in range(width)}
    assert _regions(topology) == [everything]


def test_blocking_exchanges_without_a_cycle_keep_raw_regions_apart() -> None:
    # Pipelined x(3) -> y(4): x0 feeds y0-y1, x1 feeds y2, x2 feeds y3; x(3) -> z(3) one to one.
    # Blocking y(4) -> z(3): z0 reads y0, z1 reads y1, z2 reads y2-y3, so R0 -> R1 -> R2 only.
    topology = build_regions(
        _graph(
            {"x": 3, "y": 4, "z": 3},
            [("x", "y", PW, PIPELINED), ("x", "z", PW, PIPELINED), ("y", "z", PW, BLOCKING)],
        )
    )

    assert _regions(topology) == [
        {("x", 0), ("y", 0), ("y", 1), ("z", 0)},
        {("x", 1), ("y", 2), ("z", 1)},
        {("x", 2), ("y", 3), ("z", 2)},
    ]


def test_all_to_all_inside_a_logical_region_makes_it_one_region() -> None:
    # Raw regions would be {a0, b0, c0} and {a1, b1, c1}; the blocking all-to-all b -> c joins
    # them both ways (c0 reads b1, c1 reads b0), and it also stops anything from leaking out:
    # d, behind a blocking exchange, is a logical region of its own.
    topology = build_regions(
        _graph(
            {"a": 2, "b": 2, "c": 2, "d": 2},
            [
                ("a", "b", PW, PIPELINED),
                ("a", "c", PW, PIPELINED),
                ("b", "c", A2A, BLOCKING),
                ("c", "d", PW, BLOCKING),
            ],
        )
    )

    assert _regions(topology) == [
        _vertices("a", 0, 1) | _vertices("b", 0, 1) | _vertices("c", 0, 1),
        {("d", 0)},
        {("d", 1)},
    ]


def test_all_to_all_between_logical_regions_merges_nothing() -> None:
    topology = build_regions(
        _graph(
            {"a": 2, "b": 2, "c": 2, "d": 2},
            [("a", "b", PW, PIPELINED), ("b", "c", A2A, BLOCKING), ("c", "d", PW, PIPELINED)],
        )
    )

    assert _regions(topology) == [
        {("a", 0), ("b", 0)},
        {("a", 1), ("b", 1)},
        {("c", 0), ("d", 0)},
        {("c", 1), ("d", 1)},
    ]


def test_logical_regions_that_wait_for_each_other_in_a_cycle_merge() -> None:
    """a -> c pipelined, a -> b and b -> c blocking: the region of a and c needs b's output and
    b needs a's. Apart they would wait forever; vertex i of each stage runs together."""
    topology = build_regions(
        _graph(
            {"a": 2, "b": 2, "c": 2},
            [("a", "c", PW, PIPELINED), ("a", "b", PW, BLOCKING), ("b", "c", PW, BLOCKING)],
        )
    )

    assert _regions(topology) == [
        {("a", 0), ("b", 0), ("c", 0)},
        {("a", 1), ("b", 1), ("c", 1)},
    ]


def test_a_cycle_of_logical_regions_through_an_all_to_all_makes_one_region() -> None:
    topology = build_regions(
        _graph(
            {"a": 2, "b": 3, "c": 2, "d": 2},
            [
                ("a", "c", PW, PIPELINED),
                ("a", "b", A2A, BLOCKING),
                ("b", "c", A2A, BLOCKING),
                ("c", "d", PW, BLOCKING),  # after the cycle: stays apart
            ],
        )
    )

    everything = _vertices("a", 0, 1) | _vertices("b", 0, 1, 2) | _vertices("c", 0, 1)
    assert _regions(topology) == [everything, {("d", 0)}, {("d", 1)}]


def test_logical_regions_one_after_the_other_do_not_merge() -> None:
    # b reads a's region, and nothing of that region waits for b.
    topology = build_regions(
        _graph(
            {"a": 2, "b": 2, "c": 2},
            [("a", "c", PW, PIPELINED), ("a", "b", PW, BLOCKING), ("c", "b", PW, BLOCKING)],
        )
    )

    assert _regions(topology) == [
        {("a", 0), ("c", 0)},
        {("a", 1), ("c", 1)},
        {("b", 0)},
        {("b", 1)},
    ]


# --- the topology ----------------------------------------------------------------------------


def test_region_of_returns_the_region_holding_each_vertex() -> None:
    topology = build_regions(
        _graph(
            {"a": 4, "b": 2, "c": 3},
            [("a", "b", PW, PIPELINED), ("b", "c", A2A, BLOCKING)],
        )
    )

    for region in topology.regions:
        for vertex in region:
            assert topology.region_of(vertex) is region
    assert topology.region_of(ExecutionVertexID("a", 3)) is topology.region_of(
        ExecutionVertexID("b", 1)
    )
    assert topology.region_of(ExecutionVertexID("c", 0)) != topology.region_of(
        ExecutionVertexID("c", 1)
    )


@pytest.mark.parametrize("vertex", [ExecutionVertexID("nope", 0), ExecutionVertexID("a", 2)])
def test_region_of_an_unknown_vertex_is_an_error(vertex: ExecutionVertexID) -> None:
    topology = build_regions(_graph({"a": 2}, []))

    with pytest.raises(InvalidOperationError, match=r"nope|no execution vertex 2"):
        topology.region_of(vertex)


def test_regions_are_numbered_by_first_vertex_in_topological_order() -> None:
    # Given out of order; topologically a, b, c, d. Logical regions {a, c}, {b} and {d}: the
    # regions of {a, c} start at a, so they come before b's although c comes after b.
    graph = StageGraph(
        [Stage("d", 1), Stage("c", 2), Stage("b", 2), Stage("a", 2)],
        [
            StageExchange("rc", "c", "d", PW, BLOCKING),
            StageExchange("rb", "a", "b", A2A, BLOCKING),
            StageExchange("ra", "a", "c", PW, PIPELINED),
            StageExchange("rbd", "b", "d", A2A, BLOCKING),
        ],
    )
    topology = build_regions(graph)

    assert [stage.name for stage in graph.stages] == ["a", "b", "c", "d"]
    assert [region.region_id for region in topology.regions] == [0, 1, 2, 3, 4]
    assert _regions(topology) == [
        {("a", 0), ("c", 0)},
        {("a", 1), ("c", 1)},
        {("b", 0)},
        {("b", 1)},
        {("d", 0)},
    ]


def test_region_lists_its_vertices_as_runs_per_stage() -> None:
    topology = build_regions(_graph({"a": 3, "b": 2}, [("a", "b", A2A, PIPELINED)]))
    (region,) = topology.regions

    assert region.vertex_ranges == (("a", range(3)), ("b", range(2)))
    assert len(region) == 5
    assert list(region)[3] == ExecutionVertexID("b", 0)
    assert ExecutionVertexID("b", 1) in region
    assert ExecutionVertexID("b", 2) not in region
    assert ("b", 1) not in region


def test_regions_do_not_depend_on_the_order_of_exchanges() -> None:
    stages = {"a": 2, "b": 6, "c": 3, "d": 2, "e": 5}
    exchanges = [
        ("a", "d", PW, PIPELINED),
        ("b", "c", PW, PIPELINED),
        ("c", "d", PW, PIPELINED),
        ("a", "b", PW, BLOCKING),
        ("d", "e", PW, PIPELINED),
        ("c", "e", PW, BLOCKING),
    ]
    expected = build_regions(_graph(stages, exchanges)).regions

    assert build_regions(_graph(stages, reversed(exchanges))).regions == expected


# --- against a direct computation ------------------------------------------------------------


def _reference(graph: StageGraph) -> set[frozenset[Vertex]]:
    """The regions by definition, computed the slow way: explicit vertex edges, connected
    components by search, and logical regions, then raw regions, merged when each can reach
    the other."""

    def pairs(exchange: StageExchange) -> list[tuple[Vertex, Vertex]]:
        producers = graph.stage(exchange.producer).parallelism
        consumers = graph.stage(exchange.consumer).parallelism
        return [
            ((exchange.producer, partition), (exchange.consumer, consumer))
            for consumer in range(consumers)
            for partition in (
                range(producers)
                if exchange.pattern is A2A
                else partitions_of_consumer(consumer, producers, consumers)
            )
        ]

    def components(
        nodes: Iterable[Vertex], edges: Iterable[tuple[Vertex, Vertex]]
    ) -> dict[Vertex, int]:
        neighbours: dict[Vertex, list[Vertex]] = {node: [] for node in nodes}
        for a, b in edges:
            neighbours[a].append(b)
            neighbours[b].append(a)
        label: dict[Vertex, int] = {}
        for start in neighbours:
            if start in label:
                continue
            label[start] = len(label)
            todo = [start]
            while todo:
                for other in neighbours[todo.pop()]:
                    if other not in label:
                        label[other] = label[start]
                        todo.append(other)
        return label

    def reachable(start: int, waits: dict[int, set[int]]) -> set[int]:
        seen = {start}
        todo = [start]
        while todo:
            for other in waits[todo.pop()]:
                if other not in seen:
                    seen.add(other)
                    todo.append(other)
        return seen

    def mutually_reachable(waits: dict[int, set[int]]) -> dict[int, set[int]]:
        reach = {label: reachable(label, waits) for label in waits}
        return {
            label: {other for other in reach[label] if label in reach[other]} for label in waits
        }

    pipelined = [e for e in graph.exchanges if e.partition_type.must_be_pipelined]
    stage_nodes = [(stage.name, 0) for stage in graph.stages]
    logical = components(stage_nodes, [((e.producer, 0), (e.consumer, 0)) for e in pipelined])
    # Logical regions that can each reach the other through the exchanges between them merge.
    between: dict[int, set[int]] = {label: set() for label in logical.values()}
    for e in graph.exchanges:
        if logical[(e.producer, 0)] != logical[(e.consumer, 0)]:
            between[logical[(e.producer, 0)]].add(logical[(e.consumer, 0)])
    cycles = mutually_reachable(between)
    logical = {node: min(cycles[label]) for node, label in logical.items()}
    result: set[frozenset[Vertex]] = set()
    for group in set(logical.values()):
        names = {name for (name, _), label in logical.items() if label == group}
        inside = [e for e in graph.exchanges if e.producer in names and e.consumer in names]
        vertices = [
            (name, index) for name in names for index in range(graph.stage(name).parallelism)
        ]
        if any(e.pattern is A2A for e in inside):
            result.add(frozenset(vertices))
            continue
        raw = components(
            vertices,
            [pair for e in inside if e.partition_type.must_be_pipelined for pair in pairs(e)],
        )
        waits: dict[int, set[int]] = {label: set() for label in raw.values()}
        for e in inside:
            if not e.partition_type.must_be_pipelined:
                for producer, consumer in pairs(e):
                    waits[raw[producer]].add(raw[consumer])

        for together in mutually_reachable(waits).values():
            result.add(frozenset(v for v in vertices if raw[v] in together))
    return result


def test_matches_a_direct_computation_on_random_small_graphs() -> None:
    rng = random.Random(20241122)
    kinds = list(ResultPartitionType)
    merged_a_cycle = merged_logical_regions = False
    for _ in range(400):
        count = rng.randint(1, 6)
        names = [f"s{index}" for index in range(count)]
        stages = [Stage(name, rng.randint(1, 7)) for name in names]
        exchanges = [
            StageExchange(
                f"r{i}-{j}",
                names[i],
                names[j],
                A2A if rng.random() < 0.1 else PW,
                rng.choice(kinds),
            )
            for i in range(count)
            for j in range(i + 1, count)
            if rng.random() < 0.6
        ]
        rng.shuffle(stages)
        graph = StageGraph(stages, exchanges)
        topology = build_regions(graph)

        expected = _reference(graph)
        assert {frozenset(_members(region)) for region in topology.regions} == expected
        assert len(topology.regions) == len(expected)
        # Numbered by first vertex in topological order.
        position = {stage.name: index for index, stage in enumerate(graph.stages)}
        firsts = [min((position[v.stage], v.index) for v in region) for region in topology.regions]
        assert firsts == sorted(firsts)
        assert [region.region_id for region in topology.regions] == list(range(len(firsts)))
        for region in topology.regions:
            for vertex in region:
                assert topology.region_of(vertex) is region

        without_blocking = StageGraph(
            stages, [e for e in exchanges if e.partition_type.must_be_pipelined]
        )
        # Logical regions by union-find over the pipelined exchanges.
        logical = {name: name for name in names}

        def find(name: str, logical: dict[str, str] = logical) -> str:
            while logical[name] != name:
                name = logical[name]
            return name

        for e in without_blocking.exchanges:
            logical[find(e.producer)] = find(e.consumer)
        if any(len({find(stage) for stage, _ in r.vertex_ranges}) > 1 for r in topology.regions):
            merged_logical_regions = True
        if len(build_regions(without_blocking).regions) > len(topology.regions) and not any(
            e.pattern is A2A for e in exchanges
        ):
            merged_a_cycle = True
    # The random graphs did exercise the cycle search, not only the simple paths.
    assert merged_a_cycle
    assert merged_logical_regions


# --- the cycle search on its own ---------------------------------------------------------------
# Pointwise exchanges rarely make cycles of more than two raw regions, so the search is also
# tested directly on region graphs that stage graphs hardly produce.


def _same_component(component: list[int]) -> set[frozenset[int]]:
    groups: dict[int, set[int]] = {}
    for node, label in enumerate(component):
        groups.setdefault(label, set()).add(node)
    return {frozenset(group) for group in groups.values()}


def test_cycle_search_puts_every_region_of_a_longer_cycle_together() -> None:
    # 0 -> 1 -> 2 -> 0 is a cycle; 2 -> 3 -> 4 -> 3 hangs off it; 5 is alone.
    successors = [[1], [2], [0, 3], [4], [3], []]

    assert _same_component(_strongly_connected(successors)) == {
        frozenset({0, 1, 2}),
        frozenset({3, 4}),
        frozenset({5}),
    }


def test_cycle_search_matches_mutual_reachability_on_random_graphs() -> None:
    rng = random.Random(7)
    for _ in range(300):
        count = rng.randint(1, 9)
        successors = [
            sorted({rng.randrange(count) for _ in range(rng.randint(0, 3))} - {node})
            for node in range(count)
        ]
        reach = []
        for start in range(count):
            seen = {start}
            todo = [start]
            while todo:
                for other in successors[todo.pop()]:
                    if other not in seen:
                        seen.add(other)
                        todo.append(other)
            reach.append(seen)
        expected = {
            frozenset(other for other in reach[node] if node in reach[other])
            for node in range(count)
        }

        assert _same_component(_strongly_connected(successors)) == expected


def test_cycle_search_walks_a_cycle_of_10000_regions_without_recursion() -> None:
    n = 10_000
    successors = [[(node + 1) % n] for node in range(n)]

    assert set(_strongly_connected(successors)) == {0}


# --- size ------------------------------------------------------------------------------------


def test_long_chain_of_single_vertex_stages_with_blocking_exchanges() -> None:
    length = 10_000
    graph = StageGraph(
        [Stage(f"s{index}", 1) for index in range(length)],
        [
            StageExchange(f"r{index}", f"s{index}", f"s{index + 1}", PW, BLOCKING)
            for index in range(length - 1)
        ],
    )

    topology = build_regions(graph)

    assert len(topology.regions) == length
    assert topology.region_of(ExecutionVertexID("s9999", 0)).region_id == length - 1


def test_long_path_between_raw_regions_needs_no_recursion() -> None:
    # The 3-vertex case above at n = 10,000: raw regions R0 -> R1 -> ... -> R9999, a path as
    # deep as the graph, which a recursive Tarjan could not walk.
    n = 10_000
    topology = build_regions(
        _graph(
            {"x": n, "y": n + 1, "z": n},
            [("x", "y", PW, PIPELINED), ("x", "z", PW, PIPELINED), ("y", "z", PW, BLOCKING)],
        )
    )

    assert len(topology.regions) == n
    last = topology.regions[-1]
    assert _members(last) == {("x", n - 1), ("y", n), ("z", n - 1)}


def test_big_blocking_all_to_all_makes_one_region_per_vertex() -> None:
    n = 10_000
    topology = build_regions(_graph({"a": n, "b": n}, [("a", "b", A2A, BLOCKING)]))

    assert len(topology.regions) == 2 * n
