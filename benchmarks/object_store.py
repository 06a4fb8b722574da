"""The default service on an object store: requests per stage, counted at the server, beside
their bound, and throughput beside a plain copy of the same bytes; on ``local[2]`` against
moto's S3 server on 127.0.0.1 (a stand-in: no S3 is reachable here; ``tests/s3_stand_in.py``).

Requests: for each cell ``maps x reducers`` (``--cells``), ``max(--min-rows, --rows-per-block x
maps x reducers)`` rows of two longs, made by ``spark.range`` in ``maps`` partitions, go
through ``SparkShuffle.repartition(df, "k", num_partitions=reducers)`` into a ``mapInArrow``
that counts them, with ``netty-like.storage.url = s3://...``. The server counts every request
of the map stage and of the reduce stage (by kind: GET, PUT, HEAD, LIST, POST, DELETE); the
release that follows is not counted. The bound (issue 35: ``maps x reducers`` ranged GETs,
O(maps) metadata reads and PUTs, no LIST on the read path) is spelt out in :func:`bound`;
``requests_vs_bound`` is the count over it (goal <= 1.0), and ``reduce_stage_lists`` must be
0. The same stage on the local disk (the default store) is timed beside it.

With ``--uncoalesced``, each partition is a map task of its own (``pyspark-shuffle.map.target-size
= 0``), as a stage of big splits runs: many map outputs of small blocks, which the default
service merges per reducer before the reduce stage (docs/format.md). Each cell also saves
``gets``, ``objects_written`` (PUTs and multipart POSTs), ``merged_bound`` (reducers x executors
+ 3 x map tasks), ``gets_vs_blocks`` (GETs over map tasks x reducers; goal <= 0.01) and
``wall_vs_local_disk`` (goal <= 1.5), beside ``wall_floor_vs_local_disk``: the local disk's
time plus the stand-in's CPU time spread over the cores (it serves on the cores the stage
runs on), what the ratio cannot beat here::

    python benchmarks/object_store.py --cells 1000x1000 --uncoalesced --bytes 8_000_000

Throughput: ``--bytes`` of rows (``shuffle_api.testing.make_batches``) through the default
service's writers and gates in this process (8 map outputs of 8 subpartitions, every
subpartition read back), beside a plain copy of the same table to and from the store (8 Arrow
IPC objects written with pyarrow through fsspec, then read back): ``throughput_vs_copy`` is the
copy's seconds over the shuffle's (goal >= 0.8). Spark's costs are in the cells' times.

    python benchmarks/object_store.py
    python benchmarks/object_store.py --cells 16x200 --bytes 64_000_000
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import fsspec
import pyarrow as pa
import pyspark
from common import format_rows, machine, positive, save_results
from pyspark.sql import DataFrame, SparkSession

from pyspark_shuffle import SparkShuffle
from pyspark_shuffle.spark.local import local_spark_session
from shuffle_api import Configuration, SubpartitionRange
from shuffle_api.testing import ConformanceHarness, ShuffleScenario, make_batches

# The S3 stand-in is the tests' own: one definition of it.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.s3_stand_in import S3StandIn, running_stand_in

DEFAULT_OUTPUT = Path(__file__).resolve().parent / "results" / "object_store.json"
BUCKET = "pyshuffle-benchmark"
STORE_URL = f"s3://{BUCKET}/shuffle"
COUNT_SCHEMA = "rows long"
KINDS = ("GET", "PUT", "HEAD", "LIST", "POST", "DELETE", "BUCKET", "THROTTLED")
THROUGHPUT_TASKS = 8
_ROW_BYTES = 8 + 8 + 8 + 22  # make_batches: row, key, value, text (offset and characters)


def count_rows(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    yield pa.record_batch({"rows": pa.array([sum(batch.num_rows for batch in batches)])})


def cell_list(text: str) -> list[tuple[int, int]]:
    """An argument type: comma-separated ``MAPSxREDUCERS``."""
    cells = []
    for part in text.split(","):
        maps, _, reducers = part.strip().partition("x")
        cells.append((positive(maps), positive(reducers)))
    return cells


def bound(maps: int, reducers: int, executors: int) -> dict[str, int]:
    """Data: a ranged GET per block. Metadata: each map output's manifest and index read once
    per executor (its Python workers share them) and once by the driver. Writes: three PUTs
    per map output, and three checks on the write path (HEAD or LIST: the attempt is not
    committed yet, the bucket is there). Nothing else, and no LIST when reducers read."""
    gets = maps * reducers + 2 * maps * (executors + 1)
    return {"GET": gets, "PUT": 3 * maps, "HEAD+LIST": 3 * maps, "total": gets + 6 * maps}


@dataclass
class Stage:
    rows: int = 0
    seconds: float = 0.0
    map_tasks: int = 0
    merged_partitions: int = 0
    map_requests: dict[str, int] = field(default_factory=dict)
    reduce_requests: dict[str, int] = field(default_factory=dict)
    stand_in_cpu_seconds: float = 0.0


@contextlib.contextmanager
def stage(
    shuffle: SparkShuffle, data: DataFrame, reducers: int, stand_in: S3StandIn | None = None
) -> Iterator[Stage]:
    """Rows counted, seconds and (with ``stand_in``) the requests of the map stage (run when
    the exchange is made) and of the reduce stage; released on the way out."""
    measured = Stage()
    if stand_in is not None:
        stand_in.reset()
        cpu_before = stand_in.cpu_seconds()
    started = time.perf_counter()
    result = shuffle.repartition(data, "k", num_partitions=reducers)
    try:
        if stand_in is not None:
            measured.map_requests = stand_in.counts()
            stand_in.reset()
        counted = result.mapInArrow(count_rows, COUNT_SCHEMA).collect()
        measured.seconds = time.perf_counter() - started
        if stand_in is not None:
            measured.reduce_requests = stand_in.counts()
            measured.stand_in_cpu_seconds = stand_in.cpu_seconds() - cpu_before
        measured.rows = sum(row.rows for row in counted)
        statistics = shuffle.statistics(result)
        measured.map_tasks = statistics.map_tasks
        measured.merged_partitions = statistics.merged_partitions
        yield measured
    finally:
        shuffle.release(result)


def requests_cell(
    session: SparkSession,
    stand_in: S3StandIn,
    *,
    maps: int,
    reducers: int,
    rows: int,
    executors: int,
    settings: dict[str, Any],
) -> dict[str, Any]:
    data = session.range(0, rows, 1, maps).selectExpr("id as k", "id * 2 as v")
    with (
        SparkShuffle(session, {**settings, "netty-like.storage.url": ""}) as shuffle,
        stage(shuffle, data, reducers) as on_disk,
    ):
        pass
    with (
        SparkShuffle(session, {**settings, "netty-like.storage.url": STORE_URL}) as shuffle,
        stage(shuffle, data, reducers, stand_in) as on_store,
    ):
        pass
    counts = Counter(on_store.map_requests) + Counter(on_store.reduce_requests)
    map_tasks = on_store.map_tasks
    limit = bound(map_tasks, reducers, executors)
    total = sum(counts.get(kind, 0) for kind in KINDS if kind != "THROTTLED")
    merged_bound = reducers * executors + 3 * map_tasks
    # The stand-in serves on the cores the stage runs on: its CPU time, spread over them, is
    # time the stage on S3 cannot have, however few requests it made.
    wall_floor = on_disk.seconds + on_store.stand_in_cpu_seconds / (os.cpu_count() or 1)
    return {
        "maps": maps,
        "map_tasks": map_tasks,
        "reducers": reducers,
        "rows": rows,
        "merged_partitions": on_store.merged_partitions,
        "gets": counts.get("GET", 0),
        "objects_written": counts.get("PUT", 0) + counts.get("POST", 0),
        "merged_bound": merged_bound,
        "gets_vs_blocks": round(counts.get("GET", 0) / (map_tasks * reducers), 5),
        "wall_vs_local_disk": round(on_store.seconds / on_disk.seconds, 2),
        "stand_in_cpu_seconds": round(on_store.stand_in_cpu_seconds, 1),
        "wall_floor_vs_local_disk": round(wall_floor / on_disk.seconds, 2),
        "rows_exact": on_store.rows == rows and on_disk.rows == rows,
        "seconds_object_store": round(on_store.seconds, 2),
        "seconds_local_disk": round(on_disk.seconds, 2),
        "requests": {kind: counts.get(kind, 0) for kind in KINDS},
        "map_stage_requests": on_store.map_requests,
        "reduce_stage_requests": on_store.reduce_requests,
        "reduce_stage_lists": on_store.reduce_requests.get("LIST", 0),
        "requests_total": total,
        "bound": limit,
        "requests_vs_bound": round(total / limit["total"], 3),
    }


def server_gets_per_second(requests: int = 2_000, threads: int = 8) -> float:
    """The stand-in's own pace: small ranged GETs, ``threads`` at once from this process
    through fsspec (what a stage's GETs cannot beat here, whatever the client does)."""
    filesystem, root = fsspec.core.url_to_fs(f"s3://{BUCKET}/pace")
    filesystem.pipe_file(f"{root}/object", bytes(4096))
    started = time.perf_counter()
    with ThreadPoolExecutor(threads) as pool:
        list(
            pool.map(
                lambda offset: filesystem.cat_file(f"{root}/object", start=offset, end=offset + 64),
                [index % 4000 for index in range(requests)],
            )
        )
    seconds = time.perf_counter() - started
    filesystem.rm(root, recursive=True)
    return requests / seconds


def copy_seconds(table: pa.Table, parts: int) -> float:
    """Write ``table`` as ``parts`` Arrow IPC objects to the store and read them all back."""
    filesystem, root = fsspec.core.url_to_fs(f"s3://{BUCKET}/copy")
    slices = [table.slice(i * len(table) // parts, len(table) // parts) for i in range(parts)]
    started = time.perf_counter()
    for index, piece in enumerate(slices):
        with (
            filesystem.open(f"{root}/{index}.arrow", "wb") as file,
            pa.ipc.new_file(file, piece.schema) as writer,
        ):
            writer.write_table(piece)
    read = 0
    for index in range(parts):
        with filesystem.open(f"{root}/{index}.arrow", "rb") as file:
            read += pa.ipc.open_file(pa.py_buffer(file.read())).read_all().num_rows
    seconds = time.perf_counter() - started
    filesystem.rm(root, recursive=True)
    assert read == sum(len(piece) for piece in slices)
    return seconds


def throughput(nbytes: int) -> dict[str, Any]:
    """The default service's writers and gates in this process (no Spark), 8 map outputs of 8
    subpartitions on the object store, beside a plain copy of the same table."""
    rows = nbytes // _ROW_BYTES
    batches = make_batches(rows, batch_rows=65_536)
    table = pa.Table.from_batches(batches)
    copy = copy_seconds(table, THROUGHPUT_TASKS)
    configuration = Configuration.load({"netty-like.storage.url": STORE_URL}, environ={})
    with ShuffleScenario.open(ConformanceHarness(configuration)) as scenario:
        started = time.perf_counter()
        descriptors, _ = scenario.produce(
            batches, partitions=THROUGHPUT_TASKS, subpartitions=THROUGHPUT_TASKS
        )
        read = sum(
            scenario.read(scenario.consumer, descriptors, SubpartitionRange.single(index)).num_rows
            for index in range(THROUGHPUT_TASKS)
        )
        seconds = time.perf_counter() - started
    return {
        "bytes": table.nbytes,
        "rows_exact": read == rows,
        "seconds_shuffle": round(seconds, 2),
        "seconds_copy": round(copy, 2),
        "throughput_vs_copy": round(copy / seconds, 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cells", type=cell_list, default=cell_list("16x200,200x1000"))
    parser.add_argument("--rows-per-block", type=positive, default=5)
    parser.add_argument("--min-rows", type=positive, default=1_000_000)
    parser.add_argument("--executors", type=positive, default=1, help="executors (local[2] is one)")
    parser.add_argument("--bytes", type=positive, default=256_000_000)
    parser.add_argument(
        "--uncoalesced",
        action="store_true",
        help="one map task a partition (pyspark-shuffle.map.target-size=0), as big splits run",
    )
    parser.add_argument("--output", type=Path, default=DEFAULT_OUTPUT)
    arguments = parser.parse_args()
    settings = {"pyspark-shuffle.map.target-size": 0} if arguments.uncoalesced else {}

    with running_stand_in() as stand_in:
        stand_in.make_bucket(BUCKET)
        os.environ.update(stand_in.environment())  # the driver's, and local[2]'s workers'
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        session = local_spark_session(
            "object-store", driver_memory="4g", conf={"spark.sql.adaptive.enabled": "false"}
        )
        try:
            cells = []
            for maps, reducers in arguments.cells:
                rows = max(arguments.min_rows, arguments.rows_per_block * maps * reducers)
                print(f"{maps} x {reducers} ({rows} rows) ...", flush=True)
                cells.append(
                    requests_cell(
                        session,
                        stand_in,
                        maps=maps,
                        reducers=reducers,
                        rows=rows,
                        executors=arguments.executors,
                        settings=settings,
                    )
                )
        finally:
            session.stop()
        print(f"throughput ({arguments.bytes} bytes) ...", flush=True)
        moved = throughput(arguments.bytes)
        pace = server_gets_per_second()

    print(
        format_rows(
            [
                "cell",
                "GET",
                "PUT",
                "HEAD",
                "LIST",
                "other",
                "bound",
                "vs bound",
                "GETs/blocks",
                "merged",
                "s3 s",
                "disk s",
                "stand-in CPU s",
                "floor vs disk",
            ],
            [
                [
                    f"{c['map_tasks']}x{c['reducers']}",
                    *(str(c["requests"][kind]) for kind in ("GET", "PUT", "HEAD", "LIST")),
                    str(c["requests_total"] - sum(c["requests"][k] for k in KINDS[:4])),
                    str(c["bound"]["total"]),
                    f"{c['requests_vs_bound']:.2f}",
                    f"{c['gets_vs_blocks']:.4f}",
                    str(c["merged_partitions"]),
                    f"{c['seconds_object_store']:.1f}",
                    f"{c['seconds_local_disk']:.1f}",
                    f"{c['stand_in_cpu_seconds']:.1f}",
                    f"{c['wall_floor_vs_local_disk']:.2f}",
                ]
                for c in cells
            ],
        )
    )
    print(
        f"\nthroughput: {moved['bytes'] / 1e6:.0f} MB shuffled in {moved['seconds_shuffle']:.1f} s,"
        f" copied up and down in {moved['seconds_copy']:.1f} s:"
        f" throughput_vs_copy {moved['throughput_vs_copy']:.2f}"
    )
    print(f"the stand-in's pace: {pace:.0f} small ranged GETs/s (8 threads, one process)")
    save_results(
        arguments.output,
        {
            "benchmark": "object_store",
            "machine": machine(pyspark=pyspark.__version__, pyarrow=pa.__version__),
            "store": "moto S3 server on 127.0.0.1 (tests/s3_stand_in.py)",
            "cells": cells,
            "requests_vs_bound_max": max(c["requests_vs_bound"] for c in cells),
            "gets_vs_blocks_max": max(c["gets_vs_blocks"] for c in cells),
            "wall_vs_local_disk_max": max(c["wall_vs_local_disk"] for c in cells),
            "wall_floor_vs_local_disk_max": max(c["wall_floor_vs_local_disk"] for c in cells),
            "reduce_stage_lists": sum(c["reduce_stage_lists"] for c in cells),
            "throughput": moved,
            "throughput_vs_copy": moved["throughput_vs_copy"],
            "server_gets_per_second": round(pace, 1),
            "rows_exact": all(c["rows_exact"] for c in cells) and moved["rows_exact"],
        },
    )


if __name__ == "__main__":
    main()
