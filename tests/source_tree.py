"""This checkout's sources as a build reads them, copied away from the working tree (a build
in place would leave ``build/`` and ``*.egg-info`` behind, which later builds pick up)."""

from __future__ import annotations

import shutil
from pathlib import Path

__all__ = ["ROOT", "copy_source"]

ROOT = Path(__file__).resolve().parents[1]


def copy_source(destination: Path) -> Path:
    """Copy what pip builds pyshuffle from (no tests, docs, deploy files, benchmarks, hidden or
    build leftovers) to ``destination``; returns it."""
    shutil.copytree(
        ROOT,
        destination,
        ignore=shutil.ignore_patterns(
            ".*", "*.egg-info", "build", "__pycache__", "tests", "benchmarks", "docs", "deploy"
        ),
    )
    return destination
