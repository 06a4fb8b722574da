"""Pipelined regions, after Flink's LogicalPipelinedRegionComputeUtil and
SchedulingPipelinedRegionComputeUtil.

A pipelined region is a set of execution vertices that must run at the same time because data
flows between them through partitions that must be consumed while they are produced. The
scheduler starts a region as a whole, and a blocking partition can be released once every
region consuming it has finished.

How regions are built, all O(n) in execution vertices plus pointwise connections:

1. Logical regions: union-find (by size) over stages, merging the two ends of every exchange whose
   partition type must be pipelined. Then logical regions that wait for each other in a cycle
   through the exchanges between them (a -> c pipelined, a -> b and b -> c blocking: the
   region of a and c needs b's output, b needs a's) merge, each strongly connected set into
   one, as Flink's mergeRegionsOnCycles does; scheduled apart they would wait forever. Only
   a logical region of several stages can be on such a cycle (stages are topologically
   ordered), so a graph without one skips the search.
2. A logical region holding an all-to-all exchange between two of its own stages becomes one
   region of all its execution vertices, as in Flink: such an exchange links every raw region of
   its producer stage to every raw region of its consumer stage, so the raw regions nearly always
   end up merged anyway, and finding that out would cost a cycle search over S x T edges.
3. A logical region whose exchanges are all one-to-one (pointwise between stages of equal
   parallelism, the common forward chain) makes region i of vertex i of every stage.
4. Otherwise raw regions come from union-find over its execution vertices along its pipelined
   pointwise exchanges; its blocking and hybrid pointwise exchanges make a graph between raw
   regions in which every strongly connected component (iterative Tarjan) would deadlock if
   scheduled apart, so each becomes one region.
5. Exchanges between two (merged) logical regions never merge anything.

Regions are numbered in the order of their first vertex (stages in topological order, then
vertex index), so the numbering is deterministic and producers tend to come first.
"""

from __future__ import annotations

from array import array
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from itertools import repeat

from scheduling.graph import ExecutionVertexID, Stage, StageExchange, StageGraph
from scheduling.pointwise import consumers_of_partition, partitions_of_consumer
from shuffle_api import DistributionPattern, InvalidOperationError, ResultPartitionType

__all__ = ["PipelinedRegion", "RegionTopology", "build_regions"]

VertexRange = tuple[str, range]
"""A run of consecutive execution vertices of one stage: ``(stage name, indexes)``."""


@dataclass(frozen=True, slots=True)
class PipelinedRegion:
    """Execution vertices that are scheduled together.

    ``vertex_ranges`` holds runs of consecutive vertex indexes, stages in topological order and
    indexes ascending (a stage appears more than once if its vertices in the region are not
    consecutive). Runs instead of one object per vertex: a region of a 10,000 x 10,000 pipelined
    all-to-all graph is two runs, not 20,000 objects.
    """

    region_id: int
    vertex_ranges: tuple[VertexRange, ...]

    def __len__(self) -> int:
        return sum(len(indexes) for _, indexes in self.vertex_ranges)

    def __iter__(self) -> Iterator[ExecutionVertexID]:
        for stage, indexes in self.vertex_ranges:
            for index in indexes:
                yield ExecutionVertexID(stage, index)

    def __contains__(self, vertex: object) -> bool:
        if not isinstance(vertex, ExecutionVertexID):
            return False
        return any(
            stage == vertex.stage and vertex.index in indexes
            for stage, indexes in self.vertex_ranges
        )


class RegionTopology:
    """The pipelined regions of one stage graph, with an O(1) vertex -> region lookup."""

    __slots__ = ("_region_index", "_regions")

    def __init__(
        self, regions: tuple[PipelinedRegion, ...], region_index: dict[str, Sequence[int]]
    ) -> None:
        self._regions = regions
        # Per stage the region id of each vertex: a range or an array of machine ints.
        self._region_index = region_index

    @property
    def regions(self) -> tuple[PipelinedRegion, ...]:
        """Every region, ``regions[i].region_id == i``, ordered by first vertex."""
        return self._regions

    def __len__(self) -> int:
        return len(self._regions)

    def region_of(self, vertex: ExecutionVertexID) -> PipelinedRegion:
        """The region holding ``vertex``."""
        indexes = self._region_index.get(vertex.stage)
        if indexes is None:
            raise InvalidOperationError(f"no stage named {vertex.stage!r}")
        if not 0 <= vertex.index < len(indexes):
            raise InvalidOperationError(
                f"stage {vertex.stage!r} has no execution vertex {vertex.index}"
                f" (parallelism {len(indexes)})"
            )
        return self._regions[indexes[vertex.index]]


