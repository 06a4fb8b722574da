"""A service's daemons run as real processes on this host, for fault tests and chaos runs.

A service with daemons registers a :data:`LocalDeploymentFactory` under the entry point group
``pyshuffle.local_deployments`` (by the service's name); an embedded service has none. What
breaks a deployment (a chaos run, a test) names its daemons, takes them down and brings them
back through this interface alone, and asks what they still store.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Mapping
from pathlib import Path
from types import TracebackType
from typing import Self

__all__ = ["LocalDeployment", "LocalDeploymentFactory"]


class LocalDeployment(abc.ABC):
    """Running daemons of one service, each by name (``coordinator``, ``worker-0``, ...)."""

    @property
    @abc.abstractmethod
    def daemons(self) -> tuple[str, ...]:
        """Every daemon's name, whether it runs now or not."""

    @abc.abstractmethod
    def client_config(self, **extra: object) -> dict[str, object]:
        """The pyshuffle options of a client of these daemons, with ``extra``."""

    @abc.abstractmethod
    def start(self) -> Self:
        """Start every daemon and wait until each serves."""

    @abc.abstractmethod
    def stop(self) -> None:
        """Stop every daemon that runs (SIGTERM: each drains and exits)."""

    @abc.abstractmethod
    def kill(self, daemon: str) -> None:
        """SIGKILL ``daemon``: it dies without a word (what it stores stays)."""

    @abc.abstractmethod
    def terminate(self, daemon: str) -> int:
        """SIGTERM ``daemon`` and wait for it to exit; its exit status (0: a clean stop)."""

    @abc.abstractmethod
    def restart(self, daemon: str) -> None:
        """Start ``daemon``, which is down, and wait until it serves again."""

    @abc.abstractmethod
    def running(self, daemon: str) -> bool:
        """Whether ``daemon``'s process is alive."""

    @abc.abstractmethod
    def stored_files(self) -> list[str]:
        """Every partition file the daemons' stores hold."""

    @abc.abstractmethod
    def process_id(self, daemon: str) -> int | None:
        """``daemon``'s process id while it runs, else None."""

    @abc.abstractmethod
    def ports(self, daemon: str) -> tuple[int, ...]:
        """The TCP ports ``daemon`` serves on (on 127.0.0.1)."""

    @abc.abstractmethod
    def store_directories(self) -> dict[str, Path]:
        """Each daemon's store, by daemon, where it is a local directory (none otherwise)."""

    def __enter__(self) -> Self:
        try:
            return self.start()
        except BaseException:
            self.stop()  # what did start must not outlive the failure
            raise

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()


LocalDeploymentFactory = Callable[[Path, Mapping[str, object]], LocalDeployment]
"""Makes (does not start) a deployment whose configs, logs and stores live under the
directory; the mapping: the daemons' options, over the factory's defaults."""
