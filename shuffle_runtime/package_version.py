"""The installed pyshuffle's version, as the CLI, the daemons' log and their metrics say it."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

__all__ = ["package_version"]


def package_version() -> str:
    try:
        return version("pyshuffle")
    except PackageNotFoundError:
        return "unknown (not installed)"  # run from a source tree that was never installed
