"""The conformance tests. Subclass :class:`ShuffleServiceConformance` and provide a ``harness``
fixture returning a :class:`~shuffle_api.testing.ConformanceHarness`."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent.futures import Future

import numpy as np
import pyarrow as pa
import pytest

from shuffle_api.descriptors import (
    PartitionInfo,
    ResultPartitionDeploymentDescriptor,
    ResultPartitionType,
    ShuffleDescriptor,
    SubpartitionRange,
    UnknownShuffleDescriptor,
)
from shuffle_api.environment import ShuffleEnvironment, ShuffleIOOwner
from shuffle_api.errors import (
    InvalidOperationError,
    PartitionAlreadyConsumedError,
    PartitionError,
    PartitionNotFoundError,
    ProducerFailedError,
    ShuffleError,
)
from shuffle_api.serialization import deserialize, serialize
from shuffle_api.testing.harness import (
    SCHEMA,
    ConformanceHarness,
    ShuffleScenario,
    in_background,
    make_batches,
    route,
)

__all__ = ["PipelinedPartitionConformance", "ShuffleServiceConformance"]

LOCATIONS = ("same-process-environment", "other-environment")


def _expected(batches: list[pa.RecordBatch], subpartition: int, count: int) -> list[int]:
    """Row ids that belong to ``subpartition``, sorted."""
    table = pa.Table.from_batches(batches)
    keys = table.column("key").to_numpy()
    rows = table.column("row").to_numpy()
    return sorted(rows[keys % count == subpartition].tolist())


class ShuffleServiceConformance:
    """Behaviour every shuffle service must show."""

    @pytest.fixture
    def scenario(self, harness: ConformanceHarness) -> Iterator[ShuffleScenario]:
        with ShuffleScenario.open(harness) as scenario:
            yield scenario

    @staticmethod
    def _consumer(scenario: ShuffleScenario, location: str) -> ShuffleEnvironment:
        return scenario.producer if location == LOCATIONS[0] else scenario.consumer

    @pytest.mark.parametrize("location", LOCATIONS)
    def test_every_row_arrives_once_in_its_subpartition(
        self, scenario: ShuffleScenario, location: str
    ) -> None:
        batches = make_batches(30_000, batch_rows=4_000)
        descriptors, _ = scenario.produce(batches, partitions=3, subpartitions=5)
        consumer = self._consumer(scenario, location)
        for subpartition in range(5):
            table = scenario.read(consumer, descriptors, SubpartitionRange.single(subpartition))
            assert sorted(table.column("row").to_pylist()) == _expected(batches, subpartition, 5)
        whole = scenario.read(consumer, descriptors, SubpartitionRange(0, 4))
        assert whole.sort_by("row").equals(pa.Table.from_batches(batches).sort_by("row"))

    def test_blocking_partition_can_be_read_many_times(self, scenario: ShuffleScenario) -> None:
        batches = make_batches(5_000)
        descriptors, _ = scenario.produce(batches, partitions=1, subpartitions=2)
        first = scenario.read(scenario.consumer, descriptors, SubpartitionRange(0, 1))
        second = scenario.read(scenario.consumer, descriptors, SubpartitionRange(0, 1))
        assert first.num_rows == second.num_rows == 5_000
        assert first.sort_by("row").equals(second.sort_by("row"))

    def test_statistics_match_what_readers_get(self, scenario: ShuffleScenario) -> None:
        batches = make_batches(20_000)
        descriptors, statistics = scenario.produce(batches, partitions=2, subpartitions=4)
        for producer, (descriptor, stats) in enumerate(zip(descriptors, statistics, strict=True)):
            assert stats.total_rows == sum(b.num_rows for b in batches[producer::2])
            for subpartition in range(4):
                table = scenario.read(
                    scenario.consumer, [descriptor], SubpartitionRange.single(subpartition)
                )
                assert stats.rows_per_subpartition[subpartition] == table.num_rows
                assert stats.bytes_per_subpartition[subpartition] > 0
        metrics = scenario.master.partitions_with_metrics(scenario.job.job_id).result(timeout=60)
        by_id = {m.shuffle_descriptor.result_partition_id: m for m in metrics}
        for descriptor, stats in zip(descriptors, statistics, strict=True):
            reported = by_id[descriptor.result_partition_id]
            assert reported.available
            assert reported.statistics == stats

    @pytest.mark.parametrize("location", LOCATIONS)
    def test_empty_partition_reads_nothing(self, scenario: ShuffleScenario, location: str) -> None:
        descriptors, statistics = scenario.produce([], partitions=2, subpartitions=3)
        assert statistics[0].rows_per_subpartition == (0, 0, 0)
        table = scenario.read(
            self._consumer(scenario, location), descriptors, SubpartitionRange(0, 2)
        )
        assert table.num_rows == 0

    def test_1024_subpartitions(self, scenario: ShuffleScenario) -> None:
        batches = make_batches(50_000, batch_rows=25_000, keys=5_000)
        descriptors, statistics = scenario.produce(batches, partitions=2, subpartitions=1024)
        assert sum(s.total_rows for s in statistics) == 50_000
        for subpartition in (0, 1, 511, 1023):
            table = scenario.read(
                scenario.consumer, descriptors, SubpartitionRange.single(subpartition)
            )
            assert sorted(table.column("row").to_pylist()) == _expected(batches, subpartition, 1024)
        everything = scenario.read(scenario.consumer, descriptors, SubpartitionRange(0, 1023))
        assert everything.num_rows == 50_000

    def test_large_batches_round_trip(self, scenario: ShuffleScenario) -> None:
        # One batch of ~40 MB: larger than default buffers, chopped and spilled on the way.
        batches = make_batches(600_000, batch_rows=600_000, keys=50)
        descriptors, _ = scenario.produce(batches, partitions=1, subpartitions=3)
        table = scenario.read(scenario.consumer, descriptors, SubpartitionRange(0, 2))
        assert table.num_rows == 600_000
        assert table.sort_by("row").equals(pa.Table.from_batches(batches))

    @pytest.mark.parametrize("location", LOCATIONS)
    def test_broadcast_reaches_every_subpartition(
        self, scenario: ShuffleScenario, location: str
    ) -> None:
        batches = make_batches(3_000, batch_rows=1_000)
        descriptor = scenario.partition_descriptor(0, partitions=1, subpartitions=4)
        shuffle_descriptor, writer = scenario.new_writer(descriptor)
        with writer:
            writer.broadcast(batches[0])
            writer.write_to_subpartition(batches[1], 2)
            writer.broadcast(batches[2])
            statistics = writer.finish()
        assert statistics.rows_per_subpartition == (2_000, 2_000, 3_000, 2_000)
        consumer = self._consumer(scenario, location)
        for subpartition in range(4):
            rows = (
                scenario.read(
                    consumer, [shuffle_descriptor], SubpartitionRange.single(subpartition)
                )
                .column("row")
                .to_pylist()
            )
            expected = list(range(1_000)) + list(range(2_000, 3_000))
            if subpartition == 2:
                expected = list(range(3_000))  # write order is kept within a subpartition
            assert rows == expected

    @pytest.mark.parametrize("location", LOCATIONS)
    def test_released_partition_raises_partition_not_found(
        self, scenario: ShuffleScenario, location: str
    ) -> None:
        descriptors, _ = scenario.produce(make_batches(2_000), partitions=1, subpartitions=2)
        [descriptor] = descriptors
        partition = descriptor.result_partition_id
        assert partition in scenario.producer.partitions_occupying_local_resources() or (
            descriptor.stores_local_resources_on() is None
        )
        scenario.master.release_partition_externally(descriptor)
        scenario.producer.release_partitions_locally([partition])
        assert partition not in scenario.producer.partitions_occupying_local_resources()
        with pytest.raises(PartitionNotFoundError) as raised:
            scenario.read(self._consumer(scenario, location), descriptors, SubpartitionRange(0, 1))
        assert raised.value.partition_id == partition
        assert str(partition.partition_id) in str(raised.value)
        # Releasing twice is fine.
        scenario.master.release_partition_externally(descriptor)
        scenario.producer.release_partitions_locally([partition])
        self._assert_store_empty(scenario.harness)

    def test_partitions_released_at_once_are_each_gone_and_the_others_kept(
        self, scenario: ShuffleScenario
    ) -> None:
        batches = make_batches(3_000, batch_rows=500)
        descriptors, _ = scenario.produce(batches, partitions=3, subpartitions=2)
        *released, kept = descriptors
        scenario.master.release_partitions_externally(released)
        scenario.producer.release_partitions_locally(
            [descriptor.result_partition_id for descriptor in released]
        )
        for descriptor in released:
            with pytest.raises(PartitionNotFoundError) as raised:
                scenario.read(scenario.consumer, [descriptor], SubpartitionRange(0, 1))
            assert raised.value.partition_id == descriptor.result_partition_id
        rows = scenario.read(scenario.consumer, [kept], SubpartitionRange(0, 1)).column("row")
        assert sorted(rows.to_pylist()) == [
            row for batch in batches[2::3] for row in batch.column("row").to_pylist()
        ]
        scenario.master.release_partitions_externally(descriptors)  # again, and the rest
        scenario.producer.release_partitions_locally(
            [descriptor.result_partition_id for descriptor in descriptors]
        )
        self._assert_store_empty(scenario.harness)

    @staticmethod
    def _assert_store_empty(harness: ConformanceHarness) -> None:
        if harness.stored_files is not None:
            assert harness.stored_files() == []

    @pytest.mark.parametrize("location", LOCATIONS)
    def test_unknown_descriptor_is_read_after_update_partition_info(
        self, scenario: ShuffleScenario, location: str
    ) -> None:
        batches = make_batches(4_000)
        descriptor = scenario.partition_descriptor(0, partitions=1, subpartitions=2)
        attempt = "late-producer"
        placeholder = UnknownShuffleDescriptor(
            scenario.register(descriptor, attempt).result_partition_id
        )
        consumer = self._consumer(scenario, location)
        gate = scenario.gate(consumer, [placeholder], SubpartitionRange(0, 1), attempt="consumer-1")
        reading = in_background(lambda: pa.Table.from_batches(list(gate), schema=SCHEMA))
        shuffle_descriptor, writer = scenario.new_writer(descriptor, attempt)
        with writer:
            for batch in batches:
                writer.write(batch, route(batch, 2))
        info = PartitionInfo(scenario.result_id, deserialize(serialize(shuffle_descriptor)))  # type: ignore[arg-type]
        assert not consumer.update_partition_info("someone-else", info)
        assert consumer.update_partition_info("consumer-1", info)
        table = reading.result(timeout=60)
        assert isinstance(table, pa.Table)
        assert table.num_rows == 4_000
        gate.close()

    def test_failed_writer_leaves_nothing(self, scenario: ShuffleScenario) -> None:
        descriptor = scenario.partition_descriptor(0, partitions=1, subpartitions=3)
        shuffle_descriptor, writer = scenario.new_writer(descriptor)
        with pytest.raises(RuntimeError, match="task crashed"), writer:
            for batch in make_batches(200_000, batch_rows=50_000):
                writer.write(batch, route(batch, 3))
            raise RuntimeError("task crashed")
        partition = shuffle_descriptor.result_partition_id
        assert partition not in scenario.producer.partitions_occupying_local_resources()
        with pytest.raises(PartitionNotFoundError):
            scenario.read(scenario.consumer, [shuffle_descriptor], SubpartitionRange(0, 2))
        self._assert_store_empty(scenario.harness)
        with pytest.raises(ShuffleError):
            writer.write(make_batches(1)[0], [0])

    def test_schema_change_is_rejected(self, scenario: ShuffleScenario) -> None:
        descriptor = scenario.partition_descriptor(0, partitions=1, subpartitions=2)
        _, writer = scenario.new_writer(descriptor)
        with writer:
            writer.write(make_batches(10)[0], [0] * 10)
            with pytest.raises(ShuffleError, match="schema"):
                writer.write(pa.record_batch({"other": pa.array([1])}), [0])
            writer.finish()

    def test_descriptors_survive_serialization(self, scenario: ShuffleScenario) -> None:
        descriptors, _ = scenario.produce(make_batches(1_000), partitions=1, subpartitions=2)
        copies = [deserialize(serialize(d)) for d in descriptors]
        assert copies == descriptors
        table = scenario.read(scenario.consumer, copies, SubpartitionRange(0, 1))  # type: ignore[arg-type]
        assert table.num_rows == 1_000

    @pytest.mark.parametrize("location", LOCATIONS)
    def test_a_merged_partition_reads_as_its_sources_did(
        self, scenario: ShuffleScenario, location: str
    ) -> None:
        """Merged into one more partition of the result: the same rows in the same order, the
        sources' statistics added up; released, it leaves the sources' files alone. A
        service that does not merge these writes nothing."""
        sources, statistics = scenario.produce(
            make_batches(12_000, batch_rows=1_000), partitions=4, subpartitions=5
        )
        stored = scenario.harness.stored_files
        before = stored() if stored is not None else None
        descriptor = scenario.partition_descriptor(4, partitions=5, subpartitions=5)
        merged = scenario.register(descriptor)
        written = scenario.producer.merge_partitions(
            ShuffleIOOwner("merge", merged.result_partition_id.producer_attempt_id),
            sources,
            ResultPartitionDeploymentDescriptor(descriptor, merged),
        )
        if written is None:
            assert not scenario.harness.merges
            assert stored is None or stored() == before
            return
        consumer = self._consumer(scenario, location)
        for subpartition in range(5):
            one = SubpartitionRange.single(subpartition)
            assert scenario.read(consumer, [merged], one).equals(
                scenario.read(consumer, sources, one)
            )
            assert written.rows_per_subpartition[subpartition] == sum(
                each.rows_per_subpartition[subpartition] for each in statistics
            )
        scenario.master.release_partition_externally(merged)
        scenario.producer.release_partitions_locally([merged.result_partition_id])
        assert stored is None or stored() == before
        with pytest.raises(PartitionNotFoundError):
            scenario.read(consumer, [merged], SubpartitionRange(0, 4))

    def test_a_merge_of_a_lost_source_writes_nothing(self, scenario: ShuffleScenario) -> None:
        sources, _ = scenario.produce(make_batches(3_000), partitions=3, subpartitions=2)
        scenario.lose(sources[1])
        stored = scenario.harness.stored_files
        before = stored() if stored is not None else None
        descriptor = scenario.partition_descriptor(3, partitions=4, subpartitions=2)
        merged = scenario.register(descriptor)
        try:
            written = scenario.producer.merge_partitions(
                ShuffleIOOwner("merge", merged.result_partition_id.producer_attempt_id),
                sources,
                ResultPartitionDeploymentDescriptor(descriptor, merged),
            )
        except PartitionNotFoundError as error:
            assert error.partition_id == sources[1].result_partition_id
        else:
            assert written is None
        assert stored is None or stored() == before

    @pytest.mark.parametrize("statistics", [True, False], ids=["with-statistics", "available"])
    def test_lost_partition_is_reported_to_the_job(
        self, scenario: ShuffleScenario, statistics: bool
    ) -> None:
        descriptors, _ = scenario.produce(make_batches(1_000), partitions=2, subpartitions=2)
        lost = descriptors[0].result_partition_id
        scenario.lose(descriptors[0])
        job = scenario.job.job_id
        scenario.master.partitions_with_metrics(job, statistics=statistics).result(timeout=60)
        available = scenario.master.partitions_with_metrics(job, statistics=statistics).result(
            timeout=60
        )
        ids = {m.shuffle_descriptor.result_partition_id for m in available if m.available}
        assert descriptors[1].result_partition_id in ids
        assert lost not in ids
        assert scenario.job.lost == [lost]

    def test_availability_alone_carries_no_statistics(self, scenario: ShuffleScenario) -> None:
        descriptors, _ = scenario.produce(make_batches(2_000), partitions=3, subpartitions=5)
        metrics = scenario.master.partitions_with_metrics(
            scenario.job.job_id, statistics=False
        ).result(timeout=60)
        assert sorted(m.shuffle_descriptor.result_partition_id for m in metrics) == sorted(
            d.result_partition_id for d in descriptors
        )
        assert all(m.available and m.statistics is None for m in metrics)

    def test_unsupported_partition_types_are_rejected(self, scenario: ShuffleScenario) -> None:
        for partition_type in ResultPartitionType:
            if partition_type in scenario.harness.partition_types:
                continue
            descriptor = scenario.partition_descriptor(
                0, partitions=1, subpartitions=2, partition_type=partition_type
            )
            with pytest.raises(InvalidOperationError, match=partition_type.name):
                scenario.new_writer(descriptor)


class PipelinedPartitionConformance(ShuffleServiceConformance):
    """Behaviour of services that also stream PIPELINED partitions while they are produced."""

    @staticmethod
    def _pipelined(scenario: ShuffleScenario) -> ResultPartitionType:
        assert ResultPartitionType.PIPELINED in scenario.harness.partition_types
        return ResultPartitionType.PIPELINED

    @pytest.mark.parametrize("location", LOCATIONS)
    def test_pipelined_partition_streams_while_produced(
        self, scenario: ShuffleScenario, location: str
    ) -> None:
        partition_type = self._pipelined(scenario)
        batches = make_batches(40_000, batch_rows=2_000)
        descriptor = scenario.partition_descriptor(
            0, partitions=1, subpartitions=2, partition_type=partition_type
        )
        shuffle_descriptor, writer = scenario.new_writer(descriptor)
        first_written = threading.Event()

        def produce() -> object:
            with writer:
                for batch in batches:
                    writer.write(batch, route(batch, 2))
                    first_written.set()
                return writer.finish()

        consumer = self._consumer(scenario, location)
        readers = [
            in_background(
                lambda s=subpartition: scenario.read(  # type: ignore[misc]
                    consumer,
                    [shuffle_descriptor],
                    SubpartitionRange.single(s),
                    partition_type=partition_type,
                )
            )
            for subpartition in range(2)
        ]
        producing = in_background(produce)
        assert first_written.wait(30)
        producing.result(timeout=120)
        tables = [reader.result(timeout=120) for reader in readers]
        for subpartition, table in enumerate(tables):
            assert isinstance(table, pa.Table)
            assert table.column("row").to_pylist() == _expected(batches, subpartition, 2)
        with pytest.raises(PartitionError):
            scenario.read(
                consumer,
                [shuffle_descriptor],
                SubpartitionRange(0, 1),
                partition_type=partition_type,
            )

    def test_pipelined_subpartition_is_consumed_once(self, scenario: ShuffleScenario) -> None:
        partition_type = self._pipelined(scenario)
        descriptors, _ = self._produce_pipelined_in_background(scenario, partition_type)
        first = scenario.read(
            scenario.consumer, descriptors, SubpartitionRange(0, 0), partition_type=partition_type
        )
        assert first.num_rows > 0
        with pytest.raises(PartitionAlreadyConsumedError):
            scenario.read(
                scenario.consumer,
                descriptors,
                SubpartitionRange(0, 0),
                partition_type=partition_type,
            )

    @staticmethod
    def _produce_pipelined_in_background(
        scenario: ShuffleScenario, partition_type: ResultPartitionType
    ) -> tuple[list[ShuffleDescriptor], Future[object]]:
        descriptor = scenario.partition_descriptor(
            0, partitions=1, subpartitions=2, partition_type=partition_type
        )
        shuffle_descriptor, writer = scenario.new_writer(descriptor)
        batches = make_batches(5_000, batch_rows=1_000)

        def produce() -> object:
            with writer:
                for batch in batches:
                    writer.write(batch, route(batch, 2))
                return writer.finish()

        return [shuffle_descriptor], in_background(produce)

    def test_pipelined_producer_failure_reaches_the_consumer(
        self, scenario: ShuffleScenario
    ) -> None:
        partition_type = self._pipelined(scenario)
        descriptor = scenario.partition_descriptor(
            0, partitions=1, subpartitions=1, partition_type=partition_type
        )
        shuffle_descriptor, writer = scenario.new_writer(descriptor)
        batch = make_batches(100)[0]
        writer.write(batch, np.zeros(100, dtype=np.int64))
        reading = in_background(
            lambda: scenario.read(
                scenario.consumer,
                [shuffle_descriptor],
                SubpartitionRange(0, 0),
                partition_type=partition_type,
            )
        )
        writer.fail(RuntimeError("map task died"))
        with pytest.raises(ProducerFailedError) as raised:
            reading.result(timeout=60)
        assert raised.value.partition_id == shuffle_descriptor.result_partition_id
