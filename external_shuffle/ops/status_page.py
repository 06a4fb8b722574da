"""The coordinator's status page: a read-only HTML view of the cluster (workers, applications)
that the browser reloads every few seconds, with no external assets.

It asks for the cluster's token or an operator's credential (``wire.credentials``), as the gRPC
ports do: HTTP Basic (any user name, the token as the password; a browser prompts for it)
or ``Authorization: Bearer <token>``; only the probes' ``/healthz`` and ``/readyz``
(:mod:`external_shuffle.ops.health`) need none. One thread serves it, one request at a time,
and a request must arrive whole within a few seconds: a slow or idle client costs the
coordinator nothing but that wait.
"""

from __future__ import annotations

import base64
import binascii
import html
import logging
import threading
import time
from collections.abc import Callable, Sequence
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import Any, Final

from external_shuffle.ops.cluster_view import ClusterView, human_bytes
from external_shuffle.ops.health import PROBE_HEADERS, Readiness, probe_answer
from external_shuffle.ops.metrics import DaemonMetrics
from external_shuffle.wire.credentials import CredentialCheck, grpc_method
from shuffle_api import AuthenticationError, ConfigError

__all__ = ["StatusPage"]

logger = logging.getLogger(__name__)

_REQUEST_TIMEOUT: Final = 5.0
_REFRESH_SECONDS: Final = 5
_METHOD: Final = "GET /"  # how a refused request is counted in pyshuffle_auth_failures_total
_LISTING: Final = grpc_method("Coordinator", "ListApplications")
_HEADERS: Final = {
    "Content-Type": "text/html; charset=utf-8",
    "Cache-Control": "no-store",
    # Nothing but the page itself: no scripts, no requests elsewhere, never framed.
    "Content-Security-Policy": "default-src 'none'; style-src 'unsafe-inline'",
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
}
_STYLE: Final = (
    "body{font:14px system-ui,sans-serif;margin:2em;color:#222}"
    "table{border-collapse:collapse;margin-bottom:2em}"
    "th,td{border-bottom:1px solid #ddd;padding:4px 12px;text-align:left}"
    "th{background:#f4f4f4}.dead{color:#b00}.decommissioning{color:#a60}.note{color:#777}"
)


def _table(columns: Sequence[str], rows: Sequence[Sequence[str]], state_column: int = -1) -> str:
    head = "".join(f"<th>{html.escape(column)}</th>" for column in columns)
    body = "".join(
        "<tr{}>{}</tr>".format(
            f' class="{html.escape(row[state_column])}"' if state_column >= 0 else "",
            "".join(f"<td>{html.escape(cell)}</td>" for cell in row),
        )
        for row in rows
    )
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def render(view: ClusterView, now: float) -> str:
    """The page for ``view``; every value from the cluster is escaped (ids are clients')."""
    alive = sum(1 for worker in view.workers if worker.state != "dead")
    stored = sum(worker.stored_bytes for worker in view.workers)
    partitions = sum(application.partitions for application in view.applications)
    summary = (
        f"{alive} of {len(view.workers)} workers alive, {len(view.applications)} applications,"
        f" {partitions:,} partitions tracked, {human_bytes(stored)} stored"
    )
    state = ClusterView.WORKER_COLUMNS.index("state")
    return (
        '<!doctype html><html lang="en"><head><meta charset="utf-8">'
        f'<meta http-equiv="refresh" content="{_REFRESH_SECONDS}">'
        f"<title>pyshuffle coordinator</title><style>{_STYLE}</style></head><body>"
        f'<h1>pyshuffle coordinator</h1><p id="summary">{html.escape(summary)}</p>'
        f'<h2>Workers</h2><div id="workers">'
        f"{_table(ClusterView.WORKER_COLUMNS, view.worker_table(), state)}</div>"
        f'<h2>Applications</h2><div id="applications">'
        f"{_table(ClusterView.APPLICATION_COLUMNS, view.application_table())}</div>"
        f'<p class="note">As of {time.strftime("%Y-%m-%d %H:%M:%S %Z", time.localtime(now))};'
        f" reloads every {_REFRESH_SECONDS} s.</p></body></html>"
    )


