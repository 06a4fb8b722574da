"""What a large all-to-all job costs the scheduler: O(n) groups, shared compressed descriptors,
regions - beside the naive per-edge representation, in one run.

Measured (each time the median of ``--repeat`` runs without tracemalloc; peak memory in one
more run under tracemalloc, which slows Python code down and so is never timed):

* **descriptors**, n x n all-to-all blocking (default n = 10,000): build the stage graph, its
  ConsumedPartitionGroup / ConsumerVertexGroup pair, the group's shared list of the n producers'
  shuffle descriptors (serialized with protobuf, zstd-compressed, offloaded to a blob store in a
  temporary directory since n x n is above the default threshold) and every one of the n
  consumers' deployment descriptors. The producers' shuffle descriptors exist before (they are
  what the producers registered) and are not counted.
* the compressed list's bytes beside the serialized list's bytes (the compression ratio).
* **regions**: pipelined regions of the n x n blocking all-to-all graph and of a pipelined
  pointwise chain of three n-wide stages.
* **naive** at ``--naive-n`` (default 2,000): one edge object per producer-consumer pair and a
  deployment descriptor per consumer carrying its own serialized copy of every descriptor (Flink
  before 1.13).

Goals (issue 5): descriptors <= 8 MiB and <= 100 ms, regions <= 50 ms, the compressed list at
least 80 % smaller than the serialized one (Flink: 12 MiB, 120 ms, -72 %).

Run from the repository root::

    python benchmarks/scheduling_scale.py
    python benchmarks/scheduling_scale.py --n 2000 --naive-n 500 --repeat 1

Results are printed and saved as JSON (``--output``, default
``benchmarks/results/scheduling_scale.json``).
"""

from __future__ import annotations

import argparse
import datetime as dt
import gc
import itertools
import statistics
import sys
import tempfile
import time
import tracemalloc
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from common import machine, save_results

from blob import BlobStore
from netty_like.descriptor import NettyShuffleDescriptor
from scheduling.deployment import (
    ConsumerDeploymentDescriptor,
    DescriptorCache,
    InlineDescriptors,
    OffloadedDescriptors,
    consumer_deployments,
    even_reads,
)
from scheduling.graph import Stage, StageExchange, StageGraph
from scheduling.groups import ConsumedPartitionGroup, build_groups
from scheduling.options import DESCRIPTOR_OFFLOAD_THRESHOLD
from scheduling.regions import build_regions
from shuffle_api import (
    DistributionPattern,
    InputGateDeploymentDescriptor,
    IntermediateResultPartitionID,
    ResultPartitionID,
    ResultPartitionType,
    ShuffleDescriptor,
    ShuffleDescriptorGroup,
    SubpartitionRange,
    serialize,
)

DEFAULT_OUTPUT = Path(__file__).resolve().parent / "results" / "scheduling_scale.json"
MIB = 1 << 20
GOALS = {"descriptors_mib": 8.0, "descriptors_ms": 100.0, "regions_ms": 50.0, "smaller": 0.80}
RESULT_ID = "shuffled"


def producer_descriptors(n: int, first_task: int = 0) -> list[ShuffleDescriptor]:
    """What n map tasks on 100 executors registered. Attempt ids are as pyspark_shuffle makes
    them: Spark's task attempt id, unique in the application (``first_task`` onwards)."""
    return [
        NettyShuffleDescriptor(
            ResultPartitionID(
                IntermediateResultPartitionID(RESULT_ID, index), f"task-{first_task + index}"
            ),
            producer_location=f"executor-{index % 100}",
            host=f"10.0.{index % 100 // 250}.{index % 100}",
            data_port=40_000 + index % 100,
            connection_index=0,
            store_url="/var/lib/pyshuffle/store",
        )
        for index in range(n)
    ]


def all_to_all(n: int, partition_type: ResultPartitionType) -> StageGraph:
    return StageGraph(
        [Stage("map", n), Stage("reduce", n)],
        [StageExchange(RESULT_ID, "map", "reduce", DistributionPattern.ALL_TO_ALL, partition_type)],
    )


