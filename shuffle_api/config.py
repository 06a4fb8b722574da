"""Typed configuration options (Flink-style keys) and their sources.

Sources, lowest precedence first: option defaults, a TOML file, environment variables with the
``PYSHUFFLE_`` prefix, an explicit mapping. Values are parsed when read or validated, so every
error names the key, the value and where the value came from.
"""

from __future__ import annotations

import dataclasses
import difflib
import os
import re
import tomllib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, TypeVar

from shuffle_api.errors import ConfigError

__all__ = [
    "ENV_PREFIX",
    "HOST_CONFIG_FILE",
    "ConfigOption",
    "Configuration",
    "bool_option",
    "choice_option",
    "float_option",
    "host_local",
    "int_option",
    "memory_option",
    "parse_memory_size",
    "str_option",
]

T = TypeVar("T")

ENV_PREFIX = "PYSHUFFLE_"
# The source recorded for explicit values. Explicit values (any source but a file) outrank
# the environment; values from a file do not.
MAPPING_SOURCE = "the given mapping"
_FILE_SOURCES = ("config file ", "host config file ")


@dataclass(frozen=True, slots=True)
class ConfigOption(Generic[T]):
    """A key with its type (``parse``), default and a one-line doc."""

    key: str
    default: T
    doc: str
    parse: Callable[[object], T] = field(repr=False, compare=False)
    type_name: str = "str"
    host_local: bool = False
    """Describes the host a process runs on (its store, address, memory): read where the
    process runs, from its own ``PYSHUFFLE_*`` variables first (see
    :meth:`Configuration.on_host`)."""

    @property
    def env_name(self) -> str:
        """The environment variable that sets this option."""
        return ENV_PREFIX + re.sub(r"[^A-Za-z0-9]", "_", self.key).upper()


def _parse_bool(value: object) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in ("true", "1", "yes", "on"):
        return True
    if isinstance(value, str) and value.strip().lower() in ("false", "0", "no", "off"):
        return False
    raise ValueError("expected true or false")


def _parse_int(value: object) -> int:
    if isinstance(value, bool):
        raise ValueError("expected an integer, not a boolean")
    if isinstance(value, int):
        return value
    if isinstance(value, str):
        return int(value.strip().replace("_", ""))
    raise ValueError("expected an integer")


def _parse_float(value: object) -> float:
    if isinstance(value, bool):
        raise ValueError("expected a number, not a boolean")
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, str):
        return float(value.strip())
    raise ValueError("expected a number")


def _parse_str(value: object) -> str:
    if isinstance(value, str):
        return value
    raise ValueError("expected a string")


_MEMORY_UNITS = {
    "": 1,
    "b": 1,
    "k": 1 << 10,
    "kb": 1 << 10,
    "kib": 1 << 10,
    "m": 1 << 20,
    "mb": 1 << 20,
    "mib": 1 << 20,
    "g": 1 << 30,
    "gb": 1 << 30,
    "gib": 1 << 30,
    "t": 1 << 40,
    "tb": 1 << 40,
    "tib": 1 << 40,
}


def parse_memory_size(value: object) -> int:
    """Bytes from an int or a string such as ``"64m"``, ``"64 MiB"``, ``"1g"`` (units of 1024)."""
    if isinstance(value, int) and not isinstance(value, bool):
        size = value
    elif isinstance(value, str):
        match = re.fullmatch(r"\s*(\d+)\s*([A-Za-z]*)\s*", value)
        if match is None or match.group(2).lower() not in _MEMORY_UNITS:
            raise ValueError("expected a memory size such as 65536, '64m' or '64 MiB'")
        size = int(match.group(1)) * _MEMORY_UNITS[match.group(2).lower()]
    else:
        raise ValueError("expected a memory size such as 65536, '64m' or '64 MiB'")
    if size < 0:
        raise ValueError("a memory size cannot be negative")
    return size


def _bounded(parse: Callable[[object], T], minimum: T | None) -> Callable[[object], T]:
    if minimum is None:
        return parse

    def parse_bounded(value: object) -> T:
        parsed = parse(value)
        if parsed < minimum:  # type: ignore[operator]
            raise ValueError(f"must be >= {minimum}")
        return parsed

    return parse_bounded