def _presented_token(authorization: str | None) -> bytes | None:
    """The token a request presents: Bearer, or Basic's password."""
    if authorization is None:
        return None
    scheme, _, credentials = authorization.partition(" ")
    if scheme.lower() == "bearer":
        return credentials.strip().encode()
    if scheme.lower() == "basic":
        try:
            decoded = base64.b64decode(credentials.strip(), validate=True)
        except (binascii.Error, ValueError):
            return None
        return decoded.partition(b":")[2]
    return None


class StatusPage:
    """Serves :func:`render` of ``view()`` to requests that present a credential ``check``
    takes (the cluster's secret, or an operator's: either role may look), and the probes of
    ``readiness`` to any."""

    def __init__(
        self,
        view: Callable[[], ClusterView],
        check: CredentialCheck,
        metrics: DaemonMetrics,
        readiness: Readiness,
    ) -> None:
        self._view = view
        self._readiness = readiness
        self._check = check
        self._metrics = metrics
        self._server: HTTPServer | None = None
        self._thread: threading.Thread | None = None

    def serve(self, host: str, port: int) -> int:
        """Serve on ``host:port`` (0: a free port) in a thread of its own; returns the port."""
        try:
            server = HTTPServer((host, port), self._handler_class())
        except OSError as error:
            raise ConfigError(f"cannot serve the status page on {host}:{port}: {error}") from error
        server.timeout = _REQUEST_TIMEOUT
        self._server = server
        self._thread = threading.Thread(
            target=server.serve_forever, name="pyshuffle-status-page", daemon=True
        )
        self._thread.start()
        return int(server.server_address[1])

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        if self._thread is not None:
            self._thread.join()

    def _refusal(self, authorization: str | None) -> AuthenticationError | None:
        """Why a request's credential is refused, or None if it is taken."""
        presented = _presented_token(authorization)
        if presented is None:
            return AuthenticationError("wrong token")
        try:
            # What the page shows is what the listings show: readers', not applications'.
            self._check.credential_of(presented).check_may_call(_LISTING)
        except AuthenticationError as error:  # PermissionDeniedError too
            return error
        return None

    def _refused(self, authorization: str | None, peer: str, error: AuthenticationError) -> None:
        """Count and log a request refused for a wrong credential. One with none is a browser's
        first visit (it asks for the password on the 401), no failure: debug level only."""
        if authorization is None:
            logger.debug("asked %s for the token", peer)
            return
        self._metrics.auth_failures.labels(method=_METHOD).inc()
        logger.warning(
            "refused the status page to %s: %s", peer, error, extra={"peer": peer, "code": "401"}
        )

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        page = self

        class Handler(BaseHTTPRequestHandler):
            timeout = _REQUEST_TIMEOUT  # a request that is not all there by then is dropped
            server_version = "pyshuffle"
            sys_version = ""

            def do_GET(self) -> None:
                probe = probe_answer(self.path, page._readiness)
                if probe is not None:
                    self._reply(probe.status, probe.body, PROBE_HEADERS)
                    return
                authorization = self.headers.get("Authorization")
                refusal = page._refusal(authorization)
                if refusal is not None:
                    page._refused(authorization, self.client_address[0], refusal)
                    self._reply(
                        HTTPStatus.UNAUTHORIZED,
                        b"the cluster's token, or an operator's credential, is the password",
                        {"WWW-Authenticate": 'Basic realm="pyshuffle", charset="UTF-8"'},
                    )
                    return
                if self.path.split("?", 1)[0] not in ("/", "/status"):
                    self._reply(HTTPStatus.NOT_FOUND, b"not found")
                    return
                self._reply(HTTPStatus.OK, render(page._view(), time.time()).encode(), _HEADERS)

            def _reply(
                self, status: HTTPStatus, body: bytes, headers: dict[str, str] | None = None
            ) -> None:
                self.send_response(status)
                for name, value in (headers or {"Content-Type": "text/plain"}).items():
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                logger.debug(format, *args)

        return Handler
