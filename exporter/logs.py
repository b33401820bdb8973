"""Structured logs: short lowercase event names with context as fields.

``log.warning("scrape failed", extra=ctx(target=url, error=msg))``. Text on a terminal
(``time LEVEL logger event k=v ...``), JSON lines with a ``severity`` field otherwise, which
Cloud Logging on GKE reads as structured entries.
"""

from __future__ import annotations

import json
import logging
import sys
from datetime import UTC, datetime
from typing import Any

_CTX = "ctx"


def ctx(**fields: Any) -> dict[str, dict[str, Any]]:
    """Context fields for one log call (pass as ``extra=``)."""
    return {_CTX: fields}


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(),
            "severity": record.levelname, "logger": record.name,
            "event": record.getMessage(), **getattr(record, _CTX, {})}
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)


class TextFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        fields = " ".join(f"{k}={v}" for k, v in getattr(record, _CTX, {}).items())
        line = (f"{self.formatTime(record)} {record.levelname} {record.name} "
                f"{record.getMessage()} {fields}").rstrip()
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


def configure(fmt: str = "auto", level: int = logging.INFO) -> None:
    """``fmt``: ``text``, ``json``, or ``auto`` (text on a terminal, else JSON)."""
    if fmt == "auto":
        fmt = "text" if sys.stderr.isatty() else "json"
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