def pointwise_chain(n: int) -> StageGraph:
    pipelined = ResultPartitionType.PIPELINED_BOUNDED
    return StageGraph(
        [Stage("source", n), Stage("map", n), Stage("sink", n)],
        [
            StageExchange("mapped", "source", "map", DistributionPattern.POINTWISE, pipelined),
            StageExchange("sunk", "map", "sink", DistributionPattern.POINTWISE, pipelined),
        ],
    )


def deploy(
    n: int, descriptors: Sequence[ShuffleDescriptor], blob_store: BlobStore
) -> list[ConsumerDeploymentDescriptor]:
    """Graph, groups, the shared compressed list and every consumer's deployment."""
    groups = build_groups(all_to_all(n, ResultPartitionType.BLOCKING))
    cache = DescriptorCache(
        blob_store=blob_store, offload_threshold=DESCRIPTOR_OFFLOAD_THRESHOLD.default
    )

    def descriptors_of(group: ConsumedPartitionGroup) -> Sequence[ShuffleDescriptor]:
        return descriptors[group.partitions.start : group.partitions.stop]

    return consumer_deployments(
        groups,
        "reduce",
        cache,
        descriptors_of,
        even_reads(n),
    )


@dataclass(frozen=True, slots=True)
class NaiveEdge:
    """Flink before 1.13: one object per producer-consumer pair."""

    partition: IntermediateResultPartitionID
    consumer: int


def deploy_naively(n: int, descriptors: Sequence[ShuffleDescriptor]) -> list[bytes]:
    """Per-edge objects, then per consumer a deployment descriptor serialized with its own copy
    of every descriptor its edges name."""
    edges = [
        [
            NaiveEdge(descriptor.result_partition_id.partition_id, consumer)
            for descriptor in descriptors
        ]
        for consumer in range(n)
    ]
    by_partition = {d.result_partition_id.partition_id: d for d in descriptors}
    return [
        serialize(
            InputGateDeploymentDescriptor(
                RESULT_ID,
                ResultPartitionType.BLOCKING,
                SubpartitionRange.single(consumer),
                tuple(by_partition[edge.partition] for edge in consumer_edges),
            )
        )
        for consumer, consumer_edges in enumerate(edges)
    ]


def timed(action: Callable[[], object], repeat: int) -> tuple[float, object]:
    """Median milliseconds of ``repeat`` runs (garbage collected before each), and the last
    result."""
    times = []
    result: object = None
    for _ in range(repeat):
        result = None
        gc.collect()
        started = time.perf_counter()
        result = action()
        times.append((time.perf_counter() - started) * 1000)
    return statistics.median(times), result


def peak_mib(action: Callable[[], object]) -> float:
    """Peak bytes Python allocated while ``action`` ran (its result kept alive until the end)."""
    gc.collect()
    tracemalloc.start()
    try:
        result = action()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    del result
    return peak / MIB


