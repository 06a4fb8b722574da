"""What a block costs the default service's format, in one process: ``--maps`` map outputs,
each of ``--rows-per-block`` rows for each of ``--reducers`` subpartitions, written, then read
reducer by reducer (each reads its subpartition of every map output), beside a minimal
hand-written pyarrow shuffle of the same blocks, in one run.

- **service**: one environment of the default service (``netty_like``, a local store): each
  map output written by a ``ResultPartitionWriter`` (``writer.write(batch, indexes)``), each
  reducer an input gate over every map output, as a reduce task reads them (the partitions
  are this process's own: read from its store, no data port). With ``--service
  external_shuffle``: pushed to one worker daemon, each reducer reading over its data port
  (``store_shared=False``, as from another host).
- **merged** (default service): the same map outputs merged per subpartition
  (``shuffle_runtime.format.merge_partitions``: each reducer's runs of every map output copied
  as they are into one run of one partition, ``--merged-partitions`` of them, a host's each),
  then each reducer reading its run of each merged partition with the format's reader (the
  partition reader a gate uses, without the gate). The merge's time and the merged reads'
  are both per block of the map outputs.
- **minimal**: per map output, the rows gathered by subpartition (a stable argsort and a
  ``take``), one IPC file of one batch per subpartition (``pa.ipc.new_file``), the byte range
  of each batch kept in memory; each reducer memory-maps every file (once: the maps are kept,
  as the service keeps its files open) and decodes its batch from it. No checksums, index,
  manifest or commit: the floor of this layout in Python.

Spark, tasks and the network are left out (``many_partitions.py`` has them): these are the
format's costs per block, which a map task and a reducer pay for each map output x reducer.
Every time is the best of ``--repeat`` runs (CPU a block read: over all of them, this
process's and, on the external service, the worker's); the rows read are counted and checked.

    python benchmarks/small_blocks.py
    python benchmarks/small_blocks.py --maps 1000 --reducers 4000
    python benchmarks/small_blocks.py --service external_shuffle
    python benchmarks/small_blocks.py --maps 1000 --reducers 1000 --rows-per-block 2
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
from common import machine, positive, save_results

from external_shuffle.local_cluster import LocalCluster
from shuffle_api import (
    Configuration,
    InputGateDeploymentDescriptor,
    IntermediateResultPartitionID,
    ResultPartitionID,
    ResultPartitionType,
    ShuffleDescriptor,
    ShuffleIOOwner,
    SubpartitionRange,
    new_id,
)
from shuffle_api.testing import ConformanceHarness, ShuffleScenario
from shuffle_runtime.format import Layouts, PartitionFileReader, merge_partitions
from shuffle_runtime.store import Store

DEFAULT_OUTPUT = Path(__file__).resolve().parent / "results" / "small_blocks.json"
SERVICES = ("netty_like", "external_shuffle")


def map_output(map_index: int, rows: int, reducers: int) -> tuple[pa.RecordBatch, np.ndarray]:
    """Map output ``map_index``: ``rows`` rows of two longs, row ``i`` for subpartition
    ``i % reducers`` (so every block holds the same number of rows)."""
    keys = np.arange(map_index * rows, (map_index + 1) * rows, dtype=np.int64)
    return pa.record_batch({"k": keys, "v": keys * 2}), (keys % reducers).astype(np.int32)


class Service:
    """A service's environment in this process (the scenario's producer) writes every map
    output and reads every reducer: on a local store (the default service), or pushing to and
    fetching from worker daemons (the external one)."""

    def __init__(self, scenario: ShuffleScenario, daemon_pids: tuple[int, ...] = ()) -> None:
        self.scenario = scenario
        self.daemon_pids = daemon_pids
        """The worker daemons it reads from (none for the default service)."""

    def write(self, maps: int, rows: int, reducers: int) -> tuple[str, list[ShuffleDescriptor]]:
        scenario = dataclasses.replace(self.scenario, result_id=f"result-{new_id()}")
        descriptors = []
        for map_index in range(maps):
            batch, indexes = map_output(map_index, rows, reducers)
            partition = scenario.partition_descriptor(
                map_index, partitions=maps, subpartitions=reducers
            )
            descriptor, writer = scenario.new_writer(partition)
            descriptors.append(descriptor)
            writer.write(batch, indexes)
            writer.finish()
        return scenario.result_id, descriptors

    def read(self, result_id: str, descriptors: list[ShuffleDescriptor], reducers: int) -> int:
        rows = 0
        for reducer in range(reducers):
            gate_descriptor = InputGateDeploymentDescriptor(
                result_id,
                ResultPartitionType.BLOCKING,
                SubpartitionRange(reducer, reducer),
                tuple(descriptors),
            )
            [gate] = self.scenario.producer.create_input_gates(
                ShuffleIOOwner(f"reduce-{reducer}", new_id()), [gate_descriptor]
            )
            with gate:
                rows += sum(batch.num_rows for batch in gate)
        return rows

    def merge(
        self, store: Store, descriptors: list[ShuffleDescriptor], merged: int
    ) -> list[ResultPartitionID]:
        """The map outputs merged into ``merged`` partitions (consecutive map outputs each)."""
        result_id = f"merged-{new_id()}"
        outputs = [descriptor.result_partition_id for descriptor in descriptors]
        groups = np.array_split(np.arange(len(outputs)), merged)
        made = []
        for index, group in enumerate(groups):
            partition = ResultPartitionID(IntermediateResultPartitionID(result_id, index), new_id())
            sources = [(store, outputs[position]) for position in group.tolist()]
            made.append(merge_partitions(sources, store, partition).partition)
        return made

    @staticmethod
    def read_merged(store: Store, merged: list[ResultPartitionID], reducers: int) -> int:
        """Each reducer's run of every merged partition, through the format's reader."""
        rows = 0
        for reducer in range(reducers):
            wanted = SubpartitionRange.single(reducer)
            for partition in merged:
                reader = PartitionFileReader(store, partition, Layouts.MAPPED)
                rows += sum(batch.num_rows for batch in reader.read(wanted))
        return rows

    def release(self, descriptors: list[ShuffleDescriptor]) -> None:
        for descriptor in descriptors:
            self.scenario.master.release_partition_externally(descriptor)
        self.scenario.producer.release_partitions_locally(
            [descriptor.result_partition_id for descriptor in descriptors]
        )


class Minimal:
    """A hand-written shuffle of the same blocks: a file per map output, a batch per block."""

    def __init__(self, directory: Path) -> None:
        self._directory = directory
        self._ranges: list[list[tuple[int, int]]] = []
        self._schema: pa.Schema | None = None

    def write(self, maps: int, rows: int, reducers: int) -> None:
        self._ranges = []
        for map_index in range(maps):
            batch, indexes = map_output(map_index, rows, reducers)
            self._schema = batch.schema
            order = np.argsort(indexes, kind="stable")
            ordered = batch.take(pa.array(order.astype(np.int32)))
            bounds = np.zeros(reducers + 1, dtype=np.int64)
            np.cumsum(np.bincount(indexes, minlength=reducers), out=bounds[1:])
            sink = pa.OSFile(str(self._directory / f"map-{map_index}.arrow"), "wb")
            ranges = []
            with pa.ipc.new_file(sink, batch.schema) as writer:
                writer.write_batch(batch.slice(0, 0))  # the schema goes out with the first
                for start, end in zip(bounds[:-1].tolist(), bounds[1:].tolist(), strict=True):
                    before = sink.tell()
                    writer.write_batch(ordered.slice(start, end - start))
                    ranges.append((before, sink.tell() - before))
            self._ranges.append(ranges)

    def read(self, maps: int, reducers: int) -> int:
        files = [
            pa.memory_map(str(self._directory / f"map-{map_index}.arrow"))
            for map_index in range(maps)
        ]
        mapped = [file.read_buffer(file.size()) for file in files]
        schema = self._schema
        assert schema is not None
        rows = 0
        for reducer in range(reducers):
            for whole, ranges in zip(mapped, self._ranges, strict=True):
                offset, length = ranges[reducer]
                rows += pa.ipc.read_record_batch(whole.slice(offset, length), schema).num_rows
        return rows


def cpu_seconds(pids: tuple[int, ...]) -> float:
    """User and system CPU time of processes ``pids`` so far (``/proc/<pid>/stat``)."""
    total = 0
    for pid in pids:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15)
    return total / os.sysconf("SC_CLK_TCK")


def best_of(repeat: int, run: Callable[[], Any]) -> tuple[float, Any]:
    """The fastest of ``repeat`` runs, and what the last one returned."""
    best, returned = float("inf"), None
    for _ in range(repeat):
        started = time.perf_counter()
        returned = run()
        best = min(best, time.perf_counter() - started)
    return best, returned


@contextlib.contextmanager
def service_on(directory: Path, service: str) -> Iterator[Service]:
    with contextlib.ExitStack() as stack:
        daemons: tuple[int, ...] = ()
        if service == "netty_like":
            options: dict[str, object] = {"netty-like.storage.url": str(directory)}
        else:
            # Every read over the worker's data port, as on hosts that do not share its disk.
            cluster = stack.enter_context(LocalCluster(directory, workers=1, store_shared=False))
            options = cluster.client_config()
            daemons = (cluster.worker_pid(0),)
        configuration = Configuration.load(options, environ={})
        scenario = stack.enter_context(ShuffleScenario.open(ConformanceHarness(configuration)))
        yield Service(scenario, daemons)


def merged_times(
    service: Service,
    store: Store,
    descriptors: list[ShuffleDescriptor],
    args: argparse.Namespace,
    rows: int,
) -> dict[str, float]:
    """The best times of merging the map outputs and of reading every reducer merged."""
    merged: list[list[ResultPartitionID]] = []
    times: dict[str, float] = {}
    times["merged_write_s"], _ = best_of(
        args.repeat,
        lambda: merged.append(service.merge(store, descriptors, args.merged_partitions)),
    )
    times["merged_read_s"], read = best_of(
        args.repeat, lambda: service.read_merged(store, merged[-1], args.reducers)
    )
    if read != rows:
        sys.exit(f"the merged partitions read {read} rows of {rows}")
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--maps", type=positive, default=200)
    parser.add_argument("--reducers", type=positive, default=1000)
    parser.add_argument("--rows-per-block", type=positive, default=5)
    parser.add_argument("--repeat", type=positive, default=3)
    parser.add_argument("--service", choices=SERVICES, default=SERVICES[0])
    parser.add_argument(
        "--merged-partitions",
        type=positive,
        default=1,
        help="the default service's map outputs merged into this many partitions (hosts)",
    )
    parser.add_argument("--output", type=Path, default=DEFAULT_OUTPUT)
    args = parser.parse_args()
    maps, reducers = args.maps, args.reducers
    rows = args.rows_per_block * reducers
    blocks = maps * reducers
    figures: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="small-blocks-") as directory:
        root = Path(directory)
        (root / "minimal").mkdir()
        minimal = Minimal(root / "minimal")
        figures["minimal_write_s"], _ = best_of(
            args.repeat, lambda: minimal.write(maps, rows, reducers)
        )
        figures["minimal_read_s"], read = best_of(args.repeat, lambda: minimal.read(maps, reducers))
        if read != maps * rows:
            sys.exit(f"the minimal shuffle read {read} rows of {maps * rows}")
        with service_on(root / "service", args.service) as service:
            written: list[tuple[str, list[ShuffleDescriptor]]] = []
            figures["service_write_s"], _ = best_of(
                args.repeat, lambda: written.append(service.write(maps, rows, reducers))
            )
            result_id, descriptors = written[-1]
            for _, earlier in written[:-1]:
                service.release(earlier)
            daemon_cpu, own_cpu = cpu_seconds(service.daemon_pids), time.process_time()
            figures["service_read_s"], read = best_of(
                args.repeat, lambda: service.read(result_id, descriptors, reducers)
            )
            # CPU a block read, over every repetition: this process's and the worker's.
            figures["read_cpu_us"] = 1e6 * (time.process_time() - own_cpu) / (args.repeat * blocks)
            if service.daemon_pids:
                figures["worker_read_cpu_us"] = (
                    1e6 * (cpu_seconds(service.daemon_pids) - daemon_cpu) / (args.repeat * blocks)
                )
            if read != maps * rows:
                sys.exit(f"the service read {read} rows of {maps * rows}")
            if args.service == "netty_like":
                figures.update(
                    merged_times(
                        service, Store(str(root / "service")), descriptors, args, maps * rows
                    )
                )
    sides = (
        ("service", "minimal", "merged") if "merged_read_s" in figures else ("service", "minimal")
    )
    per_block = {
        f"{side}_{phase}_us": 1e6 * figures[f"{side}_{phase}_s"] / blocks
        for side in sides
        for phase in ("write", "read")
    }
    ratios = {
        f"{phase}_vs_minimal": per_block[f"service_{phase}_us"] / per_block[f"minimal_{phase}_us"]
        for phase in ("write", "read")
    }
    print(f"{maps} map outputs x {reducers} reducers, {args.rows_per_block} rows a block")
    print(f"{'':10}{'service':>12}{'minimal':>12}{'service/minimal':>18}")
    for phase in ("write", "read"):
        print(
            f"{phase:10}{per_block[f'service_{phase}_us']:>9.1f} us"
            f"{per_block[f'minimal_{phase}_us']:>9.1f} us{ratios[f'{phase}_vs_minimal']:>17.2f}x"
        )
    if "merged_read_us" in per_block:
        print(
            f"merged into {args.merged_partitions}: the merge {per_block['merged_write_us']:.2f} us"
            f" a block, the merged reads {per_block['merged_read_us']:.2f} us a block"
        )
    worker = figures.get("worker_read_cpu_us")
    print(
        f"CPU a block read: {figures['read_cpu_us']:.1f} us here"
        + ("" if worker is None else f", {worker:.1f} us in the worker")
    )
    save_results(
        args.output,
        {
            "benchmark": "small_blocks",
            "machine": machine(pyarrow=pa.__version__),
            "parameters": {
                "maps": maps,
                "reducers": reducers,
                "rows_per_block": args.rows_per_block,
                "repeat": args.repeat,
                "service": args.service,
                "merged_partitions": args.merged_partitions,
            },
            **figures,
            "per_block": per_block,
            **ratios,
        },
    )


if __name__ == "__main__":
    main()
