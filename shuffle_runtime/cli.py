"""The ``pyshuffle`` command. Subcommands are imported on use, by dotted path, so this module
imports no implementation (``pyshuffle daemon`` and the PySpark demo arrive with their packages)."""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Callable, Iterable, Sequence
from importlib.metadata import PackageNotFoundError, version
from typing import Any, Final

from shuffle_api.config import ConfigOption, Configuration
from shuffle_api.errors import ConfigError, ShuffleError
from shuffle_api.factory import load_shuffle_service_factory
from shuffle_api.options import CORE_OPTIONS, SHUFFLE_SERVICE_FACTORY_CLASS

__all__ = ["main"]

SUBCOMMANDS: Final[dict[str, tuple[str, str]]] = {
    "demo": (
        "pyspark_shuffle.demo:main",
        "run the PySpark demo pipeline on the configured shuffle service",
    ),
    "daemon": (
        "external_shuffle.daemon.main:main",
        "run the external shuffle service (coordinator, worker or both; needs pyshuffle[external])",
    ),
    "admin": (
        "external_shuffle.ops.admin:main",
        "an external shuffle cluster's workers and applications; decommission a worker",
    ),
    "options": (
        "shuffle_runtime.cli:print_options",
        "list every configuration key, or check a config file for its role (--config)",
    ),
}

# The modules only an extra installs, by extra, and the command that sets up a source checkout
# with it: a subcommand that misses one says what to install, not ModuleNotFoundError.
EXTRAS: Final[dict[str, tuple[frozenset[str], str]]] = {
    "spark": (frozenset({"pyspark", "pandas"}), "make demo"),
    "external": (frozenset({"grpc", "grpc_health", "prometheus_client"}), "make setup"),
}

CLIENT: Final = "client"
DAEMON: Final = "daemon"
PYSPARK_OPTIONS: Final = "pyspark_shuffle.options:PYSPARK_SHUFFLE_OPTIONS"
DAEMON_OPTIONS: Final = "external_shuffle.options:DAEMON_OPTIONS"

# Every part's options by dotted path (imported on use, as the subcommands are), with the
# role they configure: a Spark application's processes ("client") or a `pyshuffle daemon`.
OPTION_CATALOGS: Final[tuple[tuple[str, str, str], ...]] = (
    ("default service (netty_like)", "netty_like.options:NETTY_OPTIONS", CLIENT),
    ("external service, clients", "external_shuffle.options:CLIENT_OPTIONS", CLIENT),
    ("PySpark, scheduling, blob", PYSPARK_OPTIONS, CLIENT),
    ("external service, daemon", DAEMON_OPTIONS, DAEMON),
)


def catalog(target: str) -> tuple[ConfigOption[Any], ...]:
    """The options at ``target`` ("module:NAME"); a part not installed has none."""
    module_name, _, name = target.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError:
        return ()
    options: tuple[ConfigOption[Any], ...] = getattr(module, name)
    return options


def _print_part(title: str, options: Sequence[ConfigOption[Any]], config: Configuration) -> None:
    print(f"# {title}")
    for option in options:
        print(
            f"{option.key} = {config.get(option)!r}  ({option.type_name}; env {option.env_name}"
            f"{'; host-local' if option.host_local else ''})\n    {option.doc}"
        )
    print()


def _unique(options: Iterable[ConfigOption[Any]]) -> tuple[ConfigOption[Any], ...]:
    """``options`` with each key once, in first-seen order."""
    return tuple({option.key: option for option in options}.values())


def _client_options() -> tuple[ConfigOption[Any], ...]:
    """Every option a client reads (a Spark application's processes on any installed
    implementation, or ``pyshuffle admin``), each key once."""
    return _unique(
        option
        for _, target, role in OPTION_CATALOGS
        if role == CLIENT
        for option in catalog(target)
    )


def _role_of(configuration: Configuration) -> str:
    """A daemon's file sets a key only daemons read; anything else is a client's."""
    client_keys = {option.key for option in _client_options()}
    daemon_only = {option.key for option in catalog(DAEMON_OPTIONS)} - client_keys
    return DAEMON if daemon_only & set(configuration.values) else CLIENT


