"""What installed packages plug into pyshuffle, found through their distributions' entry points.

The contract names no implementation: a package registers its parts under these groups in its
``pyproject.toml`` (``[project.entry-points."pyshuffle.services"]`` and so on), and pyshuffle
finds them by name, whichever distribution installed them:

- ``pyshuffle.services``: a service's :class:`~shuffle_api.factory.ShuffleServiceFactory`
  subclass, by the short name ``shuffle-service-factory.class`` accepts beside a class path;
- ``pyshuffle.descriptor_kinds``: a :class:`~shuffle_api.descriptors.ShuffleDescriptor`
  subclass, by its ``kind``, so that any process decodes the descriptors a service makes;
- ``pyshuffle.option_catalogs``: an :class:`OptionCatalog`, the keys a part reads;
- ``pyshuffle.commands``: a :class:`Command` of the ``pyshuffle`` command line;
- ``pyshuffle.local_deployments``: a service's
  :data:`~shuffle_api.testing.deployment.LocalDeploymentFactory`, by the service's name, for
  what runs its daemons on one host to break them (``pyshuffle chaos``).

Entry points are read from installed distributions' metadata, so a part found this way must be
installed (``pip install``), not only importable.
"""

from __future__ import annotations

import enum
import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from importlib.metadata import EntryPoint, entry_points
from typing import Any, Final

from shuffle_api.config import ConfigOption
from shuffle_api.errors import ConfigError

__all__ = [
    "COMMANDS",
    "DESCRIPTOR_KINDS",
    "LOCAL_DEPLOYMENTS",
    "OPTION_CATALOGS",
    "SERVICES",
    "Command",
    "OptionCatalog",
    "OptionRole",
    "described",
    "load_plugin",
    "plugins",
]

SERVICES: Final = "pyshuffle.services"
DESCRIPTOR_KINDS: Final = "pyshuffle.descriptor_kinds"
OPTION_CATALOGS: Final = "pyshuffle.option_catalogs"
COMMANDS: Final = "pyshuffle.commands"
LOCAL_DEPLOYMENTS: Final = "pyshuffle.local_deployments"


class OptionRole(enum.Enum):
    """Which processes read a catalog's keys."""

    SERVICE = "service"
    """A service's clients (a Spark application's processes, ``pyshuffle admin``) when that
    service is the configured one: its factory's ``config_options``."""
    ENGINE = "engine"
    """Every process of an engine's application, whichever service it runs on."""
    DAEMON = "daemon"
    """A ``pyshuffle daemon``."""


@dataclass(frozen=True, slots=True)
class OptionCatalog:
    """The keys one part reads, titled for ``pyshuffle options`` and the configuration page."""

    title: str
    role: OptionRole
    options: tuple[ConfigOption[Any], ...]


@dataclass(frozen=True, slots=True)
class Command:
    """A subcommand of ``pyshuffle``: its one-line summary and what runs it (given the
    arguments after its name; returns the exit status)."""

    summary: str
    run: Callable[[list[str]], int]


@functools.cache
def plugins(group: str) -> Mapping[str, EntryPoint]:
    """The entry points installed under ``group``, by name (read once per process)."""
    return {point.name: point for point in entry_points(group=group)}


def described(group: str) -> str:
    """``group``'s entry points as an error message lists them: ``name (module:attr)``."""
    found = plugins(group)
    if not found:
        return f"none installed (entry point group {group!r})"
    return ", ".join(f"{name} ({point.value})" for name, point in sorted(found.items()))


def load_plugin(group: str, name: str) -> Any:
    """What the entry point ``name`` of ``group`` refers to, imported on use; ConfigError
    where none is installed or it does not import."""
    point = plugins(group).get(name)
    if point is None:
        raise ConfigError(f"no {name!r} in entry point group {group!r}: {described(group)}")
    try:
        return point.load()
    except Exception as error:  # a module can fail to import with any error
        raise ConfigError(
            f"entry point {name!r} of {group!r} ({point.value}) does not load: {error}"
        ) from error
