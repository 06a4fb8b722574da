"""A client's coordinators: one or several side by side, any of which may be down or restarting.

Calls that read or place go to the first coordinator that answers (the last one that did is
tried first) and are retried with backoff while none answers, up to
``external-shuffle.client.retry-timeout``: a coordinator restarting is ridden through. Calls
that inform (an application's registration, releases) go to each coordinator.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

import grpc

from external_shuffle.wire.channels import ChannelPool, translate_rpc_error
from external_shuffle.wire.messages import partition_of
from external_shuffle.wire.stubs import pb, pb_grpc
from shuffle_api import ShuffleError, TransportError

__all__ = ["Answer", "Coordinators"]

logger = logging.getLogger(__name__)

R = TypeVar("R")

# A coordinator that does not answer now may answer after a restart: these codes are retried.
_RETRIED = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED})
_FIRST_BACKOFF = 0.1
# After this long without an answer the wait is said at WARNING, naming the coordinators tried:
# a restart is over by then, a wrong address or a network cut is not.
_SILENCE_WARNING_SECONDS = 3.0
_MAX_BACKOFF = 2.0


def _retried(error: grpc.RpcError) -> bool:
    return isinstance(error, grpc.Call) and error.code() in _RETRIED


@dataclass(frozen=True, slots=True)
class Answer(Generic[R]):
    """One coordinator's answer to a call sent to each: its result, or the error it gave."""

    address: str
    result: R | None
    error: ShuffleError | None


class Coordinators:
    """Calls to the coordinators at ``addresses`` over ``channels``."""

    def __init__(
        self,
        addresses: tuple[str, ...],
        channels: ChannelPool,
        *,
        retry_timeout: float,
    ) -> None:
        self.addresses = addresses
        self._channels = channels
        self._retry_timeout = retry_timeout
        self._preferred = 0
        self._lock = threading.Lock()

    @property
    def timeout(self) -> float:
        """Seconds one call to one coordinator may take."""
        return self._channels.settings.timeout

    def stub(self, address: str) -> pb_grpc.CoordinatorStub:
        return pb_grpc.CoordinatorStub(self._channels.get(address))

    def first(self, what: str, call: Callable[[str], R]) -> R:
        """``call`` (given a coordinator's address) on the first coordinator that answers;
        while none does, again with backoff until the retry timeout. An answer that is an error
        is raised as its ShuffleError."""
        started = time.monotonic()
        deadline = started + self._retry_timeout
        backoff = _FIRST_BACKOFF
        warned = False
        while True:
            with self._lock:
                start = self._preferred
            order = self.addresses[start:] + self.addresses[:start]
            last_error: grpc.RpcError | None = None
            for address in order:
                try:
                    result = call(address)
                except grpc.RpcError as error:
                    if not _retried(error):
                        where = f"{what} on coordinator {address}"
                        raise translate_rpc_error(error, where) from error
                    last_error = error
                    continue
                with self._lock:
                    self._preferred = self.addresses.index(address)
                return result
            assert last_error is not None  # every coordinator was tried and failed
            failed = translate_rpc_error(
                last_error, f"{what} on coordinators {', '.join(self.addresses)}"
            )
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TransportError(
                    f"{failed} (gave up after retrying for {self._retry_timeout} s)"
                ) from last_error
            if not warned and time.monotonic() - started >= _SILENCE_WARNING_SECONDS:
                warned = True
                logger.warning(
                    "no coordinator answers: %s; retrying for %.0f s more", failed, remaining
                )
            else:
                logger.info("no coordinator answers %s; retrying in %.1f s", what, backoff)
            time.sleep(min(backoff, remaining))
            backoff = min(backoff * 2, _MAX_BACKOFF)

    def each(self, what: str, call: Callable[[str], R]) -> list[Answer[R]]:
        """``call`` once on every coordinator; each answer or error, in address order."""
        answers: list[Answer[R]] = []
        for address in self.addresses:
            try:
                answers.append(Answer(address, call(address), None))
            except grpc.RpcError as error:
                translated = translate_rpc_error(error, f"{what} on coordinator {address}")
                answers.append(Answer(address, None, translated))
        return answers

    def announce(
        self, request: pb.RegisterPartitionRequest, location: pb.PartitionLocation
    ) -> tuple[pb.RegisterPartitionRequest, list[str]]:
        """``request`` with the place one coordinator gave it, and the coordinators that could
        not be told it: with several, each is told, so that any of them may answer for the
        partition."""
        placed = pb.RegisterPartitionRequest()
        placed.CopyFrom(request)
        placed.placed_on.extend(location.replicas)
        if len(self.addresses) == 1:
            return placed, []
        partition = partition_of(request.partition)
        missed = []
        for answer in self.each(
            f"telling where {partition} is",
            lambda address: self.stub(address).RegisterPartition(placed, timeout=self.timeout),
        ):
            if answer.error is not None:
                logger.info("%s", answer.error)
                missed.append(answer.address)
        return placed, missed
