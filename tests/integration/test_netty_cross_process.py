"""A producer process and a consumer process exchange partitions over the data port."""

from __future__ import annotations

import multiprocessing
import secrets
import time
from collections.abc import Iterator
from contextlib import contextmanager
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from pathlib import Path

import pyarrow as pa
import pytest

from shuffle_api import (
    Configuration,
    InputGateDeploymentDescriptor,
    PartitionNotFoundError,
    ResultPartitionType,
    ShuffleDescriptor,
    ShuffleEnvironmentContext,
    ShuffleIOOwner,
    SubpartitionRange,
    deserialize,
    load_shuffle_service_factory,
)
from shuffle_api.testing import make_batches
from tests.integration.netty_processes import RESULT_ID, produce

BUFFER = 256 << 10
# The application's, shared by the producer process and the consumer.
SECRET = secrets.token_bytes(32)


@contextmanager
def producer_process(
    settings: dict[str, object], partition_type: ResultPartitionType, rows: int, subpartitions: int
) -> Iterator[tuple[ShuffleDescriptor, Connection, BaseProcess]]:
    context = multiprocessing.get_context("spawn")
    parent, child = context.Pipe()
    process = context.Process(
        target=produce,
        args=(settings, partition_type.name),
        kwargs={
            "rows": rows,
            "batch_rows": 2_000,
            "subpartitions": subpartitions,
            "secret": SECRET,
            "pipe": child,
        },
        daemon=True,
    )
    process.start()
    try:
        assert parent.poll(60), "producer process did not start"
        descriptor = deserialize(parent.recv_bytes())
        assert isinstance(descriptor, ShuffleDescriptor)
        yield descriptor, parent, process
    finally:
        if process.is_alive():
            try:
                parent.send("stop")
                parent.send("stop")
            except OSError:
                pass
        process.join(30)
        if process.is_alive():
            process.kill()


def _settings(tmp_path: Path) -> dict[str, object]:
    return {
        "netty-like.storage.url": str(tmp_path / "store"),
        "netty-like.pipelined.subpartition-buffer": BUFFER,
        "shuffle.batch.target-size": "64k",
    }


def _read(
    settings: dict[str, object],
    descriptor: ShuffleDescriptor,
    partition_type: ResultPartitionType,
    subpartitions: SubpartitionRange,
    *,
    pause_every_batch: float = 0.0,
) -> pa.Table:
    config = Configuration.load(settings, environ={})
    factory = load_shuffle_service_factory(config)
    environment = factory.create_shuffle_environment(
        ShuffleEnvironmentContext(
            config, resource_id="consumer-process", host="127.0.0.1", secret=SECRET
        )
    )
    with environment:
        [gate] = environment.create_input_gates(
            ShuffleIOOwner("reduce", "reduce-0"),
            [
                InputGateDeploymentDescriptor(
                    RESULT_ID, partition_type, subpartitions, (descriptor,)
                )
            ],
        )
        batches = []
        with gate:
            for batch in gate:
                batches.append(batch)
                time.sleep(pause_every_batch)
        return pa.Table.from_batches(batches, schema=make_batches(1)[0].schema)


def test_pipelined_partition_streams_to_another_process_under_backpressure(
    tmp_path: Path,
) -> None:
    settings = _settings(tmp_path)
    rows = 300_000  # ~13.5 MB, about 50 times the subpartition buffer
    with producer_process(settings, ResultPartitionType.PIPELINED, rows, 1) as (
        descriptor,
        pipe,
        _,
    ):
        table = _read(
            settings,
            descriptor,
            ResultPartitionType.PIPELINED,
            SubpartitionRange(0, 0),
            pause_every_batch=0.001,
        )
        rows_written, most_queued = pipe.recv()
        pipe.send("consumer done")
        assert pipe.recv() == 0  # consumed: nothing left queued in the producer
    assert rows_written == (rows,)
    assert table.num_rows == rows
    assert table.column("row").to_pylist() == list(range(rows))  # order kept within a subpartition
    expected_bytes = sum(batch.nbytes for batch in make_batches(rows, batch_rows=2_000))
    assert expected_bytes > 40 * BUFFER
    # Backpressure: the producer never queued more than its budget while the consumer lagged.
    assert 0 < most_queued <= BUFFER