def int_option(
    key: str, default: int, doc: str, *, minimum: int | None = None
) -> ConfigOption[int]:
    return ConfigOption(key, default, doc, _bounded(_parse_int, minimum), "int")


def float_option(
    key: str, default: float, doc: str, *, minimum: float | None = None
) -> ConfigOption[float]:
    return ConfigOption(key, default, doc, _bounded(_parse_float, minimum), "float")


def str_option(key: str, default: str, doc: str) -> ConfigOption[str]:
    return ConfigOption(key, default, doc, _parse_str, "str")


def bool_option(key: str, default: bool, doc: str) -> ConfigOption[bool]:
    return ConfigOption(key, default, doc, _parse_bool, "bool")


def memory_option(
    key: str, default: int, doc: str, *, minimum: int | None = None
) -> ConfigOption[int]:
    return ConfigOption(key, default, doc, _bounded(parse_memory_size, minimum), "memory size")


def choice_option(key: str, default: str, doc: str, choices: Iterable[str]) -> ConfigOption[str]:
    allowed = tuple(choices)

    def parse_choice(value: object) -> str:
        text = _parse_str(value).strip().lower()
        if text not in allowed:
            raise ValueError("not one of the choices")  # the error names them
        return text

    return ConfigOption(key, default, doc, parse_choice, "one of " + "|".join(allowed))


def host_local(option: ConfigOption[T]) -> ConfigOption[T]:
    """``option``, marked as describing the host a process runs on."""
    return dataclasses.replace(option, host_local=True)


def _flatten(table: Mapping[str, Any], prefix: str = "") -> dict[str, object]:
    """TOML tables become dotted keys: ``[netty-like.network] credits = 4``."""
    flat: dict[str, object] = {}
    for key, value in table.items():
        dotted = f"{prefix}{key}"
        if isinstance(value, Mapping):
            flat.update(_flatten(value, dotted + "."))
        else:
            flat[dotted] = value
    return flat


def _read_toml(path: Path) -> dict[str, object]:
    """A TOML config file's values by dotted key."""
    try:
        with path.open("rb") as handle:
            table = tomllib.load(handle)
    except OSError as error:
        raise ConfigError(f"cannot read config file {path}: {error}") from error
    except tomllib.TOMLDecodeError as error:
        raise ConfigError(f"config file {path} is not valid TOML: {error}") from error
    return _flatten(table)


HOST_CONFIG_FILE = host_local(
    str_option(
        "shuffle.host-config-file",
        "",
        "A TOML file read on each host where an environment runs (an executor's): it sets"
        " host-local keys there, below the host's own PYSHUFFLE_* variables. Empty: none.",
    )
)


