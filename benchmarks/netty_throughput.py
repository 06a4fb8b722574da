"""Throughput of the default ``netty_like`` shuffle service vs a minimal hand-written pyarrow
shuffle and raw Arrow IPC: same data, same run.

What it compares, once per codec (``auto``, ``none``, ``lz4``, ``zstd`` by default; the
references use the codec the service stored with, so with ``auto`` the one it chose):

* **minimal**: the shuffle a user would write with pyarrow alone, no framework: per producer,
  every batch's rows gathered by subpartition (stable numpy argsort, ``take``), held in memory,
  then one IPC file of one batch per subpartition, in order; each consumer reads the batches of its
  subpartition range from every producer's file (memory-mapped when local). No checksums, no
  memory budget, no index or commit. The goal: the service's total at least this one's
  (``ratio_vs_minimal`` >= 1.0: the framework costs nothing over writing it by hand).
* **raw**: every batch written with ``pa.ipc.new_file`` to one file in the store directory, then
  read back in full (memory-mapped when the store is local): no gather at all.
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
``benchmarks/results/netty_throughput.json``).
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
from common import (
    BATCH_ROWS,
    CODECS,
    DISTINCT_KEYS,
    MB,
    Indexes,
    codec_list,
    format_rows,
    machine,
    mb_per_s,
    positive,
    random_batches,
    save_results,
    settle,
    subpartition_indexes,
)
from fsspec.implementations.local import LocalFileSystem

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
from shuffle_runtime.batches import reorder_by_subpartition
from shuffle_runtime.format import PartitionFileReader, ipc_write_options
from shuffle_runtime.store import Store

SEED = 20240531
GOAL_RATIO_VS_MINIMAL = 1.0
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

    def open_output(self, path: str) -> pa.NativeFile:
        return pa.OSFile(path, "wb") if self.local else pa.PythonFile(self._fs.open(path, "wb"))

    def open_input(self, path: str) -> pa.NativeFile | pa.Buffer:
        """Memory-mapped when the store is local (zero-copy), else read whole."""
        return pa.memory_map(path) if self.local else pa.py_buffer(self._fs.cat_file(path))

    def write(self, path: str, data: Dataset, codec: str) -> float:
        """Seconds to write every batch as one IPC file."""
        options = ipc_write_options(codec)
        started = time.perf_counter()
        with (
            self.open_output(path) as sink,
            pa.ipc.new_file(sink, data.batches[0].schema, options=options) as writer,
        ):
            for batch in data.batches:
                writer.write_batch(batch)
        return time.perf_counter() - started

    def read(self, path: str, consumed: Consumed) -> float:
        """Seconds to read the file back batch by batch."""
        started = time.perf_counter()
        reader = pa.ipc.open_file(self.open_input(path))
        consumed.take(reader.get_batch(i) for i in range(reader.num_record_batches))
        return time.perf_counter() - started

    def size(self, path: str) -> int:
        return int(self._fs.size(path))

    def remove(self, path: str) -> None:
        self._fs.rm(path)


# --- a minimal hand-written shuffle -----------------------------------------------------------


@dataclass(frozen=True, slots=True)
class MinimalFile:
    """One producer's file, and the first batch of each subpartition in it (and the end)."""

    path: str
    starts: list[int]


