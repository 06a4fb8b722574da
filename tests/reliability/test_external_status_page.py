"""The coordinator's status page in a real headless browser (Debian's chromium): workers and
applications as the coordinator knows them, behind the cluster's token (a browser's first
request, without it, is no authentication failure), bounded against slow clients."""

from __future__ import annotations

import base64
import re
import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from external_shuffle.local_cluster import LocalCluster
from external_shuffle.wire.credentials import Role, application_token, operator_token
from tests.eventually import eventually
from tests.reliability.external_cluster import (
    PARTITIONS,
    SUBPARTITIONS,
    batches,
    external,
    scenario_on,
    scrape,
)

BROWSER = shutil.which("chromium") or "/usr/bin/chromium"
# Flags for a headless run on a machine with no network beyond loopback.
BROWSER_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    directory = tmp_path_factory.mktemp("status")
    with LocalCluster(directory, workers=2, metrics=True, status_page=True) as running:
        yield running


def _port(cluster: LocalCluster) -> int:
    assert cluster.status_port is not None
    return cluster.status_port


def _browse(cluster: LocalCluster, profile: Path, *what: str) -> subprocess.CompletedProcess[str]:
    """Chromium on the page, logged in with the token (HTTP Basic credentials in the URL)."""
    token = cluster.token_file.read_text().strip()
    return subprocess.run(
        [
            BROWSER,
            *BROWSER_FLAGS,
            f"--user-data-dir={profile}",
            *what,
            f"http://operator:{token}@127.0.0.1:{_port(cluster)}/",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def _refusals(cluster: LocalCluster) -> tuple[float, int]:
    """Authentication failures the coordinator counted on the page, and logged."""
    counted = scrape(cluster, "coordinator").get('pyshuffle_auth_failures_total{method="GET /"}')
    logged = (cluster.directory / "coordinator.log").read_text().count("refused the status page")
    return counted or 0.0, logged


def test_the_page_shows_workers_and_applications_in_a_browser(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    refusals = _refusals(cluster)
    with scenario_on(cluster) as scenario:
        scenario.produce(batches(), partitions=PARTITIONS, subpartitions=SUBPARTITIONS)
        application_id = external(scenario.master).application_id
        eventually(
            lambda: application_id in _browse(cluster, tmp_path / "p0", "--dump-dom").stdout,
            "the application on the page",
            timeout=60,
        )
        shown = _browse(cluster, tmp_path / "p1", "--dump-dom")
        screenshot = tmp_path / "status-page.png"
        shot = _browse(
            cluster, tmp_path / "p2", f"--screenshot={screenshot}", "--window-size=1200,700"
        )
    dom = shown.stdout
    assert '<meta http-equiv="refresh" content="5">' in dom  # the browser reloads it
    assert re.search(r'id="summary">2 of 2 workers alive, 1 applications', dom), dom[:2000]
    for index in range(2):
        assert f"<td>{cluster.worker_target(index)}</td>" in dom
    # application, engine id, name, user, heard, partitions
    row = re.search(
        rf"<tr><td>{re.escape(application_id)}</td>(?:<td>[^<]*</td>){{4}}<td>(\d+)</td>", dom
    )
    assert row is not None and int(row.group(1)) == PARTITIONS
    assert not re.search(r"<script|https?://(?!127\.0\.0\.1)", dom)  # no scripts or assets
    assert shot.returncode == 0, shot.stderr[-2000:]
    assert screenshot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert screenshot.stat().st_size > 10_000  # a rendered page, not a blank one
    # Each visit asked without credentials first, then with them: no failure, no warning.
    assert _refusals(cluster) == refusals


def _refused(cluster: LocalCluster, headers: dict[str, str]) -> None:
    url = f"http://127.0.0.1:{_port(cluster)}/"
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=10)
    assert refused.value.code == 401
    assert refused.value.headers["WWW-Authenticate"].startswith("Basic ")


def test_a_visit_without_credentials_is_asked_for_them_and_not_counted(
    cluster: LocalCluster,
) -> None:
    refusals = _refusals(cluster)
    _refused(cluster, {})
    assert _refusals(cluster) == refusals


def test_a_wrong_credential_is_refused_counted_and_logged(cluster: LocalCluster) -> None:
    counted, logged = _refusals(cluster)
    wrong_password = base64.b64encode(b"operator:not-the-token").decode()
    for headers in (
        {"Authorization": "Bearer not-the-token"},
        {"Authorization": f"Basic {wrong_password}"},
    ):
        _refused(cluster, headers)
    assert _refusals(cluster) == (counted + 2, logged + 2)
    assert "refused the status page to 127.0.0.1: wrong token" in (
        (cluster.directory / "coordinator.log").read_text()
    )
    token = cluster.token_file.read_text().strip()
    ok = urllib.request.Request(
        f"http://127.0.0.1:{_port(cluster)}/", headers={"Authorization": f"Bearer {token}"}
    )
    with urllib.request.urlopen(ok, timeout=10) as page:
        assert page.headers["Content-Security-Policy"].startswith("default-src 'none'")


def test_an_operators_credential_opens_the_page_and_an_expired_or_other_one_is_refused(
    cluster: LocalCluster,
) -> None:
    secret = cluster.token_file.read_text().strip()
    url = f"http://127.0.0.1:{_port(cluster)}/"
    for role in (Role.READER, Role.ADMIN):
        token = operator_token(secret, role, "viewer", int(time.time()) + 60)
        request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"})
        with urllib.request.urlopen(request, timeout=10) as page:
            assert 'id="summary"' in page.read().decode()
    counted, logged = _refusals(cluster)
    expired = operator_token(secret, Role.READER, "former", int(time.time()) - 1)
    _refused(cluster, {"Authorization": f"Bearer {expired}"})
    assert _refusals(cluster) == (counted + 1, logged + 1)
    assert "reader credential of 'former' expired" in (
        (cluster.directory / "coordinator.log").read_text()
    )
    # A team's drivers and an application hold credentials too, which are not operators'.
    for token in (
        operator_token(secret, Role.CLIENT, "team", int(time.time()) + 60),
        application_token(secret, "team.app-x", int(time.time()) + 60),
    ):
        _refused(cluster, {"Authorization": f"Bearer {token}"})
    assert _refusals(cluster)[0] == counted + 3


def test_a_half_sent_request_holds_the_page_for_a_few_seconds_only(
    cluster: LocalCluster,
) -> None:
    token = cluster.token_file.read_text().strip()
    with socket.create_connection(("127.0.0.1", _port(cluster)), timeout=30) as stalled:
        stalled.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n")  # and never the rest
        started = time.monotonic()
        request = urllib.request.Request(
            f"http://127.0.0.1:{_port(cluster)}/", headers={"Authorization": f"Bearer {token}"}
        )
        with urllib.request.urlopen(request, timeout=30) as page:
            assert page.status == 200
        assert time.monotonic() - started < 15
