"""The ``pyshuffle`` command. Subcommands are imported on use, by dotted path, so this module
imports no implementation (``pyshuffle daemon`` and the PySpark demo arrive with their packages)."""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable
from typing import Final

from shuffle_api.config import Configuration
from shuffle_api.errors import ShuffleError
from shuffle_api.factory import load_shuffle_service_factory
from shuffle_api.options import CORE_OPTIONS

__all__ = ["main"]

SUBCOMMANDS: Final[dict[str, tuple[str, str]]] = {
    "demo": (
        "pyspark_shuffle.demo:main",
        "run the PySpark demo pipeline on the configured shuffle service",
    ),
    "daemon": (
        "external_shuffle.daemon:main",
        "run the external shuffle service (coordinator, worker or both; needs pyshuffle[external])",
    ),
    "options": ("shuffle_api.cli:print_options", "list the configuration options and defaults"),
}


def print_options(argv: list[str] | None = None) -> int:
    """Print every option of the core and of the configured factory."""
    parser = argparse.ArgumentParser(prog="pyshuffle options", description=print_options.__doc__)
    parser.add_argument("--config", help="TOML config file")
    args = parser.parse_args(argv)
    configuration = Configuration.load(toml_file=args.config)
    factory = load_shuffle_service_factory(configuration)
    for option in (*CORE_OPTIONS, *factory.config_options()):
        print(
            f"{option.key} = {configuration.get(option)!r}  ({option.type_name};"
            f" env {option.env_name})\n    {option.doc}"
        )
    return 0


def _load(target: str) -> Callable[[list[str]], int]:
    module_name, _, function_name = target.partition(":")
    function: Callable[[list[str]], int] = getattr(
        importlib.import_module(module_name), function_name
    )
    return function


def main(argv: list[str] | None = None) -> int:
    arguments = sys.argv[1:] if argv is None else argv
    if not arguments or arguments[0] in ("-h", "--help") or arguments[0] not in SUBCOMMANDS:
        print("usage: pyshuffle COMMAND [options]\n\ncommands:")
        for name, (_, summary) in SUBCOMMANDS.items():
            print(f"  {name:<10} {summary}")
        return 0 if arguments and arguments[0] in ("-h", "--help") else 2
    try:
        return _load(SUBCOMMANDS[arguments[0]][0])(arguments[1:])
    except ShuffleError as error:
        print(f"pyshuffle {arguments[0]}: {type(error).__name__}: {error}", file=sys.stderr)
        return 1