class MinimalShuffle:
    """What a user would write by hand with pyarrow alone: each producer gathers every batch's
    rows by subpartition (a stable numpy argsort and ``take``), holds the pieces until its input
    ends, then writes one IPC file of subpartition 0's pieces as one batch, 1's, ... (a batch
    per piece would be compressed and read piece by piece, far slower); a consumer reads the
    batches of its subpartition range from every producer's file. No framework: no checksums,
    no memory budget or spill, no index file, no commit protocol."""

    def __init__(self, raw: RawFiles) -> None:
        self._raw = raw

    def write(
        self, data: Dataset, producers: int, subpartitions: int, codec: str
    ) -> tuple[float, list[MinimalFile]]:
        options = ipc_write_options(codec)
        files: list[MinimalFile] = []
        started = time.perf_counter()
        for producer, part in enumerate(split_among(len(data.batches), producers)):
            pieces: list[list[pa.RecordBatch]] = [[] for _ in range(subpartitions)]
            for position in part:
                indexes = data.indexes[position]
                ordered = data.batches[position].take(np.argsort(indexes, kind="stable"))
                offset = 0
                for subpartition, count in enumerate(
                    np.bincount(indexes, minlength=subpartitions).tolist()
                ):
                    if count:
                        pieces[subpartition].append(ordered.slice(offset, count))
                        offset += count
            path = self._raw.path(f"minimal-{producer}-{new_id()}.arrow")
            starts = [0]
            with (
                self._raw.open_output(path) as sink,
                pa.ipc.new_file(sink, data.batches[0].schema, options=options) as writer,
            ):
                for subpartition_pieces in pieces:
                    if subpartition_pieces:
                        writer.write_batch(pa.concat_batches(subpartition_pieces))
                    starts.append(starts[-1] + bool(subpartition_pieces))
            files.append(MinimalFile(path, starts))
        return time.perf_counter() - started, files

    def read(
        self, files: Sequence[MinimalFile], subpartitions: int, consumers: int, consumed: Consumed
    ) -> float:
        started = time.perf_counter()
        for part in split_among(subpartitions, consumers):
            for file in files:
                reader = pa.ipc.open_file(self._raw.open_input(file.path))
                first, end = file.starts[part.start], file.starts[part.stop]
                consumed.take(reader.get_batch(i) for i in range(first, end))
        return time.perf_counter() - started

    def remove(self, files: Sequence[MinimalFile]) -> None:
        for file in files:
            self._raw.remove(file.path)


# --- the service -----------------------------------------------------------------------------


@dataclass
class Service:
    """A master and two environments of one configuration (one codec)."""

    master: ShuffleMaster
    producer_env: ShuffleEnvironment
    remote_env: ShuffleEnvironment
    job: RecordingJobContext
    store: Store
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
        return cls(master, producer_env, remote_env, job, Store(store_url))

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

    def stored_codecs(self, descriptors: Sequence[ShuffleDescriptor]) -> list[str]:
        """The codecs the partitions were stored with, as their manifests say."""
        return sorted(
            {
                PartitionFileReader(self.store, descriptor.result_partition_id).manifest.codec
                for descriptor in descriptors
            }
        )

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
    "minimal_write",
    "minimal_read",
    "minimal_total",
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
    stored_codecs: list[str] = field(default_factory=list)
    batches_read: dict[str, int] = field(default_factory=dict)

    def median(self, phase: str) -> float:
        return float(statistics.median(self.seconds[phase]))


