"""``external_shuffle.daemon.logs``: the daemon's log lines: the JSON and text formats carry
the same fields and the time to the millisecond, and the level filters them."""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Iterator

import pytest

from external_shuffle.daemon.logs import configure_logging

MILLISECONDS = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}[+-]\d{4}")


@pytest.fixture
def restored_root_logger() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    root.handlers[:], root.level = handlers, level


def _log_and_read(capsys: pytest.CaptureFixture[str], log_format: str, level: str) -> list[str]:
    configure_logging(log_format, level)
    logger = logging.getLogger("external_shuffle.test")
    logger.debug("hidden unless debug")
    logger.warning("refused %s", "call", extra={"method": "/svc/Push", "peer": "ipv4:1.2.3.4:5"})
    return capsys.readouterr().err.splitlines()


@pytest.mark.usefixtures("restored_root_logger")
def test_json_and_text_lines_carry_the_same_fields(capsys: pytest.CaptureFixture[str]) -> None:
    [as_json] = _log_and_read(capsys, "json", "info")
    [as_text] = _log_and_read(capsys, "text", "info")
    document = json.loads(as_json)
    assert document["message"] == "refused call"
    assert (document["level"], document["method"], document["peer"]) == (
        "warning",
        "/svc/Push",
        "ipv4:1.2.3.4:5",
    )
    assert " warning external_shuffle.test refused call " in as_text
    assert 'method="/svc/Push"' in as_text and 'peer="ipv4:1.2.3.4:5"' in as_text


@pytest.mark.usefixtures("restored_root_logger")
def test_the_level_filters_lines(capsys: pytest.CaptureFixture[str]) -> None:
    assert len(_log_and_read(capsys, "text", "debug")) == 2
    assert _log_and_read(capsys, "text", "error") == []


@pytest.mark.usefixtures("restored_root_logger")
def test_lines_carry_the_time_to_the_millisecond(capsys: pytest.CaptureFixture[str]) -> None:
    [as_json] = _log_and_read(capsys, "json", "info")
    [as_text] = _log_and_read(capsys, "text", "info")
    assert MILLISECONDS.fullmatch(json.loads(as_json)["time"])
    assert MILLISECONDS.fullmatch(as_text.split(" ", 1)[0])
