"""The ``pyshuffle`` command as a user runs it."""

from __future__ import annotations

import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

import pytest

from tests.pyshuffle_command import WITHOUT_PYSHUFFLE_VARIABLES
from tests.pyshuffle_command import pyshuffle as _pyshuffle

ROOT = Path(__file__).resolve().parents[2]


def test_demo_runs_the_pyspark_pipeline_and_verifies_it(tmp_path: Path) -> None:
    store = tmp_path / "store"
    result = _pyshuffle(
        "demo",
        "--rows",
        "20000",
        "--users",
        "500",
        "--verify",
        # 20,000 rows are under the size from which the switch takes a call: take them all
        env={
            "PYSHUFFLE_NETTY_LIKE_STORAGE_URL": str(store),
            "PYSHUFFLE_PYSPARK_SHUFFLE_DROPIN_MIN_INPUT_SIZE": "0",
        },
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "shuffle service: netty_like" in result.stdout
    checks = (
        "sessions",
        "segments",
        "categories",
        "global order",
        "sessions function once per event",
    )
    for check in checks:
        assert f"verified {check}: OK" in result.stdout
    assert "20,000 rows" in result.stdout  # the statistics of the sessions' group-apply
    assert "input: fused" in result.stdout  # the join reads the sessions' reduce tasks
    assert "the same functions through Spark's applyInArrow" in result.stdout
    # ... and that code again, unchanged, after enable(spark): each grouped map routed
    assert "that code unchanged, after enable(spark)" in result.stdout
    assert result.stdout.count("applyInArrow through pyshuffle") == 3
    assert "the sessions function ran on 20,000 events (1.00 times each)" in result.stdout
    assert list(store.iterdir()) == []  # the demo releases everything it wrote


def test_options_lists_core_and_implementation_keys() -> None:
    result = _pyshuffle("options")
    assert result.returncode == 0, result.stderr
    assert "shuffle-service-factory.class = 'netty_like'" in result.stdout
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


def test_version_prints_the_installed_version() -> None:
    result = _pyshuffle("--version")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"pyshuffle {version('pyshuffle')}"


def test_options_lists_the_keys_of_every_part() -> None:
    result = _pyshuffle("options")
    assert result.returncode == 0, result.stderr
    for key in (
        "external-shuffle.coordinator.address",  # clients of the external service
        "external-shuffle.worker.store-url",  # the daemon
        "pyspark-shuffle.reducer.target-size",
        "scheduling.skew.factor",
        "blob.store-url",
        "shuffle.host-config-file",
    ):
        assert f"\n{key} = " in result.stdout, key


def test_options_checks_the_daemons_own_config_file() -> None:
    # What deploy/README.md and the file's own header tell an operator to run.
    daemon_file = ROOT / "deploy" / "pyshuffle-daemon.toml"
    result = _pyshuffle("options", "--config", str(daemon_file), env=WITHOUT_PYSHUFFLE_VARIABLES)
    assert result.returncode == 0, result.stderr
    assert "valid for a daemon" in result.stdout
    assert "\nexternal-shuffle.worker.port = " in result.stdout


def test_options_refuses_a_file_that_mixes_the_roles(tmp_path: Path) -> None:
    mixed = tmp_path / "mixed.toml"
    mixed.write_text(
        '[external-shuffle.worker]\nport = 7000\n[netty-like]\nsort-buffer.size = "1m"\n'
    )
    result = _pyshuffle("options", "--config", str(mixed), env=WITHOUT_PYSHUFFLE_VARIABLES)
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    assert "sets client keys (netty-like.sort-buffer.size) beside daemon keys" in result.stderr


def test_options_says_a_daemons_file_is_not_a_clients(tmp_path: Path) -> None:
    daemon_file = ROOT / "deploy" / "pyshuffle-daemon.toml"
    result = _pyshuffle(
        "options", "--config", str(daemon_file), "--role", "client", env=WITHOUT_PYSHUFFLE_VARIABLES
    )
    assert result.returncode == 1
    assert "it is a daemon's configuration, not a client's" in result.stderr
    assert "did you mean" not in result.stderr


def _minimal_client_file(path: Path) -> Path:
    """What `pyshuffle admin --config` needs: the coordinator and the token, no factory."""
    path.write_text(
        '[external-shuffle.coordinator]\naddress = "127.0.0.1:9097"\n'
        '[external-shuffle.auth]\ntoken-file = "/run/pyshuffle/token"\n'
    )
    return path


def test_options_accepts_a_minimal_client_file_that_admin_reads(tmp_path: Path) -> None:
    client = _minimal_client_file(tmp_path / "client.toml")
    result = _pyshuffle("options", "--config", str(client), env=WITHOUT_PYSHUFFLE_VARIABLES)
    assert result.returncode == 0, result.stderr
    assert "valid for a client" in result.stdout
    assert "\nexternal-shuffle.coordinator.address = '127.0.0.1:9097'" in result.stdout
    # The default service reads neither key: a Spark application on it would refuse them.
    assert "not read by the configured service (netty_like)" in result.stdout
    assert "external-shuffle.auth.token-file, external-shuffle.coordinator.address\n" in (
        result.stdout
    )


def test_options_names_no_unread_key_when_the_file_chooses_their_service(tmp_path: Path) -> None:
    client = _minimal_client_file(tmp_path / "client.toml")
    client.write_text('shuffle-service-factory.class = "external_shuffle"\n' + client.read_text())
    result = _pyshuffle("options", "--config", str(client), env=WITHOUT_PYSHUFFLE_VARIABLES)
    assert result.returncode == 0, result.stderr
    assert "valid for a client" in result.stdout
    assert "not read by" not in result.stdout


def test_options_still_refuses_an_unknown_key_in_a_client_file(tmp_path: Path) -> None:
    client = _minimal_client_file(tmp_path / "client.toml")
    client.write_text(client.read_text().replace("address", "adress"))
    result = _pyshuffle("options", "--config", str(client), env=WITHOUT_PYSHUFFLE_VARIABLES)
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    assert "unknown config key 'external-shuffle.coordinator.adress'" in result.stderr
    assert "did you mean 'external-shuffle.coordinator.address'" in result.stderr


def _pyshuffle_without(module: str, *args: str) -> subprocess.CompletedProcess[str]:
    """``pyshuffle ARGS`` where ``module`` does not import, as without the extra that has it."""
    main = (
        f"import sys; sys.modules[{module!r}] = None;"
        " from shuffle_runtime.cli import main; sys.exit(main())"
    )
    return subprocess.run(
        [sys.executable, "-c", main, *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_demo_without_pyspark_says_to_install_the_spark_extra() -> None:
    result = _pyshuffle_without("pyspark", "demo")
    assert result.returncode == 1
    assert result.stderr == (
        "pyshuffle demo: pyspark is not installed: pip install 'pyshuffle[spark]'"
        " (in a source checkout: make demo)\n"
    )


@pytest.mark.parametrize("command", ["daemon", "admin"])
def test_the_daemon_and_admin_without_grpc_say_to_install_the_external_extra(
    command: str,
) -> None:
    result = _pyshuffle_without("grpc", command, "--help")
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    assert f"pyshuffle {command}: grpc is not installed: pip install 'pyshuffle[external]'" in (
        result.stderr
    )