# --- building --------------------------------------------------------------------------------

# A tuple: ``in`` tries identity first, where the enum's flag properties (and its hash) cost
# microseconds per exchange, and a graph may have 10,000 exchanges.
_MUST_BE_PIPELINED = tuple(kind for kind in ResultPartitionType if kind.must_be_pipelined)

# The dataclass __init__ of a frozen class sets each field through object.__setattr__, which
# costs about twice as much as the slots' own descriptors; a 10,000 x 10,000 blocking graph makes
# 20,000 regions, so the builder uses the descriptors directly.
_new_object = object.__new__
_set_region_id: Callable[[PipelinedRegion, int], None] = vars(PipelinedRegion)["region_id"].__set__
_set_vertex_ranges: Callable[[PipelinedRegion, tuple[VertexRange, ...]], None] = vars(
    PipelinedRegion
)["vertex_ranges"].__set__


def _new_region(region_id: int, vertex_ranges: tuple[VertexRange, ...]) -> PipelinedRegion:
    region: PipelinedRegion = _new_object(PipelinedRegion)
    _set_region_id(region, region_id)
    _set_vertex_ranges(region, vertex_ranges)
    return region


def _single_vertex_ranges(width: int) -> list[range]:
    """``range(i, i + 1)`` for every vertex ``i`` of a stage, built in C: regions are made by
    the ten thousand, and zip/map/repeat over these keep Python out of the loop."""
    return list(map(range, range(width), range(1, width + 1)))


_FIRST_ONLY = range(1)  # immutable, so every single-vertex run can share it

# Stands in for the regions of a logical region until its last stage completes their runs.
_PENDING = PipelinedRegion(-1, ())


class _LogicalRegion:
    """Scratch state of one logical region of several stages while regions are numbered."""

    __slots__ = (
        "exchanges",
        "global_ids",
        "labels",
        "lockstep",
        "offsets",
        "runs",
        "stages",
        "whole",
    )

    def __init__(self) -> None:
        self.stages: list[Stage] = []
        self.exchanges: list[StageExchange] = []
        # An all-to-all exchange inside: one region of everything, no cycle search.
        self.whole = False
        # Only one-to-one exchanges inside (every stage as wide as the next, the common forward
        # chain): region i is vertex i of every stage, no union-find or cycle search.
        self.lockstep = False
        # Otherwise the region label of each vertex (stages at offsets in one list), labels
        # numbered by first vertex, and per label the runs of vertices gathered so far.
        self.offsets: dict[str, int] = {}
        self.labels: list[int] = []
        self.runs: list[list[VertexRange]] = []
        # Label -> region id of the labels met so far.
        self.global_ids: list[int] = []


def _find(parent: list[int], node: int) -> int:
    # Path halving keeps the trees flat without recursion.
    while True:
        up = parent[node]
        if up == node:
            return node
        grand = parent[up]
        parent[node] = grand
        node = grand


def _union(parent: list[int], size: list[int], a: int, b: int) -> None:
    a = _find(parent, a)
    b = _find(parent, b)
    if a == b:
        return
    if size[a] < size[b]:
        a, b = b, a
    parent[b] = a
    size[a] += size[b]


def _pointwise_pairs(
    producers: int, consumers: int, producer_base: int, consumer_base: int
) -> Iterable[tuple[int, int]]:
    """Every (producer vertex, consumer vertex) pair of a pointwise exchange, as indexes from
    the given bases, O(producers + consumers)."""
    if producers == consumers:
        # One to one, the common case: pairs straight from two ranges, no Python per pair.
        return zip(
            range(producer_base, producer_base + producers),
            range(consumer_base, consumer_base + consumers),
            strict=True,
        )
    return _pointwise_pairs_uneven(producers, consumers, producer_base, consumer_base)


