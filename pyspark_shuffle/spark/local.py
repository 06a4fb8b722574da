"""A local Spark session ready for pyshuffle (the demo, tests and benchmarks use it), classic
or through a Spark Connect server of its own, and the Java check that says what to install
instead of failing deep inside Spark.

``python -m pyspark_shuffle.spark.local`` checks Java and exits non-zero with advice.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Final

import pyspark
from pyspark.sql import SparkSession

from shuffle_api import ConfigError
from shuffle_runtime.ports import free_ports

__all__ = [
    "MINIMUM_JAVA",
    "executor_pids",
    "java_version",
    "local_cluster_session",
    "local_connect_server",
    "local_spark_session",
    "python_worker_pids",
    "require_java",
    "wait_for_two_executors",
]

_CONNECT_SERVER_CLASS: Final = "org.apache.spark.sql.connect.service.SparkConnectServer"
_CONNECT_START_SECONDS: Final = 180.0

MINIMUM_JAVA: Final = 17

_INSTALL_JAVA = (
    f"PySpark needs Java {MINIMUM_JAVA} or newer. Install it (Debian/Ubuntu: sudo apt-get install"
    f" openjdk-{MINIMUM_JAVA}-jre-headless; macOS: brew install openjdk@{MINIMUM_JAVA}) and put"
    " its java on PATH or set JAVA_HOME."
)


def _java_executable() -> str | None:
    home = os.environ.get("JAVA_HOME")
    if home and (Path(home) / "bin" / "java").exists():
        return str(Path(home) / "bin" / "java")
    return shutil.which("java")


def java_version() -> int | None:
    """The major version of the java Spark will start, or ``None`` if there is none."""
    java = _java_executable()
    if java is None:
        return None
    try:
        shown = subprocess.run(
            [java, "-version"], capture_output=True, text=True, timeout=60, check=False
        ).stderr
    except (OSError, subprocess.TimeoutExpired):
        return None
    match = re.search(r'version "(\d+)(?:\.(\d+))?', shown)
    if match is None:
        return None
    major = int(match.group(1))
    # Java 8 and older call themselves 1.x.
    return int(match.group(2) or 0) if major == 1 else major


def require_java() -> None:
    """Raise :class:`ConfigError` with install advice unless Java >= 17 is there."""
    version = java_version()
    if version is None:
        raise ConfigError(f"no Java found. {_INSTALL_JAVA}")
    if version < MINIMUM_JAVA:
        raise ConfigError(f"found Java {version}. {_INSTALL_JAVA}")


def local_spark_session(
    app_name: str,
    *,
    cores: int = 2,
    max_task_failures: int = 1,
    driver_memory: str = "2g",
    conf: Mapping[str, str] | None = None,
) -> SparkSession:
    """A ``local[cores, max_task_failures]`` session whose Python workers run this
    interpreter, with quiet logs (``max_task_failures`` > 1: failed tasks are retried)."""
    require_java()
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    builder = (
        SparkSession.builder.master(f"local[{cores},{max_task_failures}]")
        .appName(app_name)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.driver.memory", driver_memory)
        .config("spark.sql.shuffle.partitions", str(cores * 4))
    )
    for key, value in (conf or {}).items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    return session


def local_cluster_session(
    app_name: str, work: Path, conf: Mapping[str, str] | None = None
) -> SparkSession:
    """A ``local-cluster[2,1,1024]`` session: two executor JVMs, as two hosts, each with its
    own local directory under ``work / "local"`` (so its own store); their Python workers run
    this interpreter with this one's path."""
    require_java()
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    builder = (
        SparkSession.builder.master("local-cluster[2,1,1024]")
        .appName(app_name)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.local.dir", str(work / "local"))
        .config("spark.executorEnv.TMPDIR", str(work / "executor-tmp"))
        .config("spark.sql.shuffle.partitions", "4")
        .config("spark.task.maxFailures", "4")
        .config("spark.executorEnv.PYTHONPATH", os.pathsep.join(sys.path))
    )
    for key, value in (conf or {}).items():
        builder = builder.config(key, value)
    for name, value in os.environ.items():
        if name.startswith("AWS_"):  # an object store's endpoint and keys, as on a cluster
            builder = builder.config(f"spark.executorEnv.{name}", value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    return session


def _command_lines() -> Iterator[tuple[int, list[str]]]:
    """Each process's pid and arguments (processes gone meanwhile skipped)."""
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                arguments = (entry / "cmdline").read_bytes().decode(errors="replace")
            except OSError:
                continue
            yield int(entry.name), arguments.split("\0")


def executor_pids(application_id: str) -> dict[str, int]:
    """The JVMs of the application's executors on this host: executor id -> pid."""
    return {
        arguments[arguments.index("--executor-id") + 1]: pid
        for pid, arguments in _command_lines()
        if "org.apache.spark.executor.CoarseGrainedExecutorBackend" in arguments
        and application_id in arguments
        and "--executor-id" in arguments
    }


def wait_for_two_executors(spark: SparkSession, timeout: float = 120.0) -> None:
    """Until the application runs two executor JVMs and the driver knows just those two: a
    killed one is gone from ``/proc`` once its worker reaped it, Spark's standalone worker
    starts one in its place, and the driver drops the lost one and registers the new one.
    (Tasks started before that all run on the survivor, whose loss then reruns them all.)"""
    tracker = spark.sparkContext._jsc.sc().statusTracker()
    deadline = time.monotonic() + timeout
    while (
        len(executor_pids(spark.sparkContext.applicationId)) != 2
        or len(tracker.getExecutorInfos()) != 3  # the driver's entry is among them
    ):
        if time.monotonic() > deadline:
            raise TimeoutError(f"not two executors within {timeout:.0f} s")
        time.sleep(0.5)


def python_worker_pids() -> list[int]:
    """Python workers on this host running tasks: the processes PySpark's daemons forked
    (each daemon's own pid left out)."""
    daemons = {pid for pid, arguments in _command_lines() if "pyspark.daemon" in arguments}
    workers = []
    for pid in daemons:
        try:
            parent = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        if parent in daemons:
            workers.append(pid)
    return sorted(workers)


def _wait_for_port(port: int, server: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + _CONNECT_START_SECONDS
    while time.monotonic() < deadline:
        if server.poll() is not None:
            tail = log.read_text(errors="replace")[-2000:]
            raise ConfigError(f"the Spark Connect server exited ({server.returncode}):\n{tail}")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 1):
            return
        time.sleep(0.2)
    raise ConfigError(f"the Spark Connect server did not listen within {_CONNECT_START_SECONDS} s")


@contextlib.contextmanager
def local_connect_server(
    *,
    cores: int = 2,
    max_task_failures: int = 1,
    driver_memory: str = "2g",
    conf: Mapping[str, str] | None = None,
    python_path: Sequence[str] = (),
) -> Iterator[str]:
    """A Spark Connect server on ``local[cores, max_task_failures]``, started by PySpark's
    own ``spark-submit`` on a free port of 127.0.0.1 (its Python workers run this
    interpreter, with ``python_path`` importable: Connect runs them in a directory of the
    session's own); yields its ``sc://`` URL for ``SparkSession.builder.remote``, and stops
    it on exit. The server's own log is in a temporary file, shown if it fails to start."""
    require_java()
    [port] = free_ports(1)
    submit = Path(pyspark.__file__).parent / "bin" / "spark-submit"
    settings = {
        "spark.connect.grpc.binding.address": "127.0.0.1",
        "spark.connect.grpc.binding.port": str(port),
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.shuffle.partitions": str(cores * 4),
        **(conf or {}),
    }
    command = [
        str(submit),
        "--class",
        _CONNECT_SERVER_CLASS,
        "--master",
        f"local[{cores},{max_task_failures}]",
        "--driver-memory",
        driver_memory,
        *(item for key, value in settings.items() for item in ("--conf", f"{key}={value}")),
        "spark-internal",
    ]
    environment = {
        **os.environ,
        "PYSPARK_PYTHON": os.environ.get("PYSPARK_PYTHON", sys.executable),
        "SPARK_LOCAL_IP": "127.0.0.1",
    }
    if python_path:
        inherited = [environment["PYTHONPATH"]] if environment.get("PYTHONPATH") else []
        environment["PYTHONPATH"] = os.pathsep.join([*python_path, *inherited])
    with tempfile.TemporaryDirectory(prefix="pyshuffle-connect-") as directory:
        log = Path(directory) / "server.log"
        with open(log, "wb") as output:
            server = subprocess.Popen(
                command, stdout=output, stderr=subprocess.STDOUT, env=environment
            )
        try:
            _wait_for_port(port, server, log)
            yield f"sc://127.0.0.1:{port}"
        finally:
            server.terminate()
            try:
                server.wait(timeout=30)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait()


def main() -> int:
    try:
        require_java()
    except ConfigError as error:
        print(f"pyshuffle: {error}", file=sys.stderr)
        return 1
    print(f"pyshuffle: Java {java_version()} found; PySpark can start.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
