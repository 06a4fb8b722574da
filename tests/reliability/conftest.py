"""Fixtures of the reliability tests: a raw stub of worker 0 of the module's ``cluster``."""

from __future__ import annotations

from collections.abc import Iterator

import grpc
import pytest

from external_shuffle.local_cluster import LocalCluster
from external_shuffle.wire.stubs import pb_grpc
from tests.reliability.raw_worker import BIG_CHANNEL


@pytest.fixture(scope="module")
def worker(cluster: LocalCluster) -> Iterator[pb_grpc.WorkerStub]:
    """Worker 0 of the module's ``cluster`` fixture, over a channel of large messages (calls
    add the token themselves, or leave it out on purpose)."""
    channel = grpc.insecure_channel(cluster.worker_target(0), options=BIG_CHANNEL)
    yield pb_grpc.WorkerStub(channel)
    channel.close()
