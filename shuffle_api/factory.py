"""The factory (FLIP-31 ShuffleServiceFactory) and how it is loaded from configuration."""

from __future__ import annotations

import abc
import importlib
import secrets
import socket
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from shuffle_api.config import ConfigOption, Configuration
from shuffle_api.environment import ShuffleEnvironment
from shuffle_api.errors import ConfigError
from shuffle_api.ids import new_id, validate_id
from shuffle_api.master import ShuffleMaster
from shuffle_api.options import CORE_OPTIONS, SHUFFLE_SERVICE_FACTORY_CLASS
from shuffle_api.plugins import SERVICES, described, load_plugin, plugins

__all__ = [
    "ApplicationIdentity",
    "ShuffleEnvironmentContext",
    "ShuffleMasterContext",
    "ShuffleServiceFactory",
    "load_shuffle_service_factory",
]


def _raise(error: BaseException) -> None:
    raise error


def _new_secret() -> bytes:
    return secrets.token_bytes(32)


@dataclass(frozen=True, slots=True)
class ApplicationIdentity:
    """Who a master serves, as its engine names it (for operators: a shared service shows
    it beside its own id of the application): the engine's application id (Spark's
    ``applicationId``), the application's name and its user; empty where not known."""

    engine_id: str = ""
    name: str = ""
    user: str = ""


@dataclass(frozen=True, slots=True)
class ShuffleMasterContext:
    """What a master is created with. ``secret``: the application's, which its environments
    are given too; peers prove they hold it (a new one by default, which no other process
    knows). ``application``: who it serves."""

    configuration: Configuration
    on_fatal_error: Callable[[BaseException], None] = _raise
    secret: bytes = field(default_factory=_new_secret, repr=False)
    application: ApplicationIdentity = field(default_factory=ApplicationIdentity)


@dataclass(frozen=True, slots=True)
class ShuffleEnvironmentContext:
    """What an environment is created with: its config, identity and the host it serves on.

    ``secret``: the application's (as its master's context has it); peers of the
    environment's ports prove they hold it. ``executor_pid``: the long-lived process that
    hosts what this one produces (an engine's executor, as Flink's TaskExecutor), when this
    process may go away before its partitions are read; ``None``: this process hosts them.
    ``local_directory``: a directory on this host's own disk that the engine gives the
    executor (Spark's local directory), the default place for what it stores.
    """

    configuration: Configuration
    resource_id: str = field(default_factory=new_id)
    host: str = field(default_factory=socket.gethostname)
    secret: bytes = field(default_factory=_new_secret, repr=False)
    executor_pid: int | None = None
    local_directory: str | None = None

    def __post_init__(self) -> None:
        validate_id(self.resource_id, "resource id")


class ShuffleServiceFactory(abc.ABC):
    """Creates the master (driver) and the environments (executors) of one implementation.

    Loaded by class path with no arguments; everything else comes through the contexts.
    """

    @classmethod
    def config_options(cls) -> Sequence[ConfigOption[Any]]:
        """The options this implementation reads, beyond the core ones."""
        return ()

    @abc.abstractmethod
    def create_shuffle_master(self, context: ShuffleMasterContext) -> ShuffleMaster: ...

    @abc.abstractmethod
    def create_shuffle_environment(
        self, context: ShuffleEnvironmentContext
    ) -> ShuffleEnvironment: ...


def _factory_class(value: str) -> Any:
    """What ``value`` names: an installed service (by its entry point's name) or a class path."""
    key = SHUFFLE_SERVICE_FACTORY_CLASS.key
    if value in plugins(SERVICES):
        try:
            return load_plugin(SERVICES, value)
        except ConfigError as error:
            raise ConfigError(f"config key {key!r} has value {value!r}: {error}") from error
    module_name, separator, class_name = value.partition(":")
    if not separator:
        module_name, _, class_name = value.rpartition(".")
    if not module_name or not class_name:
        raise ConfigError(
            f"config key {key!r} has value {value!r}, which is neither an installed service nor"
            f" a class path (pkg.mod.Class or pkg.mod:Class); installed services:"
            f" {described(SERVICES)}"
        )
    try:
        module = importlib.import_module(module_name)
    except Exception as error:  # a module can fail to import with any error
        raise ConfigError(
            f"config key {key!r} has value {value!r}: module {module_name!r} does not import"
            f" ({error}); installed services: {described(SERVICES)}"
        ) from error
    return getattr(module, class_name, None)


def load_shuffle_service_factory(
    configuration: Configuration, *, extra_options: Sequence[ConfigOption[Any]] = ()
) -> ShuffleServiceFactory:
    """Instantiate the factory named by ``shuffle-service-factory.class`` (an installed service's
    name, or a class path) and validate the configuration against the core options, the
    factory's own and ``extra_options`` (those of the engine integration that loads it)."""
    key = SHUFFLE_SERVICE_FACTORY_CLASS.key
    value = configuration.get(SHUFFLE_SERVICE_FACTORY_CLASS).strip()
    cls = _factory_class(value)
    if not (isinstance(cls, type) and issubclass(cls, ShuffleServiceFactory)):
        raise ConfigError(
            f"config key {key!r} has value {value!r}, which names {cls!r}, not a"
            f" ShuffleServiceFactory; installed services: {described(SERVICES)}"
        )
    try:
        factory = cls()
    except Exception as error:
        raise ConfigError(
            f"config key {key!r} has value {value!r}: creating the factory failed: {error}"
        ) from error
    configuration.validate([*CORE_OPTIONS, *cls.config_options(), *extra_options])
    return factory
