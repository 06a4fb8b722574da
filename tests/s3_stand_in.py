"""moto's S3 server on 127.0.0.1, standing in for S3 (no real S3 is reachable here), with a
counter of the requests it answers and every n-th of them refused as an S3 throttle (503 SlowDown).

Run as a process of its own (``python -m tests.s3_stand_in --port-file F``), so that Spark's
driver and executors reach it as they would reach S3: by the environment :meth:`environment`
gives. ``/_stand_in/counts`` answers the counts so far (JSON), ``/_stand_in/throttle?every=n``
refuses every n-th request from then on (0: none), ``/_stand_in/reset`` zeroes the counts.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

import fsspec

__all__ = ["S3StandIn", "objects_under", "request_kind", "running_stand_in"]

_CONTROL = "/_stand_in/"
_THROTTLED = (
    b'<?xml version="1.0" encoding="UTF-8"?><Error><Code>SlowDown</Code>'
    b"<Message>Please reduce your request rate.</Message></Error>"
)
_KEYS = {"AWS_ACCESS_KEY_ID": "stand-in", "AWS_SECRET_ACCESS_KEY": "stand-in"}

_Environ = dict[str, Any]
_StartResponse = Callable[..., Any]
_App = Callable[[_Environ, _StartResponse], Iterable[bytes]]


def objects_under(url: str) -> list[str]:
    """Every object under ``url``, as the store lists it now."""
    filesystem, root = fsspec.core.url_to_fs(url)
    filesystem.invalidate_cache()  # s3fs keeps listings
    return sorted(filesystem.find(root))


def request_kind(method: str, path: str) -> str:
    """What S3 request this is: GET (of an object's bytes), LIST, HEAD, PUT, POST (multipart
    and batch deletes), DELETE, or BUCKET (anything else on a bucket)."""
    if method == "GET":
        # Path-style addressing: /bucket lists (whatever the query), /bucket/key reads.
        return "LIST" if "/" not in path.strip("/") else "GET"
    return method if method in ("HEAD", "PUT", "POST", "DELETE") else "BUCKET"


class _Counting:
    """moto's WSGI application behind a counter, refusing every n-th request as throttled.

    Every n-th, not a random share: a test of throttling must see throttles whatever the
    number of requests its job happens to make, and a retry right after one goes through."""

    def __init__(self, app: _App) -> None:
        self._app = app
        self._counts: Counter[str] = Counter()
        self._every = 0
        self._since_throttle_set = 0
        self._lock = threading.Lock()

    def __call__(self, environ: _Environ, start_response: _StartResponse) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "")
        if path.startswith(_CONTROL):
            return self._control(path[len(_CONTROL) :], environ, start_response)
        kind = request_kind(environ["REQUEST_METHOD"], path)
        with self._lock:
            self._since_throttle_set += 1
            throttled = self._every > 0 and self._since_throttle_set % self._every == 0
            self._counts["THROTTLED" if throttled else kind] += 1
        if throttled:
            start_response("503 Slow Down", [("Content-Type", "application/xml")])
            return [_THROTTLED]
        return self._app(environ, start_response)

    def _control(
        self, command: str, environ: _Environ, start_response: _StartResponse
    ) -> Iterable[bytes]:
        with self._lock:
            if command == "throttle":
                every = parse_qs(environ.get("QUERY_STRING", "")).get("every", ["0"])[0]
                self._every = int(every)
                self._since_throttle_set = 0
            elif command == "reset":
                self._counts.clear()
            answer = json.dumps(dict(self._counts)).encode()
        start_response("200 OK", [("Content-Type", "application/json")])
        return [answer]


class S3StandIn:
    """A running stand-in, seen from the process that started it."""

    def __init__(self, endpoint: str, process: subprocess.Popen[bytes]) -> None:
        self.endpoint = endpoint
        self._process = process

    def environment(self) -> dict[str, str]:
        """What a process needs in its environment to use the stand-in as its S3."""
        return {
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_DEFAULT_REGION": "us-east-1",
            **_KEYS,
        }

    def _control(self, command: str) -> dict[str, int]:
        with urllib.request.urlopen(f"{self.endpoint}{_CONTROL}{command}", timeout=30) as answer:
            counts: dict[str, int] = json.loads(answer.read())
            return counts

    def counts(self) -> dict[str, int]:
        """Requests answered since the last reset, by :func:`request_kind`, and THROTTLED."""
        return self._control("counts")

    def reset(self) -> None:
        self._control("reset")

    def throttle(self, every: int) -> None:
        """Refuse every ``every``-th request from now on with 503 SlowDown (0: none)."""
        self._control(f"throttle?every={every}")

    def cpu_seconds(self) -> float:
        """The CPU time the stand-in's process has used so far (Linux's /proc): what serving
        a stage's requests takes from the cores the stage shares with it."""
        fields = Path(f"/proc/{self._process.pid}/stat").read_text().rsplit(")", 1)[1].split()
        user, system = int(fields[11]), int(fields[12])  # utime and stime, in clock ticks
        return (user + system) / os.sysconf("SC_CLK_TCK")

    def make_bucket(self, name: str) -> None:
        request = urllib.request.Request(f"{self.endpoint}/{name}", method="PUT")
        with urllib.request.urlopen(request, timeout=30):
            pass

    def stop(self) -> None:
        self._process.terminate()
        try:
            self._process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()


@contextlib.contextmanager
def running_stand_in(timeout: float = 60.0) -> Iterator[S3StandIn]:
    """Start the stand-in in a process of its own on a free port; stop it on the way out."""
    with tempfile.TemporaryDirectory() as directory:
        port_file = Path(directory) / "port"
        process = subprocess.Popen(
            [sys.executable, "-m", "tests.s3_stand_in", "--port-file", str(port_file)],
            cwd=Path(__file__).resolve().parent.parent,
            env={**os.environ, **_KEYS},
        )
        deadline = time.monotonic() + timeout
        while not port_file.exists() or not port_file.read_text().endswith("\n"):
            if process.poll() is not None or time.monotonic() > deadline:
                process.kill()
                raise RuntimeError(f"the S3 stand-in did not start (exit {process.poll()})")
            time.sleep(0.05)
        stand_in = S3StandIn(f"http://127.0.0.1:{int(port_file.read_text())}", process)
        try:
            yield stand_in
        finally:
            stand_in.stop()


def main() -> None:
    # Here, not at the top: every test process imports this module, few run the server.
    from moto.moto_server.werkzeug_app import (  # noqa: PLC0415
        DomainDispatcherApplication,
        create_backend_app,
    )
    from werkzeug.serving import make_server  # noqa: PLC0415

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port-file", required=True, type=Path)
    arguments = parser.parse_args()
    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # not a line per request
    app = _Counting(DomainDispatcherApplication(create_backend_app))
    server = make_server("127.0.0.1", 0, app, threaded=True)
    written = arguments.port_file.with_suffix(".tmp")
    written.write_text(f"{server.server_port}\n")
    written.replace(arguments.port_file)
    server.serve_forever()


if __name__ == "__main__":
    main()