def _pointwise_pairs_uneven(
    producers: int, consumers: int, producer_base: int, consumer_base: int
) -> Iterator[tuple[int, int]]:
    if producers > consumers:
        for consumer in range(consumers):
            for partition in partitions_of_consumer(consumer, producers, consumers):
                yield producer_base + partition, consumer_base + consumer
    else:
        for partition in range(producers):
            for consumer in consumers_of_partition(partition, producers, consumers):
                yield producer_base + partition, consumer_base + consumer


def _strongly_connected(successors: list[list[int]]) -> list[int]:
    """Tarjan's SCC, iterative (a chain of 10,000 regions must not hit the recursion limit).

    Returns the component number of every node.
    """
    count = len(successors)
    order = [-1] * count  # discovery index, -1 = not visited
    low = [0] * count
    on_stack = [False] * count
    component = [-1] * count
    stack: list[int] = []
    visited = 0
    components = 0
    for root in range(count):
        if order[root] != -1:
            continue
        order[root] = low[root] = visited
        visited += 1
        stack.append(root)
        on_stack[root] = True
        # The call stack made explicit: (node, position of its next successor to look at).
        work = [(root, 0)]
        while work:
            node, position = work[-1]
            children = successors[node]
            if position < len(children):
                work[-1] = (node, position + 1)
                child = children[position]
                if order[child] == -1:
                    order[child] = low[child] = visited
                    visited += 1
                    stack.append(child)
                    on_stack[child] = True
                    work.append((child, 0))
                elif on_stack[child] and order[child] < low[node]:
                    low[node] = order[child]
                continue
            work.pop()
            if low[node] == order[node]:
                while True:
                    member = stack.pop()
                    on_stack[member] = False
                    component[member] = components
                    if member == node:
                        break
                components += 1
            if work:
                caller = work[-1][0]
                low[caller] = min(low[caller], low[node])
    return component


def _first_seen(labels: list[int], count: int) -> list[int]:
    """``labels`` renumbered 0, 1, 2, ... in the order each first appears."""
    renumbered = [-1] * count
    seen = 0
    out = [0] * len(labels)
    for vertex, label in enumerate(labels):
        new = renumbered[label]
        if new == -1:
            new = renumbered[label] = seen
            seen += 1
        out[vertex] = new
    return out


def _split(logical: _LogicalRegion) -> None:
    """Label every vertex of a logical region that has no all-to-all exchange inside."""
    offsets = logical.offsets
    parallelism: dict[str, int] = {}
    total = 0
    for stage in logical.stages:
        offsets[stage.name] = total
        parallelism[stage.name] = stage.parallelism
        total += stage.parallelism
    if all(
        parallelism[exchange.producer] == parallelism[exchange.consumer]
        for exchange in logical.exchanges
    ):
        logical.lockstep = True
        return

    def connections(exchange: StageExchange) -> Iterable[tuple[int, int]]:
        return _pointwise_pairs(
            parallelism[exchange.producer],
            parallelism[exchange.consumer],
            offsets[exchange.producer],
            offsets[exchange.consumer],
        )

    exchanges = logical.exchanges
    pipelined = [
        exchange for exchange in exchanges if exchange.partition_type in _MUST_BE_PIPELINED
    ]
    later = [
        exchange for exchange in exchanges if exchange.partition_type not in _MUST_BE_PIPELINED
    ]
    labels, count = _raw_region_labels(total, map(connections, pipelined))
    labels, count = _merge_waiting_raw_regions(labels, count, map(connections, later))
    logical.labels = labels
    logical.runs = [[] for _ in range(count)]


def _raw_region_labels(
    total: int, pipelined: Iterable[Iterable[tuple[int, int]]]
) -> tuple[list[int], int]:
    """Raw regions: union-find over ``total`` vertices along the connections of the pipelined
    (pointwise) exchanges. Returns the label of every vertex, labels numbered by first vertex,
    and the number of labels."""
    # The finds are written out (path halving) rather than called: this loop runs once per
    # connection.
    parent = list(range(total))
    size = [1] * total
    for pairs in pipelined:
        for producer, consumer in pairs:
            a = producer
            while parent[a] != a:
                parent[a] = parent[parent[a]]
                a = parent[a]
            b = consumer
            while parent[b] != b:
                parent[b] = parent[parent[b]]
                b = parent[b]
            if a != b:
                if size[a] < size[b]:
                    a, b = b, a
                parent[b] = a
                size[a] += size[b]
    # Pointing each vertex at its root keeps the walks of later vertices short.
    label_of_root = [-1] * total
    labels = [0] * total
    count = 0
    for vertex in range(total):
        root = parent[vertex]
        while parent[root] != root:
            root = parent[root]
        parent[vertex] = root
        label = label_of_root[root]
        if label == -1:
            label = label_of_root[root] = count
            count += 1
        labels[vertex] = label
    return labels, count


