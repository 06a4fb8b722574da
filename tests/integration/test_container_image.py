"""The daemon image's Python layer, built as deploy/Containerfile builds it, where no registry
or container runtime is needed: the build stage's ENV, WORKDIR, COPY and RUN instructions run
as written under a temporary root (every absolute path of the image moved under it), then the
runtime stage's ENTRYPOINT and CMD start every role from that virtual environment alone, the
HEALTHCHECK command says healthy, and the stop signal shuts the daemon down cleanly.

What needs a runtime (the user and its uid, file ownership, the VOLUME) is checked as text in
tests/unit/repository/test_deploy.py. Settings the image leaves to ``docker run -e`` (free ports
here, the token file and store mounted elsewhere) are given as its PYSHUFFLE_* variables."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from external_shuffle.options import (
    AUTH_TOKEN_FILE,
    BIND_HOST,
    COORDINATOR_ADDRESS,
    COORDINATOR_STATUS_PORT,
    METRICS_PORT,
    WORKER_ADVERTISED_HOST,
    WORKER_DATA_PORT,
    WORKER_PORT,
    WORKER_STORE_URL,
)
from shuffle_api.config import ConfigOption
from shuffle_runtime.ports import free_ports
from tests.containerfile import stages
from tests.source_tree import ROOT

pytestmark = pytest.mark.slow

CONTAINERFILE = ROOT / "deploy" / "Containerfile"
IMAGE_METRICS_PORT = 9099
"""The port the image's HEALTHCHECK asks (its config's metrics port)."""


class ImageRoot:
    """The image's file system under ``root``, and its environment as ENV leaves it."""

    def __init__(self, root: Path, python: Path) -> None:
        self.root = root
        self.workdir = root
        # The base image's `python` is the interpreter pyshuffle requires: this one.
        shims = root / "base-image-bin"
        shims.mkdir(parents=True)
        (shims / "python").symlink_to(python)
        self.env = {"PATH": f"{shims}:/usr/bin:/bin", "HOME": str(root), "LANG": "C.UTF-8"}

    def path(self, image_path: str) -> Path:
        return self.root / image_path.lstrip("/")

    def rooted(self, text: str) -> str:
        """``text`` with each absolute path of the image moved under the root."""
        return re.sub(r"(?<![\w.:/$])/(?=[A-Za-z])", f"{self.root}/", text)

    def apply(self, instruction: str, arguments: str) -> None:
        if instruction == "ENV":
            for assignment in shlex.split(arguments):
                name, _, value = assignment.partition("=")
                self.env[name] = self.rooted(value).replace(f"${{{name}}}", self.env.get(name, ""))
        elif instruction == "WORKDIR":
            self.workdir = self.path(arguments)
            self.workdir.mkdir(parents=True, exist_ok=True)
        elif instruction == "COPY" and not arguments.startswith("--from="):
            *sources, destination = shlex.split(arguments)
            to = (
                self.path(destination)
                if destination.startswith("/")
                else self.workdir / destination
            )
            for source in sources:
                origin = ROOT / source
                if origin.is_dir():
                    ignore = shutil.ignore_patterns("__pycache__")
                    shutil.copytree(origin, to, ignore=ignore, dirs_exist_ok=True)
                    continue
                into = to / origin.name if destination.endswith("/") else to
                into.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy(origin, into)
        elif instruction == "RUN":
            completed = subprocess.run(
                ["bash", "-c", self.rooted(arguments)],
                cwd=self.workdir,
                env=self.env,
                capture_output=True,
                text=True,
                check=False,
                timeout=600,
            )
            assert completed.returncode == 0, f"RUN {arguments}\n{completed.stderr[-3000:]}"


def _exec_form(arguments: str) -> list[str]:
    command: list[str] = json.loads(arguments)
    return command


@pytest.fixture(scope="module")
def image(tmp_path_factory: pytest.TempPathFactory) -> ImageRoot:
    build, runtime = stages(CONTAINERFILE)
    built = ImageRoot(tmp_path_factory.mktemp("image"), Path(sys.executable))
    for instruction, arguments in build[1:]:
        built.apply(instruction, arguments)
    # The runtime stage's Python layer is the build stage's environment, copied to the same
    # path (COPY --from=build): here it is already there. Its RUN only makes the user.
    for instruction, arguments in runtime[1:]:
        if instruction in ("ENV", "WORKDIR", "COPY"):
            built.apply(instruction, arguments)
    return built


def _runtime(name: str) -> str:
    return dict(stages(CONTAINERFILE)[-1])[name]


@pytest.fixture
def daemon_env(image: ImageRoot, tmp_path: Path) -> Mapping[str, str]:
    token = tmp_path / "token"
    token.write_text("a-token-of-the-image-test\n", encoding="utf-8")
    coordinator, worker, data, metrics, status = free_ports(5)
    settings: dict[ConfigOption[Any], object] = {
        COORDINATOR_ADDRESS: f"127.0.0.1:{coordinator}",
        WORKER_PORT: worker,
        WORKER_DATA_PORT: data,
        METRICS_PORT: metrics,
        COORDINATOR_STATUS_PORT: status,
        AUTH_TOKEN_FILE: token,
        WORKER_STORE_URL: tmp_path / "store",
        BIND_HOST: "127.0.0.1",
        WORKER_ADVERTISED_HOST: "127.0.0.1",
    }
    return {**image.env, **{option.env_name: str(value) for option, value in settings.items()}}


def test_the_image_python_layer_serves_every_role_and_passes_its_health_check(
    image: ImageRoot, daemon_env: Mapping[str, str]
) -> None:
    entrypoint = _exec_form(_runtime("ENTRYPOINT"))
    command = [*entrypoint, *map(image.rooted, _exec_form(_runtime("CMD")))]
    # Found on the image's PATH: the environment's own pyshuffle, nothing of this checkout.
    executable = shutil.which(command[0], path=daemon_env["PATH"])
    assert executable is not None and executable.startswith(str(image.root)), executable
    health = _runtime("HEALTHCHECK")
    probe = _exec_form(health[health.index("CMD") + len("CMD") :].strip())
    metrics_port = daemon_env[METRICS_PORT.env_name]
    probe = [part.replace(f":{IMAGE_METRICS_PORT}/", f":{metrics_port}/") for part in probe]

    def healthy() -> bool:
        checked = subprocess.run(probe, env=daemon_env, capture_output=True, check=False)
        return checked.returncode == 0

    assert not healthy(), "the health check passes with no daemon running"
    daemon = subprocess.Popen(
        [executable, *command[1:]],
        cwd=image.workdir,
        env=daemon_env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        while not healthy():
            assert daemon.poll() is None, daemon.communicate()[1][-3000:]
            assert time.monotonic() < deadline, "the health check never passed"
            time.sleep(0.5)
        listed = subprocess.run(
            [executable, "admin", "workers", "--json"],
            env=daemon_env,
            capture_output=True,
            text=True,
            check=False,
            timeout=60,
        )
        assert listed.returncode == 0, listed.stderr
        [worker] = json.loads(listed.stdout)["workers"]
        assert worker["state"] == "alive"
        assert _runtime("STOPSIGNAL") == "SIGTERM"
        daemon.send_signal(signal.SIGTERM)
        assert daemon.wait(timeout=60) == 0, daemon.communicate()[1][-3000:]
    finally:
        if daemon.poll() is None:
            daemon.kill()
            daemon.wait()
    assert os.path.isdir(daemon_env[WORKER_STORE_URL.env_name])