@dataclass(frozen=True, slots=True)
class Configuration:
    """Raw values by key, with the source of each; read through typed :class:`ConfigOption`."""

    values: Mapping[str, object] = field(default_factory=dict)
    sources: Mapping[str, str] = field(default_factory=dict)
    environment: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def load(
        cls,
        mapping: Mapping[str, object] | None = None,
        *,
        toml_file: str | Path | None = None,
        environ: Mapping[str, str] | None = None,
    ) -> Configuration:
        """Layer a TOML file, ``PYSHUFFLE_*`` environment variables and a mapping.

        ``environ`` defaults to ``os.environ``; pass ``{}`` to ignore the environment.
        """
        values: dict[str, object] = {}
        sources: dict[str, str] = {}
        if toml_file is not None:
            path = Path(toml_file)
            for key, value in _read_toml(path).items():
                values[key] = value
                sources[key] = f"config file {path}"
        env = os.environ if environ is None else environ
        prefixed = {name: value for name, value in env.items() if name.startswith(ENV_PREFIX)}
        for key, value in (mapping or {}).items():
            if not isinstance(key, str):
                raise ConfigError(f"config keys are strings, got {key!r}")
            values[key] = value
            sources[key] = MAPPING_SOURCE
        return cls(values, sources, prefixed)

    def with_values(
        self, mapping: Mapping[str, object], *, source: str = MAPPING_SOURCE
    ) -> Configuration:
        """A copy with ``mapping`` layered on top, explicit values from ``source`` (named in
        errors)."""
        values = {**self.values, **mapping}
        sources = {**self.sources, **dict.fromkeys(mapping, source)}
        return Configuration(values, sources, self.environment)

    def _raw(self, option: ConfigOption[Any]) -> tuple[object, str] | None:
        source = self.sources.get(option.key, "")
        if option.key in self.values and not source.startswith(_FILE_SOURCES):
            return self.values[option.key], source
        if option.env_name in self.environment:
            return self.environment[option.env_name], f"environment variable {option.env_name}"
        if option.key in self.values:
            return self.values[option.key], source
        return None

    def get(self, option: ConfigOption[T]) -> T:
        """The parsed value of ``option``, or its default when unset."""
        raw = self._raw(option)
        if raw is None:
            return option.default
        value, source = raw
        try:
            return option.parse(value)
        except (ValueError, TypeError) as error:
            raise ConfigError(
                f"config key {option.key!r} has invalid value {value!r} (from {source}):"
                f" {error}; expected {option.type_name}"
            ) from error

    def on_host(
        self, options: Iterable[ConfigOption[Any]], environ: Mapping[str, str] | None = None
    ) -> Configuration:
        """This configuration as read on the host where it is used (an executor's), given the
        options that may be set. A host-local option is set there, highest first, by that
        host's own ``PYSHUFFLE_*`` variable (``environ``, default ``os.environ``), then by the
        host's config file (:data:`HOST_CONFIG_FILE`), then as it was where the configuration
        was loaded (never by that host's variables: the driver's). Every other option reads
        as it did there; the host's file may not set one."""
        env = os.environ if environ is None else environ
        known = list(options)
        local_names = {option.env_name: option.key for option in known if option.host_local}
        set_here = {name: env[name] for name in local_names if name in env}
        from_file = self._host_file(known, env)
        overridden = {local_names[name] for name in set_here} | from_file.keys()
        values: dict[str, object] = {
            key: value for key, value in self.values.items() if key not in overridden
        }
        sources = {key: source for key, source in self.sources.items() if key in values}
        for key, (value, source) in from_file.items():
            values[key], sources[key] = value, source
        environment = {
            name: value for name, value in self.environment.items() if name not in local_names
        }
        return Configuration(values, sources, {**environment, **set_here})

    def _host_file(
        self, options: list[ConfigOption[Any]], env: Mapping[str, str]
    ) -> dict[str, tuple[object, str]]:
        """The host-local values, with their source, of the host's config file if it has one;
        a key there that is unknown or job-wide is a :class:`ConfigError`."""
        named = env.get(HOST_CONFIG_FILE.env_name)
        if named is None:
            raw = self.values.get(HOST_CONFIG_FILE.key, "")
            named = raw if isinstance(raw, str) else ""
        if not named:
            return {}
        path = Path(named)
        source = f"host config file {path}"
        by_key = {option.key: option for option in options}
        found: dict[str, tuple[object, str]] = {}
        problems: list[str] = []
        for key, value in _read_toml(path).items():
            option = by_key.get(key)
            if option is None:
                problems.append(self._unknown(key, source, set(by_key)))
            elif not option.host_local:
                problems.append(
                    f"config key {key!r} from {source} describes the job, not the host:"
                    " set it where the job is configured (the driver)"
                )
            else:
                found[key] = (value, source)
        if problems:
            raise ConfigError("; ".join(problems))
        return found

    def contains(self, option: ConfigOption[Any]) -> bool:
        return self._raw(option) is not None

    def validate(self, options: Iterable[ConfigOption[Any]]) -> None:
        """Raise :class:`ConfigError` for keys no option knows and values that do not parse."""
        known = list(options)
        keys = {option.key for option in known}
        env_names = {option.env_name for option in known}
        problems = [
            self._unknown(key, self.sources.get(key, ""), keys)
            for key in self.values
            if key not in keys
        ]
        problems += [
            self._unknown(name, "the environment", env_names)
            for name in self.environment
            if name not in env_names
        ]
        if problems:
            raise ConfigError("; ".join(problems))
        for option in known:
            self.get(option)

    @staticmethod
    def _unknown(key: str, source: str, known: set[str]) -> str:
        close = difflib.get_close_matches(key, sorted(known), n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        return f"unknown config key {key!r} from {source}{hint}"

    def to_dict(self) -> dict[str, object]:
        """The values set by a TOML file or a mapping (``PYSHUFFLE_*`` variables are not
        included: they are read where the configuration is used)."""
        return dict(self.values)