def _merge_waiting_raw_regions(
    labels: list[int], count: int, blocking: Iterable[Iterable[tuple[int, int]]]
) -> tuple[list[int], int]:
    """Merge the raw regions that the connections of the blocking or hybrid exchanges make
    wait for each other in a cycle; returns the new labels (by first vertex) and their count."""
    # Edges between raw regions, without duplicates or self loops (a blocking exchange within
    # one region cannot deadlock it).
    edges: set[tuple[int, int]] = set()
    for pairs in blocking:
        for producer, consumer in pairs:
            source = labels[producer]
            target = labels[consumer]
            if source != target:
                edges.add((source, target))
    if not edges:
        return labels, count
    successors: list[list[int]] = [[] for _ in range(count)]
    for source, target in sorted(edges):  # sorted: the same graph, the same walk
        successors[source].append(target)
    component = _strongly_connected(successors)
    labels = _first_seen([component[label] for label in labels], count)
    return labels, max(labels) + 1


def _number_stage(
    logical: _LogicalRegion,
    stage: Stage,
    regions: list[PipelinedRegion],
    region_index: dict[str, Sequence[int]],
) -> None:
    """Give region ids to the vertices of one stage of a split logical region, gathering runs."""
    name = stage.name
    width = stage.parallelism
    base = logical.offsets[name]
    labels = logical.labels[base : base + width]
    global_ids = logical.global_ids
    # Labels are numbered by first vertex, so the labels this stage meets first are the next
    # ones in line and get the next region ids, all at once.
    new = max(labels) + 1 - len(global_ids)
    if new > 0:
        first = len(regions)
        global_ids.extend(range(first, first + new))
        regions.extend([_PENDING] * new)
    region_index[name] = array("q", [global_ids[label] for label in labels])
    runs = logical.runs
    start = 0
    current = labels[0]
    for vertex, label in enumerate(labels):
        if label != current:
            runs[current].append((name, range(start, vertex)))
            start = vertex
            current = label
    runs[current].append((name, range(start, width)))


def _merge_cycles(
    graph: StageGraph, position: dict[str, int], parent: list[int], size: list[int]
) -> None:
    """Union the logical regions of every strongly connected set of the graph that the
    exchanges between logical regions make (nodes: the logical regions' root stages)."""
    roots = [_find(parent, index) for index in range(len(position))]
    successors: list[list[int]] = [[] for _ in roots]
    for exchange in graph.exchanges:
        source, target = roots[position[exchange.producer]], roots[position[exchange.consumer]]
        if source != target:
            successors[source].append(target)
    component = _strongly_connected(successors)
    first_root_of: dict[int, int] = {}
    for index, root in enumerate(roots):
        if root == index:
            _union(parent, size, first_root_of.setdefault(component[root], root), root)


def _logical_roots(graph: StageGraph, position: dict[str, int]) -> tuple[list[int], list[int]]:
    """Logical regions: union-find over stages along the must-be-pipelined exchanges, cycles
    merged. Returns the root of every stage and the size of every root's set."""
    count = len(graph.stages)
    parent = list(range(count))
    size = [1] * count
    for exchange in graph.exchanges:
        if exchange.partition_type in _MUST_BE_PIPELINED:
            _union(parent, size, position[exchange.producer], position[exchange.consumer])
    if max(size, default=1) > 1:  # some exchange merged two stages
        _merge_cycles(graph, position, parent, size)
    return [_find(parent, index) for index in range(count)], size


