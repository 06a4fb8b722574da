"""A worker's side of its registration: register with what it holds, then heartbeats."""

from __future__ import annotations

import logging
import threading

import grpc

from external_shuffle.daemon.worker.service import WorkerService
from external_shuffle.wire.messages import key_of, partition_of
from external_shuffle.wire.stubs import pb, pb_grpc

__all__ = ["heartbeat_loop"]

logger = logging.getLogger(__name__)


def heartbeat_loop(
    service: WorkerService,
    coordinator: pb_grpc.CoordinatorStub,
    interval: float,
    stop: threading.Event,
    timeout: float,
    *,
    known: threading.Event,
) -> None:
    """Register with the coordinator, then send heartbeats, with what was committed since the
    last, until ``stop``; re-register when the coordinator forgot this worker, or a heartbeat
    missed commits. Partitions the coordinator calls obsolete are deleted. ``known`` is set
    while the coordinator knows this worker, as far as the last answer (or its absence) says."""
    registered = False
    ended_heard = 0  # of this coordinator's ended applications, since registering
    watch = service.state.watch_commits()
    while not stop.is_set():
        try:
            if not registered:
                watch.take()  # the list below holds these
                held = service.state.committed_partitions()
                response = coordinator.RegisterWorker(
                    pb.RegisterWorkerRequest(
                        worker=service.address.to_pb(),
                        load=service.state.load(),
                        committed=[key_of(p) for p in held],
                        committed_for=[service.state.owner(p) or "" for p in held],
                        on_tier=[key_of(p) for p in service.state.partitions_on_tier()],
                    ),
                    timeout=timeout,
                )
                obsolete = [partition_of(key) for key in response.obsolete]
                if obsolete:
                    logger.info("deleting %d partitions nobody tracks", len(obsolete))
                    service.state.release(obsolete)
                registered = True
                ended_heard = 0
                known.set()
                logger.info("registered with the coordinator", extra=_describe(service))
            else:
                # The load before the commits: a move it counts is among those taken after it.
                load = service.state.load()
                committed = watch.take()
                if committed is None:
                    registered = False  # more commits than a heartbeat tells: all again
                    continue
                beat = coordinator.WorkerHeartbeat(
                    pb.WorkerHeartbeatRequest(
                        worker_id=service.address.worker_id,
                        load=load,
                        committed=[commit.to_pb() for commit in committed],
                        ended_heard=ended_heard,
                    ),
                    timeout=timeout,
                )
                registered = beat.known
                service.state.ended.add(beat.ended_applications)
                ended_heard = beat.ended_heard
                if not registered:
                    known.clear()
                if beat.release:
                    service.state.release([partition_of(key) for key in beat.release])
        except grpc.RpcError as error:
            registered = False
            known.clear()
            logger.warning(
                "coordinator unreachable: %s",
                error.details() if isinstance(error, grpc.Call) else error,
            )
        stop.wait(interval)


def _describe(service: WorkerService) -> dict[str, object]:
    address = service.address
    return {"worker_id": address.worker_id, "target": address.target, "store": address.store_url}
