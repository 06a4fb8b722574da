"""The ``pyshuffle`` command as a user runs it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


def _pyshuffle(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; from shuffle_api.cli import main; sys.exit(main())",
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, **(env or {})},
        check=False,
    )


def test_demo_runs_the_pyspark_pipeline_and_verifies_it(tmp_path: Path) -> None:
    store = tmp_path / "store"
    result = _pyshuffle(
        "demo",
        "--rows",
        "20000",
        "--users",
        "500",
        "--verify",
        env={"PYSHUFFLE_NETTY_LIKE_STORAGE_URL": str(store)},
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "shuffle service: netty_like.NettyShuffleServiceFactory" in result.stdout
    for check in ("sessions", "segments", "categories", "global order"):
        assert f"verified {check}: OK" in result.stdout
    assert "20,000 rows" in result.stdout  # the statistics of the sessions' group-apply
    assert list(store.iterdir()) == []  # the demo releases everything it wrote


def test_options_lists_core_and_implementation_keys() -> None:
    result = _pyshuffle("options")
    assert result.returncode == 0, result.stderr
    assert (
        "shuffle-service-factory.class = 'netty_like.NettyShuffleServiceFactory'" in result.stdout
    )
    assert "netty-like.sort-buffer.size" in result.stdout
    assert "PYSHUFFLE_NETTY_LIKE_SORT_BUFFER_SIZE" in result.stdout


def test_bad_factory_class_is_a_clear_error_not_a_traceback() -> None:
    result = _pyshuffle(
        "options", env={"PYSHUFFLE_SHUFFLE_SERVICE_FACTORY_CLASS": "nowhere.Factory"}
    )
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    assert "shuffle-service-factory.class" in result.stderr
    assert "nowhere.Factory" in result.stderr
    assert "netty_like" in result.stderr


def test_unknown_command_prints_usage() -> None:
    result = _pyshuffle("frobnicate")
    assert result.returncode == 2
    assert "demo" in result.stdout