def _merged_logical_regions(
    graph: StageGraph, position: dict[str, int], root_of: list[int], size: list[int]
) -> dict[int, _LogicalRegion]:
    """Scratch state of every logical region of several stages, by root: its stages and the
    exchanges inside it."""
    # Only logical regions of several stages get scratch state: a blocking graph of 10,000
    # stages is 10,000 single-stage logical regions and must not pay for them.
    merged: dict[int, _LogicalRegion] = {}
    for index, stage in enumerate(graph.stages):
        root = root_of[index]
        if size[root] > 1:
            logical = merged.get(root)
            if logical is None:
                logical = merged[root] = _LogicalRegion()
            logical.stages.append(stage)
    for exchange in graph.exchanges if merged else ():
        root = root_of[position[exchange.producer]]
        if size[root] == 1 or root != root_of[position[exchange.consumer]]:
            continue  # between logical regions: merges nothing
        logical = merged[root]
        logical.exchanges.append(exchange)
        if exchange.pattern is DistributionPattern.ALL_TO_ALL:
            logical.whole = True
    return merged


def _number_own_regions(
    stage: Stage, regions: list[PipelinedRegion], region_index: dict[str, Sequence[int]]
) -> None:
    """Make every vertex of a stage alone in its logical region a region of its own."""
    # The common case of a blocking graph, so no per-vertex bookkeeping, and a range as the
    # stage's index (no memory per vertex).
    name = stage.name
    width = stage.parallelism
    first = len(regions)
    region_index[name] = range(first, first + width)
    if width == 1:  # a long chain of single-vertex stages: no list per stage
        regions.append(_new_region(first, ((name, _FIRST_ONLY),)))
        return
    own_runs = zip(zip(repeat(name), _single_vertex_ranges(width)))
    regions.extend(map(_new_region, range(first, first + width), own_runs))


def _number_whole(
    logical: _LogicalRegion,
    stage: Stage,
    regions: list[PipelinedRegion],
    region_index: dict[str, Sequence[int]],
) -> None:
    """Number one stage of a logical region that is one region of everything."""
    if stage is logical.stages[0]:
        first = len(regions)
        ranges = tuple((member.name, range(member.parallelism)) for member in logical.stages)
        regions.append(_new_region(first, ranges))
        logical.global_ids = [first]
    region_index[stage.name] = array("q", logical.global_ids) * stage.parallelism


def _number_lockstep(
    logical: _LogicalRegion,
    stage: Stage,
    regions: list[PipelinedRegion],
    region_index: dict[str, Sequence[int]],
) -> None:
    """Number one stage of a logical region of one-to-one exchanges only."""
    width = stage.parallelism
    if stage is logical.stages[0]:
        first = len(regions)
        # Region i holds run (stage, [i, i]) of every stage.
        singles = _single_vertex_ranges(width)
        lockstep_runs = zip(
            *[zip(repeat(member.name), singles) for member in logical.stages], strict=True
        )
        regions.extend(map(_new_region, range(first, first + width), lockstep_runs))
        logical.global_ids = [first]
    region_index[stage.name] = range(logical.global_ids[0], logical.global_ids[0] + width)


def _complete_runs(logical: _LogicalRegion, regions: list[PipelinedRegion]) -> None:
    """Replace the pending regions of a split logical region, once its last stage has been
    numbered, by regions of the runs gathered."""
    for label, runs in enumerate(logical.runs):
        region_id = logical.global_ids[label]
        regions[region_id] = _new_region(region_id, tuple(runs))
    logical.runs = []


def build_regions(graph: StageGraph) -> RegionTopology:
    """The pipelined regions of ``graph`` (see the module docstring for the rules)."""
    stages = graph.stages
    position = {stage.name: index for index, stage in enumerate(stages)}
    root_of, size = _logical_roots(graph, position)
    merged = _merged_logical_regions(graph, position, root_of, size)
    for logical in merged.values():
        if not logical.whole:
            _split(logical)

    # Number the regions by first vertex: one pass over the stages in topological order.
    regions: list[PipelinedRegion] = []
    region_index: dict[str, Sequence[int]] = {}
    for index, stage in enumerate(stages):
        root = root_of[index]
        if size[root] == 1:
            _number_own_regions(stage, regions, region_index)
            continue
        logical = merged[root]
        if logical.whole:
            _number_whole(logical, stage, regions, region_index)
        elif logical.lockstep:
            _number_lockstep(logical, stage, regions, region_index)
        else:
            _number_stage(logical, stage, regions, region_index)
            if stage is logical.stages[-1]:
                _complete_runs(logical, regions)
    return RegionTopology(tuple(regions), region_index)