def measure_codec(args: Namespace, data: Dataset, store_url: str, codec: str) -> CodecRun:
    """Every repetition: the service first (with ``auto`` it tells which codec it chose), then
    raw IPC and the minimal shuffle with that same codec."""
    run = CodecRun(codec)
    raw = RawFiles(store_url)
    minimal = MinimalShuffle(raw)
    service = Service.start(store_url, codec)
    try:
        # Untimed: the first write and read of a fresh service start its threads and pools.
        warm_up = Dataset(data.batches[:2], data.indexes[:2], 0, 0, 0.0)
        _, descriptors, _ = service.write(warm_up, 1, args.subpartitions)
        service.read(service.producer_env, descriptors, args.subpartitions, 1, Consumed())
        service.release(descriptors)
        for repetition in range(args.repeat):
            settle()
            write, descriptors, stored = service.write(data, args.producers, args.subpartitions)
            run.service_stored_bytes = stored
            run.stored_codecs = service.stored_codecs(descriptors)
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
            # What the service stored with; a mix of codecs (auto on uneven data) counts as lz4.
            chosen = run.stored_codecs[0] if len(run.stored_codecs) == 1 else "lz4"

            path = raw.path(f"raw-{codec}-{new_id()}.arrow")
            settle()
            raw_write = raw.write(path, data, chosen)
            run.raw_file_bytes = raw.size(path)
            consumed = Consumed()
            raw_read = raw.read(path, consumed)
            run.batches_read["raw"] = consumed.check(data, f"raw read ({chosen})")
            raw.remove(path)
            gather = gather_alone(data, args.subpartitions)

            settle()
            minimal_write, files = minimal.write(data, args.producers, args.subpartitions, chosen)
            consumed = Consumed()
            minimal_read = minimal.read(files, args.subpartitions, args.consumers, consumed)
            run.batches_read["minimal"] = consumed.check(data, f"minimal read ({chosen})")
            minimal.remove(files)

            for phase, seconds in (
                ("raw_write", raw_write),
                ("raw_read", raw_read),
                ("raw_total", raw_write + raw_read),
                ("gather", gather),
                ("minimal_write", minimal_write),
                ("minimal_read", minimal_read),
                ("minimal_total", minimal_write + minimal_read),
                ("service_write", write),
                ("service_read_local", local),
                ("service_read_remote", remote),
                ("service_total", write + local),
            ):
                run.seconds[phase].append(seconds)
            print(
                f"  {codec} #{repetition + 1}: service {write:.2f}+{local:.2f} s (remote read"
                f" {remote:.2f} s, stored as {chosen}), raw {raw_write:.2f}+{raw_read:.2f} s,"
                f" minimal {minimal_write:.2f}+{minimal_read:.2f} s",
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


def summarize(run: CodecRun, data: Dataset) -> dict[str, Any]:
    phases = {
        phase: {
            "seconds": run.seconds[phase],
            "median_seconds": run.median(phase),
            "mb_per_s": mb_per_s(data.nbytes, run.median(phase)),
        }
        for phase in PHASES
    }

    def ratio(service: str, raw: str) -> float:
        return run.median(raw) / run.median(service)

    raw_total = run.median("raw_total")
    one_core_ceiling = raw_total / (raw_total + run.median("gather"))
    vs_minimal = ratio("service_total", "minimal_total")
    return {
        "codec": run.codec,
        "stored_codecs": run.stored_codecs,
        "phases": phases,
        # The goal: the service's total over the minimal hand-written shuffle's.
        "ratio_vs_minimal": vs_minimal,
        "goal_met": vs_minimal >= GOAL_RATIO_VS_MINIMAL,
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
    shown = (
        ("raw write", "raw_write"),
        ("raw read", "raw_read"),
        ("raw total", "raw_total"),
        ("gather alone", "gather"),
        ("minimal total (w + r)", "minimal_total"),
        ("service write", "service_write"),
        ("service read (local)", "service_read_local"),
        ("service read (remote)", "service_read_remote"),
        ("service total (w + local r)", "service_total"),
    )
    headers = ("codec (stored as)", *(title for title, _ in shown), "vs raw", "vs minimal")
    rows: list[tuple[str, ...]] = []
    for summary in summaries:
        phases = summary["phases"]
        cells = [f"{summary['codec']} ({'/'.join(summary['stored_codecs'])})"]
        for _, phase in shown:
            cells.append(
                f"{phases[phase]['mb_per_s']:.0f} MB/s ({phases[phase]['median_seconds']:.3f} s)"
            )
        cells.append(f"{summary['ratios']['total']:.0%}")
        cells.append(f"{summary['ratio_vs_minimal']:.2f}")
        rows.append(tuple(cells))
    return format_rows(headers, rows)


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
        "--codecs",
        type=codec_list,
        default=list(CODECS),
        help="e.g. none,lz4,zstd,auto",
    )
    parser.add_argument(
        "--profile-write",
        metavar="CODEC",
        choices=CODECS,
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
        verdict = "meets" if summary["goal_met"] else "misses"
        print(
            f"{summary['codec']}: service total over the minimal hand-written shuffle's"
            f" {summary['ratio_vs_minimal']:.2f} ({verdict} the goal, >="
            f" {GOAL_RATIO_VS_MINIMAL:.1f}); over raw IPC's {ratios['total']:.0%}: write"
            f" {ratios['write']:.0%}, read local"
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
        "goal_ratio_vs_minimal": GOAL_RATIO_VS_MINIMAL,
        "results": summaries,
    }
    save_results(args.output, document)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
