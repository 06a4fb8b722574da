"""Throughput of the default ``netty_like`` shuffle service vs raw Arrow IPC: same data, same run.

What it compares, once per codec (``none``, ``lz4``, ``zstd`` by default):

* **raw**: every batch written with ``pa.ipc.new_file`` to one file in the store directory, then
  read back in full (memory-mapped when the store is local).
* **service**: the data split among ``--producers`` producer partitions, each written by its own
  ``ResultPartitionWriter`` (``writer.write(batch, indexes)``: the split by subpartition, the IPC
  encoding, checksums and the commit are timed), then read by ``--consumers`` input gates, each
  covering a contiguous subpartition range of every producer's partition:

  - **read (local)**: gates of the producing environment (straight from the store);
  - **read (remote)**: gates of a second environment in this process, so every byte goes through
    the producer's data port over 127.0.0.1 TCP (server and client share one interpreter).

* **gather alone** (a reference, not a side of the comparison): every batch's rows brought
  together by subpartition in memory, as the service's writer does it, with no I/O. Any shuffle
  does this work and a raw file write does not, so the printed *ceiling* bounds the total
  ratio any service can reach on this machine and data: raw total over raw total plus the
  gather on one core, twice that with all of the work spread perfectly over two cores (above
  100 %: parallel work could beat the single-threaded raw baseline).

The subpartition index of every row (a cheap hash of ``key`` modulo ``--subpartitions``) is the
engine's work, so it is computed before any timing. Data generation is not timed either.

Throughput is uncompressed data bytes (the sum of ``RecordBatch.nbytes``) per second, in
MB/s (10**6 bytes). Every figure is the median of ``--repeat`` repetitions; "total" is write +
(local) read of one repetition. Both sides consume what they read identically: the timed read
iterates every batch and counts rows; afterwards the row count and the sum of ``value`` are
checked, and a wrong one fails the run. Note that a raw read of an uncompressed file from a local
store is zero-copy (memory-mapped, only IPC metadata is parsed), so its figure is close to free;
the service's local read is zero-copy too but verifies a checksum over every stored byte.

Run from the repository root::

    python benchmarks/netty_throughput.py                      # 10M rows, 3 repetitions
    python benchmarks/netty_throughput.py --rows 1000000 --repeat 1
    python benchmarks/netty_throughput.py --store memory://bench --codecs lz4
    python benchmarks/netty_throughput.py --rows 1000000 --profile-write lz4   # cProfile one write

Results are printed and saved as JSON (``--output``, default
``benchmarks/results/netty_throughput.json``). The goal stated by the issue is that the service
total reaches at least 80 % of the raw total.
"""

from __future__ import annotations

import argparse
import cProfile
import datetime as dt
import io
import pstats
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import fsspec
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from arrow_data import BATCH_ROWS, DISTINCT_KEYS, MB, Indexes, random_batches, subpartition_indexes
from fsspec.implementations.local import LocalFileSystem
from results_file import machine, save_results

from shuffle_api import (
    Configuration,
    InputGateDeploymentDescriptor,
    IntermediateResultPartitionID,
    PartitionDescriptor,
    RecordingJobContext,
    ResultPartitionDeploymentDescriptor,
    ResultPartitionType,
    ShuffleDescriptor,
    ShuffleEnvironment,
    ShuffleEnvironmentContext,
    ShuffleIOOwner,
    ShuffleMaster,
    ShuffleMasterContext,
    SubpartitionRange,
    load_shuffle_service_factory,
    new_id,
)
from shuffle_api.batches import reorder_by_subpartition

SEED = 20240531
GOAL_RATIO = 0.80
DEFAULT_OUTPUT = Path(__file__).resolve().parent / "results" / "netty_throughput.json"


# --- data ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Dataset:
    """The batches, the subpartition index of every row, and what a reader must get back."""

    batches: list[pa.RecordBatch]
    indexes: list[Indexes]
    rows: int
    nbytes: int
    value_sum: float