def print_options(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="pyshuffle options",
        description="List every configuration key: its value, type, environment variable and"
        " doc. With --config, check a TOML file for the role it is for (a Spark"
        " application's, or a daemon's when it sets a key only daemons read; or as --role"
        " says) and list that role's keys with the values the file and the environment give.",
    )
    parser.add_argument("--config", metavar="FILE", help="a TOML config file to check")
    parser.add_argument("--role", choices=(CLIENT, DAEMON), help="the role the file is for")
    args = parser.parse_args(argv)
    configuration = Configuration.load(toml_file=args.config)
    role = args.role or _role_of(configuration)
    unread: list[str] = []
    if role == DAEMON:
        daemon = catalog(DAEMON_OPTIONS)
        if not daemon:
            raise ConfigError("the daemon is not installed: pip install 'pyshuffle[external]'")
        known = (*CORE_OPTIONS, *daemon)
        configuration.validate(known)
    else:
        # A client's file may be for any installed implementation or for `pyshuffle admin`
        # (which reads the external service's client keys whatever the factory): all their
        # keys are valid. Those the configured service does not read are named: a Spark
        # application on that service refuses them.
        client = _client_options()
        factory = load_shuffle_service_factory(configuration, extra_options=client)
        service = (*CORE_OPTIONS, *factory.config_options(), *catalog(PYSPARK_OPTIONS))
        known = _unique((*service, *client))
        unread = sorted(set(configuration.values) - {option.key for option in service})
    if args.config is None and args.role is None:  # every part, as this environment sets it
        _print_part("the contract", CORE_OPTIONS, configuration)
        for title, target, _ in OPTION_CATALOGS:
            options = catalog(target)
            if options:
                _print_part(title, options, configuration)
            else:
                print(f"# {title}: not installed\n")
        return 0
    print(f"# {args.config or 'the environment'}: valid for a {role}\n")
    if unread:
        print(
            f"# not read by the configured service"
            f" ({configuration.get(SHUFFLE_SERVICE_FACTORY_CLASS)}), so a Spark application"
            f" on it refuses them; `pyshuffle admin` or another implementation reads them:"
            f" {', '.join(unread)}\n"
        )
    _print_part(f"{role} options", known, configuration)
    return 0


def _version() -> str:
    try:
        return version("pyshuffle")
    except PackageNotFoundError:  # run from a source tree that was never installed
        return "unknown (not installed)"


def _load(target: str) -> Callable[[list[str]], int]:
    module_name, _, function_name = target.partition(":")
    function: Callable[[list[str]], int] = getattr(
        importlib.import_module(module_name), function_name
    )
    return function


def _missing_extra(error: ModuleNotFoundError) -> str | None:
    """What to install for the module ``error`` misses, if an extra installs it."""
    root = (error.name or "").partition(".")[0]
    for extra, (modules, make_target) in EXTRAS.items():
        if root in modules:
            return (
                f"{root} is not installed: pip install 'pyshuffle[{extra}]'"
                f" (in a source checkout: {make_target})"
            )
    return None


def main(argv: list[str] | None = None) -> int:
    arguments = sys.argv[1:] if argv is None else argv
    if arguments and arguments[0] in ("-V", "--version"):
        print(f"pyshuffle {_version()}")
        return 0
    if not arguments or arguments[0] in ("-h", "--help") or arguments[0] not in SUBCOMMANDS:
        print("usage: pyshuffle [--version] COMMAND [options]\n\ncommands:")
        for name, (_, summary) in SUBCOMMANDS.items():
            print(f"  {name:<10} {summary}")
        return 0 if arguments and arguments[0] in ("-h", "--help") else 2
    try:
        return _load(SUBCOMMANDS[arguments[0]][0])(arguments[1:])
    except ShuffleError as error:
        print(f"pyshuffle {arguments[0]}: {type(error).__name__}: {error}", file=sys.stderr)
        return 1
    except ModuleNotFoundError as error:
        missing = _missing_extra(error)
        if missing is None:
            raise
        print(f"pyshuffle {arguments[0]}: {missing}", file=sys.stderr)
        return 1
    except BrokenPipeError:  # the reader left (`pyshuffle options | head`): not an error
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - Python flushes stdout at exit
        return 0


if __name__ == "__main__":
    sys.exit(main())
