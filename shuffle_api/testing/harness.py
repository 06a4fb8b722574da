"""What the conformance suite needs from an implementation, and the scenario it drives."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future
from contextlib import contextmanager
from dataclasses import dataclass, field

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
from shuffle_api.io import InputGate, PartitionStatistics, ResultPartitionWriter
from shuffle_api.master import RecordingJobContext, ShuffleMaster

__all__ = ["ConformanceHarness", "RecordingJobContext", "ShuffleScenario", "make_batches"]


@dataclass(frozen=True)
class ConformanceHarness:
    """An implementation under test: its configuration, which partition types it supports,
    (optionally) how to list the files it left on its store, and how data gets lost behind the
    master's back (default: the producer's environment releases the partition)."""

    configuration: Configuration
    stored_files: Callable[[], list[str]] | None = None
    partition_types: tuple[ResultPartitionType, ...] = tuple(ResultPartitionType)
    lose_partition: Callable[[ShuffleScenario, ShuffleDescriptor], None] | None = None
    merges: bool = False
    """The producer's environment merges partitions it wrote itself (see
    ``ShuffleEnvironment.merge_partitions``)."""


def make_batches(
    rows: int, *, batch_rows: int = 10_000, seed: int = 7, keys: int = 1_000
) -> list[pa.RecordBatch]:
    """Deterministic batches: unique ``row``, int64 ``key``, float64 ``value``, string ``text``."""
    generator = np.random.default_rng(seed)
    batches = []
    for start in range(0, rows, batch_rows):
        count = min(batch_rows, rows - start)
        key = generator.integers(0, keys, count)
        batches.append(
            pa.record_batch(
                {
                    "row": pa.array(np.arange(start, start + count, dtype=np.int64)),
                    "key": pa.array(key),
                    "value": pa.array(generator.random(count)),
                    "text": pa.array([f"text-{k:08d}-{i % 97:03d}" for i, k in enumerate(key)]),
                }
            )
        )
    return batches


@dataclass
class ShuffleScenario:
    """One master, a producer environment and a consumer environment, for one job."""

    harness: ConformanceHarness
    master: ShuffleMaster
    producer: ShuffleEnvironment
    consumer: ShuffleEnvironment
    job: RecordingJobContext
    secret: bytes = field(repr=False)
    """The application's, which the master and both environments share."""
    result_id: str = field(default_factory=lambda: "result-" + new_id())

    @classmethod
    @contextmanager
    def open(cls, harness: ConformanceHarness) -> Iterator[ShuffleScenario]:
        factory = load_shuffle_service_factory(harness.configuration)
        # One application: the master and both environments share its secret.
        master_context = ShuffleMasterContext(harness.configuration)
        master = factory.create_shuffle_master(master_context)
        producer = factory.create_shuffle_environment(
            ShuffleEnvironmentContext(
                harness.configuration, host="127.0.0.1", secret=master_context.secret
            )
        )
        consumer = factory.create_shuffle_environment(
            ShuffleEnvironmentContext(
                harness.configuration, host="127.0.0.1", secret=master_context.secret
            )
        )
        master.start()
        producer.start()
        consumer.start()
        job = RecordingJobContext("job-" + new_id())
        master.register_job(job)
        try:
            yield cls(harness, master, producer, consumer, job, master_context.secret)
        finally:
            consumer.close()
            producer.close()
            master.unregister_job(job.job_id)
            master.close()

    def environment(self, configuration: Configuration) -> ShuffleEnvironment:
        """Another environment of this application (its secret), on 127.0.0.1, with
        ``configuration``: a consumer set up otherwise, an executor told more by the master.
        The caller closes it."""
        return load_shuffle_service_factory(configuration).create_shuffle_environment(
            ShuffleEnvironmentContext(configuration, host="127.0.0.1", secret=self.secret)
        )

    def lose(self, descriptor: ShuffleDescriptor) -> None:
        """Make the service lose this partition's data (see :class:`ConformanceHarness`)."""
        if self.harness.lose_partition is None:
            self.producer.release_partitions_locally([descriptor.result_partition_id])
        else:
            self.harness.lose_partition(self, descriptor)

    def partition_descriptor(
        self,
        index: int,
        *,
        partitions: int,
        subpartitions: int,
        partition_type: ResultPartitionType = ResultPartitionType.BLOCKING,
    ) -> PartitionDescriptor:
        return PartitionDescriptor(
            self.result_id,
            partitions,
            IntermediateResultPartitionID(self.result_id, index),
            partition_type,
            subpartitions,
        )

    def register(
        self, descriptor: PartitionDescriptor, attempt: str | None = None
    ) -> ShuffleDescriptor:
        producer = self.producer.producer_descriptor(attempt or "attempt-" + new_id())
        return self.master.register_partition_with_producer(
            self.job.job_id, descriptor, producer
        ).result(timeout=60)

    def writer(
        self, descriptor: PartitionDescriptor, shuffle_descriptor: ShuffleDescriptor
    ) -> ResultPartitionWriter:
        owner = ShuffleIOOwner(
            "producer", shuffle_descriptor.result_partition_id.producer_attempt_id
        )
        [writer] = self.producer.create_result_partition_writers(
            owner, [ResultPartitionDeploymentDescriptor(descriptor, shuffle_descriptor)]
        )
        return writer

    def new_writer(
        self, descriptor: PartitionDescriptor, attempt: str | None = None
    ) -> tuple[ShuffleDescriptor, ResultPartitionWriter]:
        """Register ``descriptor`` with the master, then open its writer on the producer."""
        shuffle_descriptor = self.register(descriptor, attempt)
        return shuffle_descriptor, self.writer(descriptor, shuffle_descriptor)

    def produce(
        self,
        batches: Sequence[pa.RecordBatch],
        *,
        partitions: int,
        subpartitions: int,
        partition_type: ResultPartitionType = ResultPartitionType.BLOCKING,
    ) -> tuple[list[ShuffleDescriptor], list[PartitionStatistics]]:
        """Producer p writes every p-th batch, each row to subpartition ``key % subpartitions``."""
        descriptors: list[ShuffleDescriptor] = []
        statistics: list[PartitionStatistics] = []
        for index in range(partitions):
            descriptor = self.partition_descriptor(
                index,
                partitions=partitions,
                subpartitions=subpartitions,
                partition_type=partition_type,
            )
            shuffle_descriptor, writer = self.new_writer(descriptor)
            with writer:
                for batch in batches[index::partitions]:
                    writer.write(batch, route(batch, subpartitions))
                statistics.append(writer.finish())
            descriptors.append(shuffle_descriptor)
        return descriptors, statistics

    def gate(
        self,
        environment: ShuffleEnvironment,
        descriptors: Sequence[ShuffleDescriptor],
        subpartitions: SubpartitionRange,
        *,
        partition_type: ResultPartitionType = ResultPartitionType.BLOCKING,
        attempt: str | None = None,
    ) -> InputGate:
        owner = ShuffleIOOwner("consumer", attempt or "consumer-" + new_id())
        [gate] = environment.create_input_gates(
            owner,
            [
                InputGateDeploymentDescriptor(
                    self.result_id, partition_type, subpartitions, tuple(descriptors)
                )
            ],
        )
        return gate

    def read(
        self,
        environment: ShuffleEnvironment,
        descriptors: Sequence[ShuffleDescriptor],
        subpartitions: SubpartitionRange,
        *,
        partition_type: ResultPartitionType = ResultPartitionType.BLOCKING,
    ) -> pa.Table:
        with self.gate(
            environment, descriptors, subpartitions, partition_type=partition_type
        ) as gate:
            return pa.Table.from_batches(list(gate), schema=SCHEMA)


SCHEMA = make_batches(1)[0].schema


def route(batch: pa.RecordBatch, subpartitions: int) -> npt.NDArray[np.int64]:
    """The subpartition of each row: ``key % subpartitions``."""
    keys: npt.NDArray[np.int64] = batch.column("key").to_numpy()
    return keys % subpartitions


def in_background(function: Callable[[], object]) -> Future[object]:
    """Run ``function`` in a thread; the future holds its result or exception."""
    future: Future[object] = Future()

    def run() -> None:
        try:
            future.set_result(function())
        except BaseException as error:
            future.set_exception(error)

    threading.Thread(target=run, daemon=True).start()
    return future
