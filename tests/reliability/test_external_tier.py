"""Workers that move committed partitions to a tier store (moto's S3 server standing in for an
object store): on decommission and past a high-water mark; readers follow them there, a moved
partition outlives its worker, and its job's end deletes it from the tier."""

from __future__ import annotations

import functools
from collections.abc import Iterator
from pathlib import Path

import pytest

from external_shuffle.local_cluster import LocalCluster
from shuffle_api import ShuffleDescriptor, new_id
from tests.eventually import eventually
from tests.reliability.external_cluster import (
    ALL,
    PARTITIONS,
    ROWS,
    SUBPARTITIONS,
    batches,
    external,
    list_workers,
    partition_files,
    placed_on,
    rows_of,
    scenario_on,
)
from tests.reliability.test_external_admin import admin
from tests.s3_stand_in import S3StandIn, objects_under

ONE_REPLICA = {"external-shuffle.replication-factor": 1}


def _data_files(cluster: LocalCluster, index: int) -> list[Path]:
    return [path for path in partition_files(cluster, index) if path.name == "data.arrow"]


@pytest.fixture
def tier_url(s3_stand_in: S3StandIn) -> str:
    bucket = f"tier-{new_id()}"
    s3_stand_in.make_bucket(bucket)
    return f"s3://{bucket}/moved"


def _cluster(tmp_path: Path, tier_url: str, **settings: object) -> LocalCluster:
    # Local disks the clients do not read: every read goes through a worker, or the tier.
    return LocalCluster(
        tmp_path,
        workers=2,
        store_shared=False,
        settings={"external-shuffle.worker.tier-url": tier_url, **settings},
    )


@pytest.fixture
def cluster(tmp_path: Path, tier_url: str) -> Iterator[LocalCluster]:
    with _cluster(tmp_path, tier_url) as started:
        yield started


def _within(cluster: LocalCluster, index: int, limit: int) -> bool:
    return sum(path.stat().st_size for path in _data_files(cluster, index)) <= limit


def _on_tier(cluster: LocalCluster) -> int:
    """Partitions moved to the tier, as the workers' loads at the coordinator say."""
    return sum(entry.load.partitions_on_tier for entry in list_workers(cluster))


def _on_worker(cluster: LocalCluster, descriptors: list[ShuffleDescriptor], index: int) -> int:
    return sum(placed_on(cluster, descriptor) == {index} for descriptor in descriptors)


def test_a_decommissioned_worker_moves_its_partitions_and_readers_follow_them_when_it_is_gone(
    cluster: LocalCluster, tier_url: str
) -> None:
    with scenario_on(cluster, **ONE_REPLICA) as scenario:
        descriptors, _ = scenario.produce(
            batches(), partitions=PARTITIONS, subpartitions=SUBPARTITIONS
        )
        assert _on_worker(cluster, descriptors, 0) > 0
        assert objects_under(tier_url) == []

        # Returns once the coordinator has heard that all of them moved.
        done = admin(cluster, "decommission", cluster.worker_target(0), "--wait", "60")
        assert done.returncode == 0, done.stderr
        assert "0 partitions remain" in done.stdout
        assert _data_files(cluster, 0) == []
        assert len(_data_files(cluster, 1)) == _on_worker(cluster, descriptors, 1)
        moved = [path for path in objects_under(tier_url) if path.endswith("/data.arrow")]
        assert len(moved) == _on_worker(cluster, descriptors, 0)

        assert _on_tier(cluster) == len(moved)
        cluster.kill_worker(0)
        eventually(
            lambda: sum(entry.alive for entry in list_workers(cluster)) == 1,
            "the coordinator declares worker 0 dead",
        )
        assert rows_of(scenario.read(scenario.consumer, descriptors, ALL)) == list(range(ROWS))
        found = scenario.master.partitions_with_metrics(scenario.job.job_id).result()
        assert all(entry.available for entry in found)
        rows = sum(sum(e.statistics.rows_per_subpartition) for e in found if e.statistics)
        assert rows == ROWS

        external(scenario.master).unregister_job(scenario.job.job_id)
        eventually(
            lambda: objects_under(tier_url) == [], "the job's end deletes the moved partitions"
        )


def test_past_the_high_water_mark_the_oldest_move_and_a_restarted_worker_serves_them(
    tmp_path: Path, tier_url: str
) -> None:
    high_water = 64 << 10
    with (
        _cluster(
            tmp_path,
            tier_url,
            **{
                "external-shuffle.worker.tier-high-water": high_water,
                # Its restart below is not a loss: what it did not move stays its own.
                "external-shuffle.coordinator.worker-timeout": 60.0,
            },
        ) as cluster,
        scenario_on(cluster, **ONE_REPLICA) as scenario,
    ):
        descriptors, _ = scenario.produce(
            batches(), partitions=PARTITIONS, subpartitions=SUBPARTITIONS
        )
        for index in range(2):
            eventually(
                functools.partial(_within, cluster, index, high_water * 4 // 5),
                f"worker {index} is back under 80% of its high-water mark",
            )
        assert any(path.endswith("/data.arrow") for path in objects_under(tier_url))

        cluster.stop_worker(0)
        cluster.start_worker(0)  # finds its moved partitions beside its others
        assert rows_of(scenario.read(scenario.consumer, descriptors, ALL)) == list(range(ROWS))
        manifests = [path for path in objects_under(tier_url) if path.endswith("/manifest.json")]
        eventually(lambda: _on_tier(cluster) == len(manifests), "the workers count what moved")