class Namespace(argparse.Namespace):
    n: int
    naive_n: int
    repeat: int
    output: Path


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=10_000, help="producers = consumers")
    parser.add_argument("--naive-n", type=int, default=2_000, help="n of the naive side")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--output", type=Path, default=DEFAULT_OUTPUT)
    args = parser.parse_args(argv, namespace=Namespace())

    n = args.n
    descriptors = producer_descriptors(n)
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="pyshuffle-bench-blobs-") as blobs:
        store = BlobStore(blobs)

        # Content-addressed: later runs would find the blob there and skip the write, so every
        # run reruns producer 0 (a new attempt id) to keep the write in the timing.
        reruns = itertools.count(n)

        def fresh_deploy() -> list[ConsumerDeploymentDescriptor]:
            descriptors[0] = producer_descriptors(1, first_task=next(reruns))[0]
            return deploy(n, descriptors, store)

        milliseconds, deployments = timed(fresh_deploy, args.repeat)
        memory = peak_mib(fresh_deploy)
        naive_n = args.naive_n
        naive_descriptors = descriptors[:naive_n]
        grouped_ms, _ = timed(lambda: deploy(naive_n, naive_descriptors, store), args.repeat)
        assert isinstance(deployments, list) and len(deployments) == n
        assert all(d.inputs[0].group is deployments[0].inputs[0].group for d in deployments)
        # The list the cache shares, of the descriptors as they are now.
        shared = deploy(n, descriptors, store)[0].inputs[0].group.descriptors
        compressed = (
            store.get(shared.blob_key)
            if isinstance(shared, OffloadedDescriptors)
            else shared.compressed
        )
    serialized = serialize(ShuffleDescriptorGroup(tuple(descriptors)))
    results["descriptors"] = {
        "n": n,
        "milliseconds": round(milliseconds, 1),
        "peak_mib": round(memory, 2),
        "offloaded": isinstance(shared, OffloadedDescriptors),
        "inline": isinstance(shared, InlineDescriptors),
        "serialized_bytes": len(serialized),
        "compressed_bytes": len(compressed),
        "smaller": round(1 - len(compressed) / len(serialized), 3),
    }

    blocking = all_to_all(n, ResultPartitionType.BLOCKING)
    chain = pointwise_chain(n)
    regions_ms, blocking_regions = timed(lambda: build_regions(blocking), args.repeat)
    chain_ms, chain_regions = timed(lambda: build_regions(chain), args.repeat)
    results["regions"] = {
        "blocking_all_to_all": {
            "n": n,
            "milliseconds": round(regions_ms, 1),
            "regions": len(blocking_regions.regions),  # type: ignore[attr-defined]
        },
        "pipelined_pointwise_chain": {
            "stages": 3,
            "n": n,
            "milliseconds": round(chain_ms, 1),
            "regions": len(chain_regions.regions),  # type: ignore[attr-defined]
        },
    }

    naive_ms, naive = timed(lambda: deploy_naively(naive_n, naive_descriptors), 1)
    naive_memory = peak_mib(lambda: deploy_naively(naive_n, naive_descriptors))
    assert isinstance(naive, list)
    results["naive"] = {
        "n": naive_n,
        "milliseconds": round(naive_ms, 1),
        "peak_mib": round(naive_memory, 2),
        "bytes_sent": sum(len(each) for each in naive),
        "grouped_milliseconds_same_n": round(grouped_ms, 1),
    }
    print_results(results)
    document = {
        "benchmark": "scheduling_scale",
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "parameters": {"n": n, "naive_n": naive_n, "repeat": args.repeat},
        "environment": machine(),
        "goals": GOALS,
        "results": results,
    }
    save_results(args.output, document)
    return 0


def print_results(results: dict[str, Any]) -> None:
    d, r, naive = results["descriptors"], results["regions"], results["naive"]
    n = d["n"]
    print(f"descriptors, {n:,} x {n:,} all-to-all (groups + shared list + {n:,} deployments):")
    print(f"  time {d['milliseconds']:.1f} ms (goal <= {GOALS['descriptors_ms']:.0f} ms)")
    print(f"  peak memory {d['peak_mib']:.2f} MiB (goal <= {GOALS['descriptors_mib']:.0f} MiB)")
    print(
        f"  list of {n:,} descriptors: {d['serialized_bytes']:,} bytes serialized,"
        f" {d['compressed_bytes']:,} compressed ({d['smaller']:.0%} smaller,"
        f" goal >= {GOALS['smaller']:.0%}); offloaded to the blob store: {d['offloaded']}"
    )
    blocking, chain = r["blocking_all_to_all"], r["pipelined_pointwise_chain"]
    print(
        f"regions: blocking all-to-all {n:,} x {n:,}: {blocking['milliseconds']:.1f} ms"
        f" ({blocking['regions']:,} regions); pipelined pointwise chain 3 x {n:,}:"
        f" {chain['milliseconds']:.1f} ms ({chain['regions']:,} regions)"
        f" (goal <= {GOALS['regions_ms']:.0f} ms)"
    )
    m = naive["n"]
    print(
        f"naive per-edge at {m:,} x {m:,}: {naive['milliseconds']:,.0f} ms,"
        f" peak {naive['peak_mib']:,.1f} MiB, {naive['bytes_sent']:,} bytes of deployment"
        f" descriptors; grouped at the same n: {naive['grouped_milliseconds_same_n']:.1f} ms"
    )


if __name__ == "__main__":
    sys.exit(main())