def generate(rows: int, subpartitions: int, seed: int = SEED) -> Dataset:
    """Deterministic batches of about :data:`BATCH_ROWS` rows: ``key`` (int64, 100k distinct
    values), ``value`` (float64), ``text`` (ASCII strings of 16-24 bytes, 20 on average)."""
    batches = random_batches(rows, seed)
    indexes = [subpartition_indexes(batch.column(0).to_numpy(), subpartitions) for batch in batches]
    value_sum = sum(float(batch.column(1).to_numpy().sum()) for batch in batches)
    return Dataset(
        batches=batches,
        indexes=indexes,
        rows=sum(int(batch.num_rows) for batch in batches),
        nbytes=sum(int(batch.nbytes) for batch in batches),
        value_sum=value_sum,
    )


def split_among(count: int, parts: int) -> list[range]:
    """``parts`` contiguous, nearly equal ranges of ``range(count)``."""
    bounds = [count * part // parts for part in range(parts + 1)]
    return [range(bounds[part], bounds[part + 1]) for part in range(parts)]


@dataclass(slots=True)
class Consumed:
    """What a reader got. Only iterating and counting rows is timed; the batches are kept so
    that :meth:`check` can verify the sum of ``value`` after the clock stops."""

    rows: int = 0
    batches: list[pa.RecordBatch] = field(default_factory=list)

    def take(self, batches: Iterable[pa.RecordBatch]) -> None:
        for batch in batches:
            self.rows += int(batch.num_rows)
            self.batches.append(batch)

    def check(self, data: Dataset, what: str) -> int:
        """Fail loudly unless every row came back with the right values; return the number of
        batches read (and drop them)."""
        if self.rows != data.rows:
            raise AssertionError(f"{what}: read {self.rows} rows, wrote {data.rows}")
        value_sum = 0.0
        for batch in self.batches:
            total = pc.sum(batch.column(1)).as_py()
            value_sum += 0.0 if total is None else float(total)
        error = abs(value_sum - data.value_sum) / max(abs(data.value_sum), 1e-300)
        if error > 1e-6:
            raise AssertionError(
                f"{what}: sum of value is {value_sum!r}, expected {data.value_sum!r}"
                f" (relative error {error:.3g})"
            )
        count = len(self.batches)
        self.batches.clear()
        return count


# --- raw Arrow IPC baseline ------------------------------------------------------------------


class RawFiles:
    """Arrow IPC files next to the service's partitions, on the same store."""

    def __init__(self, store_url: str) -> None:
        fs, root = fsspec.core.url_to_fs(store_url)
        self._fs: Any = fs
        self._root = str(root).rstrip("/") or "/"
        self.local = isinstance(fs, LocalFileSystem)
        self._fs.makedirs(self._root, exist_ok=True)

    def path(self, name: str) -> str:
        return f"{self._root.rstrip('/')}/{name}"

    def write(self, path: str, data: Dataset, codec: str) -> float:
        """Seconds to write every batch as one IPC file."""
        options = pa.ipc.IpcWriteOptions(compression=None if codec == "none" else codec)
        started = time.perf_counter()
        sink = pa.OSFile(path, "wb") if self.local else pa.PythonFile(self._fs.open(path, "wb"))
        with sink, pa.ipc.new_file(sink, data.batches[0].schema, options=options) as writer:
            for batch in data.batches:
                writer.write_batch(batch)
        return time.perf_counter() - started

    def read(self, path: str, consumed: Consumed) -> float:
        """Seconds to read the file back batch by batch."""
        started = time.perf_counter()
        source = pa.memory_map(path) if self.local else pa.py_buffer(self._fs.cat_file(path))
        reader = pa.ipc.open_file(source)
        consumed.take(reader.get_batch(i) for i in range(reader.num_record_batches))
        return time.perf_counter() - started

    def size(self, path: str) -> int:
        return int(self._fs.size(path))

    def remove(self, path: str) -> None:
        self._fs.rm(path)


# --- the service -----------------------------------------------------------------------------


@dataclass
class Service:
    """A master and two environments of one configuration (one codec)."""

    master: ShuffleMaster
    producer_env: ShuffleEnvironment
    remote_env: ShuffleEnvironment
    job: RecordingJobContext
    closers: list[Callable[[], None]] = field(default_factory=list)

    @classmethod
    def start(cls, store_url: str, codec: str) -> Service:
        config = Configuration.load(
            {"netty-like.storage.url": store_url, "shuffle.compression.codec": codec}, environ={}
        )
        factory = load_shuffle_service_factory(config)
        master_context = ShuffleMasterContext(config)
        master = factory.create_shuffle_master(master_context)
        master.start()
        job = RecordingJobContext(f"bench-{new_id()}")
        master.register_job(job)
        producer_env = factory.create_shuffle_environment(
            ShuffleEnvironmentContext(
                config, resource_id=f"producer-{new_id()}", secret=master_context.secret
            )
        )
        producer_env.start()
        # It sees the producer's store too; made to read through the data port all the same.
        remote_env = factory.create_shuffle_environment(
            ShuffleEnvironmentContext(
                config.with_values({"netty-like.read-from-shared-store": False}),
                resource_id=f"consumer-{new_id()}",
                secret=master_context.secret,
            )
        )
        remote_env.start()
        return cls(master, producer_env, remote_env, job)

    def close(self) -> None:
        self.remote_env.close()
        self.producer_env.close()
        self.master.close()
        if self.job.lost:
            raise AssertionError(f"the service reported lost partitions: {self.job.lost}")

    def write(
        self, data: Dataset, producers: int, subpartitions: int
    ) -> tuple[float, list[ShuffleDescriptor], int]:
        """Write a fresh result: seconds (writer creation, writes and commits of every producer),
        the partitions' shuffle descriptors and the bytes they store."""
        result_id = f"result-{new_id()}"
        descriptors: list[ShuffleDescriptor] = []
        stored = 0
        seconds = 0.0
        for producer, part in enumerate(split_among(len(data.batches), producers)):
            attempt = new_id()
            partition = PartitionDescriptor(
                result_id,
                producers,
                IntermediateResultPartitionID(result_id, producer),
                ResultPartitionType.BLOCKING,
                subpartitions,
            )
            descriptor = self.master.register_partition_with_producer(
                self.job.job_id, partition, self.producer_env.producer_descriptor(attempt)
            ).result()
            descriptors.append(descriptor)
            started = time.perf_counter()
            [writer] = self.producer_env.create_result_partition_writers(
                ShuffleIOOwner(f"map-{producer}", attempt),
                [ResultPartitionDeploymentDescriptor(partition, descriptor)],
            )
            for position in part:
                writer.write(data.batches[position], data.indexes[position])
            statistics = writer.finish()
            seconds += time.perf_counter() - started
            stored += statistics.total_bytes
        return seconds, descriptors, stored

    def read(
        self,
        env: ShuffleEnvironment,
        descriptors: Sequence[ShuffleDescriptor],
        subpartitions: int,
        consumers: int,
        consumed: Consumed,
    ) -> float:
        """Seconds for ``consumers`` gates of ``env``, one after the other, to read everything."""
        result_id = descriptors[0].result_partition_id.partition_id.result_id
        started = time.perf_counter()
        for consumer, part in enumerate(split_among(subpartitions, consumers)):
            gate_descriptor = InputGateDeploymentDescriptor(
                result_id,
                ResultPartitionType.BLOCKING,
                SubpartitionRange(part.start, part.stop - 1),
                tuple(descriptors),
            )
            [gate] = env.create_input_gates(
                ShuffleIOOwner(f"reduce-{consumer}", new_id()), [gate_descriptor]
            )
            with gate:
                consumed.take(gate)
        return time.perf_counter() - started

    def release(self, descriptors: Sequence[ShuffleDescriptor]) -> None:
        for descriptor in descriptors:
            self.master.release_partition_externally(descriptor)
        self.producer_env.release_partitions_locally(
            [descriptor.result_partition_id for descriptor in descriptors]
        )


# --- measurement -----------------------------------------------------------------------------

PHASES = (
    "raw_write",
    "raw_read",
    "raw_total",
    "gather",
    "service_write",
    "service_read_local",
    "service_read_remote",
    "service_total",
)


@dataclass(slots=True)
class CodecRun:
    """Seconds of every repetition, by phase, and sizes."""

    codec: str
    seconds: dict[str, list[float]] = field(default_factory=lambda: {p: [] for p in PHASES})
    raw_file_bytes: int = 0
    service_stored_bytes: int = 0
    batches_read: dict[str, int] = field(default_factory=dict)

    def median(self, phase: str) -> float:
        return float(statistics.median(self.seconds[phase]))


def measure_codec(args: Namespace, data: Dataset, store_url: str, codec: str) -> CodecRun:
    run = CodecRun(codec)
    raw = RawFiles(store_url)
    service = Service.start(store_url, codec)
    try:
        for repetition in range(args.repeat):
            path = raw.path(f"raw-{codec}-{new_id()}.arrow")
            raw_write = raw.write(path, data, codec)
            run.raw_file_bytes = raw.size(path)
            consumed = Consumed()
            raw_read = raw.read(path, consumed)
            run.batches_read["raw"] = consumed.check(data, f"raw read ({codec})")
            raw.remove(path)
            gather = gather_alone(data, args.subpartitions)

            write, descriptors, stored = service.write(data, args.producers, args.subpartitions)
            run.service_stored_bytes = stored
            consumed = Consumed()
            local = service.read(
                service.producer_env, descriptors, args.subpartitions, args.consumers, consumed
            )
            run.batches_read["service_local"] = consumed.check(
                data, f"service read, local ({codec})"
            )
            consumed = Consumed()
            remote = service.read(
                service.remote_env, descriptors, args.subpartitions, args.consumers, consumed
            )
            run.batches_read["service_remote"] = consumed.check(
                data, f"service read, remote ({codec})"
            )
            service.release(descriptors)

            for phase, seconds in (
                ("raw_write", raw_write),
                ("raw_read", raw_read),
                ("raw_total", raw_write + raw_read),
                ("gather", gather),
                ("service_write", write),
                ("service_read_local", local),
                ("service_read_remote", remote),
                ("service_total", write + local),
            ):
                run.seconds[phase].append(seconds)
            print(
                f"  {codec} #{repetition + 1}: raw {raw_write:.2f}+{raw_read:.2f} s,"
                f" service {write:.2f}+{local:.2f} s (remote read {remote:.2f} s)",
                file=sys.stderr,
                flush=True,
            )
    finally:
        service.close()
    return run


def gather_alone(data: Dataset, subpartitions: int) -> float:
    """Seconds to bring every batch's rows together by subpartition, in memory: the gather
    any shuffle does and a raw file write does not (the service's own, no I/O)."""
    started = time.perf_counter()
    for batch, indexes in zip(data.batches, data.indexes, strict=True):
        reorder_by_subpartition(batch, indexes, subpartitions)
    return time.perf_counter() - started


def throughput(nbytes: int, seconds: float) -> float:
    return nbytes / seconds / MB if seconds > 0 else float("inf")


def summarize(run: CodecRun, data: Dataset) -> dict[str, Any]:
    phases = {
        phase: {
            "seconds": run.seconds[phase],
            "median_seconds": run.median(phase),
            "mb_per_s": throughput(data.nbytes, run.median(phase)),
        }
        for phase in PHASES
    }

    def ratio(service: str, raw: str) -> float:
        return run.median(raw) / run.median(service)

    raw_total = run.median("raw_total")
    one_core_ceiling = raw_total / (raw_total + run.median("gather"))
    return {
        "codec": run.codec,
        "phases": phases,
        "ratios": {
            "total": ratio("service_total", "raw_total"),
            "write": ratio("service_write", "raw_write"),
            "read_local": ratio("service_read_local", "raw_read"),
            "read_remote": ratio("service_read_remote", "raw_read"),
        },
        # The best total ratio a service that gathers can reach: doing raw's work plus the
        # gather on one core, or both spread perfectly over two (raw itself uses one).
        "ceilings": {"one_core": one_core_ceiling, "two_cores": 2 * one_core_ceiling},
        "raw_file_bytes": run.raw_file_bytes,
        "service_stored_bytes": run.service_stored_bytes,
        "batches_read": run.batches_read,
    }


def render_table(summaries: Sequence[dict[str, Any]]) -> str:
    headers = (
        "codec",
        "raw write",
        "raw read",
        "raw total",
        "gather alone",
        "service write",
        "service read (local)",
        "service read (remote)",
        "service total (w + local r)",
        "ratio total",
    )
    rows: list[tuple[str, ...]] = []
    for summary in summaries:
        phases = summary["phases"]
        cells = [summary["codec"]]
        for phase in PHASES:
            cells.append(
                f"{phases[phase]['mb_per_s']:.0f} MB/s ({phases[phase]['median_seconds']:.3f} s)"
            )
        cells.append(f"{summary['ratios']['total']:.0%}")
        rows.append(tuple(cells))
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers)]
    lines = [
        " | ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)),
        "-|-".join("-" * w for w in widths),
        *(" | ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in rows),
    ]
    return "\n".join(line.rstrip() for line in lines)


# --- profiling -------------------------------------------------------------------------------


def profile_write(args: Namespace, data: Dataset, store_url: str, codec: str) -> str:
    """cProfile of one service write of all the data; the top functions by cumulative time.

    cProfile sees the calling thread only: the writer's background spill (coalescing, IPC
    encoding, compression, the store writes) shows up as time waiting for the spill."""
    service = Service.start(store_url, codec)
    profiler = cProfile.Profile()
    try:
        profiler.enable()
        seconds, descriptors, _ = service.write(data, args.producers, args.subpartitions)
        profiler.disable()
        service.release(descriptors)
    finally:
        service.close()
    text = io.StringIO()
    stats = pstats.Stats(profiler, stream=text)
    stats.sort_stats("cumulative").print_stats(30)
    stats.sort_stats("tottime").print_stats(20)
    return f"one service write ({codec}) took {seconds:.2f} s under cProfile\n{text.getvalue()}"


# --- entry point -----------------------------------------------------------------------------


class Namespace(argparse.Namespace):
    rows: int
    subpartitions: int
    producers: int
    consumers: int
    repeat: int
    store: str | None
    output: Path
    codecs: list[str]
    profile_write: str | None


def codec_list(text: str) -> list[str]:
    codecs = [codec.strip() for codec in text.split(",") if codec.strip()]
    unknown = [codec for codec in codecs if codec not in ("none", "lz4", "zstd")]
    if not codecs or unknown:
        raise argparse.ArgumentTypeError("codecs are a comma-separated subset of none,lz4,zstd")
    return codecs


def positive(text: str) -> int:
    value = int(text.replace("_", ""))
    if value < 1:
        raise argparse.ArgumentTypeError("must be >= 1")
    return value


def parse_args(argv: list[str] | None) -> Namespace:
    parser = argparse.ArgumentParser(
        description="netty_like shuffle service vs raw Arrow IPC: write + read throughput.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--rows", type=positive, default=10_000_000, help="rows shuffled")
    parser.add_argument("--subpartitions", type=positive, default=16, help="subpartitions")
    parser.add_argument(
        "--producers", type=positive, default=4, help="producer partitions (written one by one)"
    )
    parser.add_argument(
        "--consumers",
        type=positive,
        default=4,
        help="input gates, each reading a contiguous subpartition range of every partition",
    )
    parser.add_argument("--repeat", type=positive, default=3, help="repetitions (median reported)")
    parser.add_argument(
        "--store", default=None, help="fsspec URL of the store (default: a fresh temp directory)"
    )
    parser.add_argument("--output", type=Path, default=DEFAULT_OUTPUT, help="JSON results file")
    parser.add_argument(
        "--codecs", type=codec_list, default=["none", "lz4", "zstd"], help="e.g. none,lz4,zstd"
    )
    parser.add_argument(
        "--profile-write",
        metavar="CODEC",
        choices=("none", "lz4", "zstd"),
        default=None,
        help="instead of the benchmark, cProfile one service write of the data with this codec",
    )
    args = parser.parse_args(argv, namespace=Namespace())
    if args.consumers > args.subpartitions:
        parser.error("--consumers cannot exceed --subpartitions")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    temporary = None if args.store else tempfile.mkdtemp(prefix="pyshuffle-bench-")
    store_url = args.store or str(temporary)
    try:
        started = time.perf_counter()
        data = generate(args.rows, args.subpartitions)
        print(
            f"generated {data.rows:,} rows in {len(data.batches)} batches,"
            f" {data.nbytes / MB:.1f} MB uncompressed ({time.perf_counter() - started:.1f} s);"
            f" store {store_url}",
            file=sys.stderr,
        )
        if args.profile_write is not None:
            print(profile_write(args, data, store_url, args.profile_write))
            return 0
        summaries = [
            summarize(measure_codec(args, data, store_url, codec), data) for codec in args.codecs
        ]
    finally:
        if temporary is not None:
            shutil.rmtree(temporary, ignore_errors=True)

    print()
    print(
        f"{data.rows:,} rows, {data.nbytes / MB:.1f} MB uncompressed, {args.producers} producers,"
        f" {args.subpartitions} subpartitions, {args.consumers} consumers,"
        f" median of {args.repeat}; MB/s = 10^6 bytes of uncompressed data per second"
    )
    print(render_table(summaries))
    print()
    for summary in summaries:
        ratios = summary["ratios"]
        verdict = "meets" if ratios["total"] >= GOAL_RATIO else "misses"
        print(
            f"{summary['codec']}: service/raw throughput total {ratios['total']:.0%} ({verdict} the"
            f" {GOAL_RATIO:.0%} goal); write {ratios['write']:.0%}, read local"
            f" {ratios['read_local']:.0%}, read remote {ratios['read_remote']:.0%};"
            f" stored {summary['service_stored_bytes'] / MB:.1f} MB vs raw file"
            f" {summary['raw_file_bytes'] / MB:.1f} MB; batches read: raw"
            f" {summary['batches_read'].get('raw', 0):,}, service"
            f" {summary['batches_read'].get('service_local', 0):,}"
        )
        ceilings = summary["ceilings"]
        print(
            f"{summary['codec']}: ceiling of the total ratio for any service that gathers (raw"
            f" total + gather alone): {ceilings['one_core']:.0%} on one core,"
            f" {ceilings['two_cores']:.0%} with all of it spread over two"
        )

    document = {
        "benchmark": "netty_throughput",
        "timestamp": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "parameters": {
            "rows": args.rows,
            "subpartitions": args.subpartitions,
            "producers": args.producers,
            "consumers": args.consumers,
            "repeat": args.repeat,
            "store": args.store or "temporary directory",
            "codecs": args.codecs,
            "batch_rows": BATCH_ROWS,
            "distinct_keys": DISTINCT_KEYS,
            "seed": SEED,
        },
        "data": {"rows": data.rows, "batches": len(data.batches), "bytes": data.nbytes},
        "environment": machine(pyarrow=pa.__version__, numpy=np.__version__),
        "goal_ratio": GOAL_RATIO,
        "results": summaries,
    }
    save_results(args.output, document)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
