"""The ``pyshuffle`` command. Subcommands and option catalogs are what installed packages register
(entry point groups ``pyshuffle.commands`` and ``pyshuffle.option_catalogs``), imported on use,
so this module imports no implementation (``pyshuffle daemon`` and the PySpark demo arrive with
their packages)."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Iterable, Sequence
from typing import Any, Final

from shuffle_api.config import ConfigOption, Configuration
from shuffle_api.errors import ConfigError, ShuffleError
from shuffle_api.factory import load_shuffle_service_factory
from shuffle_api.options import CORE_OPTIONS, SHUFFLE_SERVICE_FACTORY_CLASS
from shuffle_api.plugins import (
    COMMANDS,
    OPTION_CATALOGS,
    Command,
    OptionCatalog,
    OptionRole,
    load_plugin,
    plugins,
)
from shuffle_runtime.package_version import package_version

__all__ = [
    "CLIENT",
    "DAEMON",
    "OPTIONS_COMMAND",
    "catalogs",
    "client_options",
    "main",
    "options_of",
    "print_options",
    "validate_for_role",
]

# The modules only an extra installs, by extra, and the command that sets up a source checkout
# with it: a subcommand that misses one says what to install, not ModuleNotFoundError.
EXTRAS: Final[dict[str, tuple[frozenset[str], str]]] = {
    "spark": (frozenset({"pyspark", "pandas"}), "make demo"),
    "external": (frozenset({"grpc", "grpc_health", "prometheus_client"}), "make setup"),
}

CLIENT: Final = "client"
DAEMON: Final = "daemon"
# A config file's role -> the catalogs whose keys it may set.
ROLES: Final[dict[str, frozenset[OptionRole]]] = {
    CLIENT: frozenset({OptionRole.SERVICE, OptionRole.ENGINE}),
    DAEMON: frozenset({OptionRole.DAEMON}),
}


def _catalog(name: str) -> OptionCatalog | None:
    """The installed catalog ``name``; ``None`` where its part's extra is missing."""
    try:
        catalog: OptionCatalog = load_plugin(OPTION_CATALOGS, name)
    except ConfigError as error:
        if isinstance(error.__cause__, ImportError):
            return None
        raise
    return catalog


def catalogs() -> list[OptionCatalog]:
    """Every installed part's options (entry point group ``pyshuffle.option_catalogs``), by
    role (services' clients, engines, daemons) and title; a part whose extra is missing has
    none."""
    found = [catalog for name in plugins(OPTION_CATALOGS) if (catalog := _catalog(name))]
    order = list(OptionRole)
    return sorted(found, key=lambda catalog: (order.index(catalog.role), catalog.title))


def options_of(*roles: OptionRole) -> tuple[ConfigOption[Any], ...]:
    """The options of every installed catalog of ``roles``, each key once."""
    return _unique(
        option for catalog in catalogs() if catalog.role in roles for option in catalog.options
    )


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


def _role_of(configuration: Configuration) -> str:
    """A daemon's file sets a key only daemons read; anything else is a client's."""
    client_keys = {option.key for option in options_of(*ROLES[CLIENT])}
    daemon_only = {option.key for option in options_of(*ROLES[DAEMON])} - client_keys
    return DAEMON if daemon_only & set(configuration.values) else CLIENT


def validate_for_role(
    configuration: Configuration, role: str, known: Sequence[ConfigOption[Any]]
) -> None:
    """ConfigError for a key of ``configuration``'s file that ``known`` (``role``'s options)
    does not hold: when it is the other role's, that the file is for the other role (not a
    did-you-mean for each of its keys); otherwise the key with the closest known one. A
    ``PYSHUFFLE_*`` variable may name either role's key."""
    other = DAEMON if role == CLIENT else CLIENT
    keys = {option.key for option in known}
    other_options = options_of(*ROLES[other])
    other_keys = {option.key for option in other_options}
    misplaced = sorted((other_keys - keys) & set(configuration.values))
    if misplaced:
        source = configuration.sources.get(misplaced[0], "the configuration")
        own = (set(configuration.values) & keys) - other_keys
        named = ", ".join(misplaced[:3]) + (
            f" and {len(misplaced) - 3} more" if len(misplaced) > 3 else ""
        )
        raise ConfigError(
            f"{source} sets {other} keys ({named})"
            + (
                f" beside {role} keys: give each its own file"
                if own
                else f": it is a {other}'s configuration, not a {role}'s"
            )
        )
    # A file is one role's, but an environment may be shared by both (a daemon's container,
    # where an operator runs `pyshuffle admin`): there a key of either role is no mistake.
    configuration.validate(_unique((*known, *other_options)))


def client_options() -> tuple[ConfigOption[Any], ...]:
    """Every key a client's file may set: the contract's and each installed client part's
    (any implementation's, an engine's, ``pyshuffle admin``'s)."""
    return _unique((*CORE_OPTIONS, *options_of(*ROLES[CLIENT])))


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
        daemon = options_of(*ROLES[DAEMON])
        if not daemon:
            raise ConfigError("the daemon is not installed: pip install 'pyshuffle[external]'")
        known = (*CORE_OPTIONS, *daemon)
        validate_for_role(configuration, DAEMON, known)
    else:
        # A client's file may be for any installed implementation or for `pyshuffle admin`
        # (which reads the external service's client keys whatever the factory): all their
        # keys are valid. Those the configured service does not read are named: a Spark
        # application on that service refuses them.
        client = options_of(*ROLES[CLIENT])
        validate_for_role(configuration, CLIENT, client_options())
        factory = load_shuffle_service_factory(configuration, extra_options=client)
        service = (*CORE_OPTIONS, *factory.config_options(), *options_of(OptionRole.ENGINE))
        known = _unique((*service, *client))
        unread = sorted(set(configuration.values) - {option.key for option in service})
    if args.config is None and args.role is None:  # every part, as this environment sets it
        _print_part("the contract", CORE_OPTIONS, configuration)
        for catalog in catalogs():
            _print_part(catalog.title, catalog.options, configuration)
        for name in sorted(plugins(OPTION_CATALOGS)):
            if _catalog(name) is None:
                print(f"# {name}: not installed\n")
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


def _command(name: str) -> Command:
    """The installed subcommand ``name``; the ModuleNotFoundError of a missing extra as is."""
    try:
        command: Command = load_plugin(COMMANDS, name)
    except ConfigError as error:
        if isinstance(error.__cause__, ModuleNotFoundError):
            raise error.__cause__ from None
        raise
    return command


def _print_usage() -> None:
    print("usage: pyshuffle [--version] COMMAND [options]\n\ncommands:")
    for name in sorted(plugins(COMMANDS)):
        try:
            summary = _command(name).summary
        except ModuleNotFoundError as error:  # its extra is not installed
            summary = _missing_extra(error) or str(error)
        print(f"  {name:<10} {summary}")


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
        print(f"pyshuffle {package_version()}")
        return 0
    if not arguments or arguments[0] in ("-h", "--help") or arguments[0] not in plugins(COMMANDS):
        _print_usage()
        return 0 if arguments and arguments[0] in ("-h", "--help") else 2
    try:
        return _command(arguments[0]).run(arguments[1:])
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


OPTIONS_COMMAND = Command(
    "list every configuration key, or check a config file for its role (--config)", print_options
)
