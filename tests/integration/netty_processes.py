"""Producer processes for the cross-process tests (run under multiprocessing's spawn)."""

from __future__ import annotations

from multiprocessing.connection import Connection

from shuffle_api import (
    Configuration,
    IntermediateResultPartitionID,
    PartitionDescriptor,
    ResultPartitionDeploymentDescriptor,
    ResultPartitionType,
    ShuffleEnvironmentContext,
    ShuffleIOOwner,
    ShuffleMasterContext,
    load_shuffle_service_factory,
    serialize,
)
from shuffle_api.testing import RecordingJobContext, make_batches

RESULT_ID = "cross-process"


def produce(
    settings: dict[str, object],
    partition_type_name: str,
    *,
    rows: int,
    batch_rows: int,
    subpartitions: int,
    secret: bytes,
    pipe: Connection,
) -> None:
    """Write one partition, send its descriptor bytes, then statistics and the most bytes ever
    queued; serve until the parent says stop."""
    config = Configuration.load(settings, environ={})
    factory = load_shuffle_service_factory(config)
    partition_type = ResultPartitionType[partition_type_name]
    with factory.create_shuffle_master(ShuffleMasterContext(config, secret=secret)) as master:
        master.register_job(RecordingJobContext("job"))
        environment = factory.create_shuffle_environment(
            ShuffleEnvironmentContext(
                config, resource_id="producer-process", host="127.0.0.1", secret=secret
            )
        )
        with environment:
            descriptor = PartitionDescriptor(
                RESULT_ID,
                1,
                IntermediateResultPartitionID(RESULT_ID, 0),
                partition_type,
                subpartitions,
            )
            shuffle_descriptor = master.register_partition_with_producer(
                "job", descriptor, environment.producer_descriptor("attempt-0")
            ).result()
            pipe.send_bytes(serialize(shuffle_descriptor))
            [writer] = environment.create_result_partition_writers(
                ShuffleIOOwner("map", "attempt-0"),
                [ResultPartitionDeploymentDescriptor(descriptor, shuffle_descriptor)],
            )
            most_queued = 0
            with writer:
                for batch in make_batches(rows, batch_rows=batch_rows):
                    writer.write(batch, batch.column("key").to_numpy() % subpartitions)
                    most_queued = max(most_queued, environment.queued_bytes())  # type: ignore[attr-defined]
                statistics = writer.finish()
            pipe.send((statistics.rows_per_subpartition, most_queued))
            pipe.recv()  # the consumer is done
            pipe.send(environment.queued_bytes())  # type: ignore[attr-defined]
            pipe.recv()
