"""A worker's per-application byte quota, on real daemons: a push past it fails on the client
with QuotaExceededError, nothing of that partition stays on the worker, and what the
application holds already is still read whole, and shown with its bytes in the listings."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

import pytest

from external_shuffle.client.master import ExternalShuffleMaster
from external_shuffle.local_cluster import LocalCluster
from external_shuffle.ops.admin import Admin
from shuffle_api import (
    Configuration,
    QuotaExceededError,
    SubpartitionRange,
)
from shuffle_api.testing import ConformanceHarness, ShuffleScenario, make_batches
from shuffle_api.testing.harness import route
from shuffle_runtime.format import partition_directory
from shuffle_runtime.format.manifest import DATA_FILE
from shuffle_runtime.store import Store

QUOTA = 1 << 20


def test_a_push_past_the_application_quota_is_refused_and_leaves_nothing(
    tmp_path: Path,
) -> None:
    settings = {"external-shuffle.worker.application-quota": QUOTA}
    with LocalCluster(tmp_path / "cluster", workers=1, settings=settings) as cluster:
        config = Configuration.load(
            cluster.client_config(
                **{
                    "external-shuffle.replication-factor": 1,
                    "external-shuffle.client.read-from-store": False,
                    "shuffle.compression.codec": "none",
                }
            ),
            environ={},
        )
        with ShuffleScenario.open(ConformanceHarness(config)) as scenario:
            assert isinstance(scenario.master, ExternalShuffleMaster)
            # The application's producers, as the driver configures its executors.
            producing = config.with_values(scenario.master.environment_configuration())
            with scenario.environment(producing) as producer:
                producing_scenario = dataclasses.replace(scenario, producer=producer)
                small = make_batches(2_000)
                descriptor = scenario.partition_descriptor(0, partitions=2, subpartitions=2)
                kept, writer = producing_scenario.new_writer(descriptor)
                with writer:
                    for batch in small:
                        writer.write(batch, route(batch, 2))
                    writer.finish()
                large = make_batches(40_000)
                assert sum(batch.nbytes for batch in large) > QUOTA
                descriptor = scenario.partition_descriptor(1, partitions=2, subpartitions=2)
                refused, writer = producing_scenario.new_writer(descriptor)
                with pytest.raises(QuotaExceededError, match="quota"), writer:
                    for batch in large:
                        writer.write(batch, route(batch, 2))
                    writer.finish()
            store = Store(str(cluster.worker_store(0)))
            assert not store.exists(partition_directory(store, refused.result_partition_id))
            directory = partition_directory(store, kept.result_partition_id)
            held = store.size(store.child(directory, DATA_FILE))
            table = scenario.read(scenario.consumer, [kept], SubpartitionRange(0, 1))
            assert sorted(table.column("row").to_pylist()) == list(range(2_000))
            # What the application holds, as the worker's heartbeats tell the coordinator.
            admin = Admin(Configuration.load(cluster.client_config(), environ={}))
            try:
                deadline = time.monotonic() + 15
                while True:
                    [row] = [
                        row
                        for row in admin.view().applications
                        if row.application_id == scenario.master.application_id
                    ]
                    if row.stored_bytes == held or time.monotonic() > deadline:
                        break
                    time.sleep(0.2)
            finally:
                admin.close()
            assert row.stored_bytes == held
