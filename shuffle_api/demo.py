"""``pyshuffle demo``: a hash shuffle of generated events through the configured service.

Map tasks on two "executors" (shuffle environments) write events partitioned by user; reduce
tasks read their subpartitions (locally, or over the other executor's data port) and total the
amount per user; the result is checked against pyarrow's own group-by of the same data.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from shuffle_api.config import Configuration
from shuffle_api.descriptors import (
    InputGateDeploymentDescriptor,
    PartitionDescriptor,
    ResultPartitionDeploymentDescriptor,
    ResultPartitionType,
    ShuffleDescriptor,
    SubpartitionRange,
)
from shuffle_api.environment import ShuffleEnvironment, ShuffleIOOwner
from shuffle_api.factory import (
    ShuffleEnvironmentContext,
    ShuffleMasterContext,
    load_shuffle_service_factory,
)
from shuffle_api.ids import IntermediateResultPartitionID, new_id
from shuffle_api.io import PartitionStatistics
from shuffle_api.master import RecordingJobContext, ShuffleMaster
from shuffle_api.options import SHUFFLE_SERVICE_FACTORY_CLASS

__all__ = ["main"]

CATEGORIES = ["books", "games", "garden", "music", "sports", "travel"]


def generate_events(rows: int, users: int, batch_rows: int, seed: int) -> list[pa.RecordBatch]:
    generator = np.random.default_rng(seed)
    start = np.datetime64("2026-11-01T00:00:00", "ms").astype(np.int64)
    batches = []
    for offset in range(0, rows, batch_rows):
        count = min(batch_rows, rows - offset)
        batches.append(
            pa.record_batch(
                {
                    "user": pa.array(generator.integers(0, users, count)),
                    "time": pa.array(
                        start + generator.integers(0, 30 * 86_400_000, count), pa.timestamp("ms")
                    ),
                    "amount": pa.array(np.round(generator.exponential(20.0, count), 2)),
                    "category": pa.DictionaryArray.from_arrays(
                        pa.array(generator.integers(0, len(CATEGORIES), count), pa.int8()),
                        CATEGORIES,
                    ).cast(pa.string()),
                }
            )
        )
    return batches


def user_subpartition(users: pa.Array, reducers: int) -> npt.NDArray[np.int64]:
    """A multiplicative hash of the user id, so neighbouring ids spread over reducers."""
    mixed = users.to_numpy().astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15)
    subpartitions: npt.NDArray[np.int64] = ((mixed >> np.uint64(40)) % np.uint64(reducers)).astype(
        np.int64
    )
    return subpartitions


@dataclass(frozen=True)
class StageTimes:
    map_seconds: float
    reduce_seconds: float


def run_map(
    master: ShuffleMaster,
    job_id: str,
    *,
    environments: Sequence[ShuffleEnvironment],
    batches: Sequence[pa.RecordBatch],
    maps: int,
    reducers: int,
    result_id: str,
) -> tuple[list[ShuffleDescriptor], list[PartitionStatistics]]:
    def map_task(index: int) -> tuple[ShuffleDescriptor, PartitionStatistics]:
        environment = environments[index % len(environments)]
        attempt = f"map-{index}-{new_id()[:8]}"
        descriptor = PartitionDescriptor(
            result_id,
            maps,
            IntermediateResultPartitionID(result_id, index),
            ResultPartitionType.BLOCKING,
            reducers,
        )
        shuffle_descriptor = master.register_partition_with_producer(
            job_id, descriptor, environment.producer_descriptor(attempt)
        ).result()
        [writer] = environment.create_result_partition_writers(
            ShuffleIOOwner(f"map {index}", attempt),
            [ResultPartitionDeploymentDescriptor(descriptor, shuffle_descriptor)],
        )
        with writer:
            for batch in batches[index::maps]:
                writer.write(batch, user_subpartition(batch.column("user"), reducers))
            return shuffle_descriptor, writer.finish()

    with ThreadPoolExecutor(max_workers=2) as pool:
        done = list(pool.map(map_task, range(maps)))
    return [d for d, _ in done], [s for _, s in done]


def run_reduce(
    environments: Sequence[ShuffleEnvironment],
    descriptors: Sequence[ShuffleDescriptor],
    reducers: int,
    result_id: str,
) -> pa.Table:
    def reduce_task(index: int) -> pa.Table:
        environment = environments[(index + 1) % len(environments)]
        [gate] = environment.create_input_gates(
            ShuffleIOOwner(f"reduce {index}", f"reduce-{index}-{new_id()[:8]}"),
            [
                InputGateDeploymentDescriptor(
                    result_id,
                    ResultPartitionType.BLOCKING,
                    SubpartitionRange.single(index),
                    tuple(descriptors),
                )
            ],
        )
        with gate:
            events = pa.Table.from_batches(list(gate))
        return events.group_by("user").aggregate([("amount", "sum"), ("amount", "count")])

    with ThreadPoolExecutor(max_workers=2) as pool:
        return pa.concat_tables(pool.map(reduce_task, range(reducers)))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="pyshuffle demo", description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=5_000_000, help="events to generate")
    parser.add_argument("--users", type=int, default=200_000, help="distinct users")
    parser.add_argument("--maps", type=int, default=8, help="map tasks (producer partitions)")
    parser.add_argument("--reducers", type=int, default=16, help="reduce tasks (subpartitions)")
    parser.add_argument("--config", help="TOML config file (else defaults + PYSHUFFLE_ variables)")
    parser.add_argument("--seed", type=int, default=2026)
    args = parser.parse_args(argv)

    config = Configuration.load(toml_file=args.config)
    factory = load_shuffle_service_factory(config)
    print(f"shuffle service: {config.get(SHUFFLE_SERVICE_FACTORY_CLASS)}")
    started = time.perf_counter()
    batches = generate_events(args.rows, args.users, 100_000, args.seed)
    input_bytes = sum(batch.nbytes for batch in batches)
    print(
        f"generated {args.rows:,} events ({input_bytes / 1e6:,.1f} MB) in"
        f" {time.perf_counter() - started:.2f} s"
    )

    job = RecordingJobContext("demo-" + new_id()[:8])
    result_id = "events-by-user"
    master = factory.create_shuffle_master(ShuffleMasterContext(config))
    environments = [
        factory.create_shuffle_environment(
            ShuffleEnvironmentContext(config, resource_id=f"executor-{n}", host="127.0.0.1")
        )
        for n in (1, 2)
    ]
    with master:
        master.register_job(job)
        ports = [environment.start() for environment in environments]
        try:
            began = time.perf_counter()
            descriptors, statistics = run_map(
                master,
                job.job_id,
                environments=environments,
                batches=batches,
                maps=args.maps,
                reducers=args.reducers,
                result_id=result_id,
            )
            mapped = time.perf_counter()
            totals = run_reduce(environments, descriptors, args.reducers, result_id)
            times = StageTimes(mapped - began, time.perf_counter() - mapped)
        finally:
            master.unregister_job(job.job_id)
            for environment in environments:
                environment.close()

    stored = sum(s.total_bytes for s in statistics)
    per_reducer = np.sum([s.rows_per_subpartition for s in statistics], axis=0)
    print(f"executors' data ports: {ports}")
    print(
        f"map stage:    {args.maps} tasks wrote {sum(s.total_rows for s in statistics):,} rows,"
        f" {stored / 1e6:,.1f} MB stored, in {times.map_seconds:.2f} s"
    )
    print(
        f"reduce stage: {args.reducers} tasks read {int(per_reducer.sum()):,} rows"
        f" (min {int(per_reducer.min()):,} / max {int(per_reducer.max()):,} per reducer)"
        f" in {times.reduce_seconds:.2f} s"
    )
    top = totals.sort_by([("amount_sum", "descending")]).slice(0, 5)
    print("top users by amount:")
    for user, amount, count in zip(
        top.column("user").to_pylist(),
        top.column("amount_sum").to_pylist(),
        top.column("amount_count").to_pylist(),
        strict=True,
    ):
        print(f"  user {user:>8}: {amount:>12,.2f} over {count} events")

    expected = (
        pa.Table.from_batches(batches)
        .group_by("user")
        .aggregate([("amount", "sum"), ("amount", "count")])
    )
    got = totals.sort_by("user")
    want = expected.sort_by("user")
    same = (
        got.column("user").equals(want.column("user"))
        and got.column("amount_count").equals(want.column("amount_count"))
        and np.allclose(got.column("amount_sum").to_numpy(), want.column("amount_sum").to_numpy())
    )
    print(
        f"verified against pyarrow's group-by: {'OK' if same else 'MISMATCH'}"
        f" ({got.num_rows:,} users)"
    )
    return 0 if same else 1