@pytest.mark.parametrize("store", ["shared directory", "producer's memory"])
def test_blocking_partition_is_read_from_another_process(tmp_path: Path, store: str) -> None:
    # A store only the producer sees (its memory://) is read through the data port.
    settings = _settings(tmp_path)
    if store == "producer's memory":
        settings["netty-like.storage.url"] = f"memory://{tmp_path.name}"
    rows = 100_000
    with producer_process(settings, ResultPartitionType.BLOCKING, rows, 4) as (descriptor, pipe, _):
        rows_written, _ = pipe.recv()
        assert descriptor.stores_local_resources_on() == "producer-process"
        expected = pa.Table.from_batches(make_batches(rows, batch_rows=2_000))
        for subpartition in range(4):
            table = _read(
                settings,
                descriptor,
                ResultPartitionType.BLOCKING,
                SubpartitionRange.single(subpartition),
            )
            assert table.num_rows == rows_written[subpartition]
            keys = table.column("key").to_numpy()
            assert (keys % 4 == subpartition).all()
        table = _read(settings, descriptor, ResultPartitionType.BLOCKING, SubpartitionRange(0, 3))
        assert table.sort_by("row").equals(expected)
        pipe.send("consumer done")
        pipe.recv()


def test_reading_from_a_dead_producer_names_the_partition(tmp_path: Path) -> None:
    settings = _settings(tmp_path)
    with producer_process(settings, ResultPartitionType.BLOCKING, 1_000, 1) as (
        descriptor,
        pipe,
        _,
    ):
        pipe.recv()
        pipe.send("consumer done")
        pipe.recv()
        pipe.send("stop")
        time.sleep(0.5)
    with pytest.raises(Exception) as raised:
        _read(settings, descriptor, ResultPartitionType.BLOCKING, SubpartitionRange(0, 0))
    assert str(descriptor.result_partition_id) in str(raised.value)
    assert getattr(raised.value, "partition_id", None) == descriptor.result_partition_id


def test_blocking_partition_on_a_shared_store_outlives_its_producer(tmp_path: Path) -> None:
    settings = _settings(tmp_path)
    rows = 10_000
    with producer_process(settings, ResultPartitionType.BLOCKING, rows, 2) as (
        descriptor,
        pipe,
        process,
    ):
        rows_written, _ = pipe.recv()
        process.kill()  # no clean shutdown: nothing released, no data port any more
        process.join(30)
        table = _read(settings, descriptor, ResultPartitionType.BLOCKING, SubpartitionRange(0, 1))
    assert table.num_rows == rows == sum(rows_written)
    expected = pa.Table.from_batches(make_batches(rows, batch_rows=2_000))
    assert table.sort_by("row").equals(expected)


def test_a_killed_producer_read_only_through_its_data_port_is_not_found(tmp_path: Path) -> None:
    settings = _settings(tmp_path)
    with producer_process(settings, ResultPartitionType.BLOCKING, 1_000, 1) as (
        descriptor,
        pipe,
        process,
    ):
        pipe.recv()
        process.kill()
        process.join(30)
        with pytest.raises(
            PartitionNotFoundError,
            match=r"is not read from the store here \(netty-like.read-from-shared-store = false\)"
            ".*does not answer",
        ) as raised:
            _read(
                {**settings, "netty-like.read-from-shared-store": False},
                descriptor,
                ResultPartitionType.BLOCKING,
                SubpartitionRange(0, 0),
            )
    assert raised.value.partition_id == descriptor.result_partition_id
