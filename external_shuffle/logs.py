"""Structured daemon logs: one JSON object per line on stderr (or plain text)."""

from __future__ import annotations

import json
import logging
import sys
from typing import Any, Final

__all__ = ["configure_logging"]

# Attributes every LogRecord has; anything else came in through ``extra=`` and is a field.
_STANDARD: Final = frozenset(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {
    "message",
    "asctime",
}


class _JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        document: dict[str, Any] = {
            "time": self.formatTime(record, "%Y-%m-%dT%H:%M:%S%z"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key, value in vars(record).items():
            if key not in _STANDARD:
                document[key] = value
        if record.exc_info:
            document["error"] = self.formatException(record.exc_info)
        return json.dumps(document, default=str)


def configure_logging(log_format: str, level: int = logging.INFO) -> None:
    handler = logging.StreamHandler(sys.stderr)
    if log_format == "json":
        handler.setFormatter(_JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
