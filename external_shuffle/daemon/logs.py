"""Structured daemon logs: one JSON object per line on stderr (or plain text), each stamped
with the local time to the millisecond."""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import Any, Final

__all__ = ["configure_logging"]

# Attributes every LogRecord has; anything else came in through ``extra=`` and is a field.
_STANDARD: Final = frozenset(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {
    "message",
    "asctime",
}


def _timestamp(record: logging.LogRecord) -> str:
    """ISO 8601 local time with milliseconds and the UTC offset: 2026-11-28T14:03:07.042+0100."""
    local = time.localtime(record.created)
    second, offset = time.strftime("%Y-%m-%dT%H:%M:%S", local), time.strftime("%z", local)
    return f"{second}.{int(record.msecs):03d}{offset}"


def _fields(record: logging.LogRecord) -> dict[str, Any]:
    """What a line says in either format: time, level, logger, message and every field."""
    fields: dict[str, Any] = {
        "time": _timestamp(record),
        "level": record.levelname.lower(),
        "logger": record.name,
        "message": record.getMessage(),
    }
    fields.update((key, value) for key, value in vars(record).items() if key not in _STANDARD)
    if record.exc_info:
        fields["error"] = logging.Formatter().formatException(record.exc_info)
    return fields


class _JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        return json.dumps(_fields(record), default=str)


class _TextFormatter(logging.Formatter):
    """``time level logger message key=value ...``: the JSON format's fields, for a terminal."""

    def format(self, record: logging.LogRecord) -> str:
        fields = _fields(record)
        head = " ".join(str(fields.pop(key)) for key in ("time", "level", "logger", "message"))
        error = fields.pop("error", None)
        tail = "".join(f" {key}={json.dumps(value, default=str)}" for key, value in fields.items())
        return head + tail + (f"\n{error}" if error else "")


def configure_logging(log_format: str, level: str = "info") -> None:
    """One handler on stderr for the whole process, in ``log_format`` ("json" or "text"),
    showing ``level`` and above."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_JsonFormatter() if log_format == "json" else _TextFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
