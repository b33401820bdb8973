"""Structured logs: short lowercase event names with context as fields.

``log.warning("scrape failed", extra=ctx(target=url, error=msg))``. Text on a terminal
(``time LEVEL logger event k=v ...``), JSON lines otherwise, which Cloud Logging on GKE reads
as structured entries: ``severity`` is the entry's level and ``message`` its summary line
(the event name, also kept as ``event``), the context fields follow.
"""

from __future__ import annotations

import json
import logging
import sys
from datetime import UTC, datetime
from typing import Any, Literal, get_args

_CTX = "ctx"

LogLevel = Literal["debug", "info", "warning", "error"]
LEVELS: tuple[LogLevel, ...] = get_args(LogLevel)


def ctx(**fields: Any) -> dict[str, dict[str, Any]]:
    """Context fields for one log call (pass as ``extra=``)."""
    return {_CTX: fields}


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(),
            "severity": record.levelname, "logger": record.name,
            "message": record.getMessage(), "event": record.getMessage(),
            **getattr(record, _CTX, {})}
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


def configure(fmt: str = "auto", level: LogLevel = "info") -> None:
    """``fmt``: ``text``, ``json``, or ``auto`` (text on a terminal, else JSON)."""
    if fmt == "auto":
        fmt = "text" if sys.stderr.isatty() else "json"
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    set_level(level)


QUIET_LIBRARIES = ("matplotlib",)
"""Libraries whose info lines (a font cache built) say nothing about the product: they
log warnings and errors, and everything at ``debug``."""


def set_level(level: LogLevel) -> None:
    """The least severe level logged, from now on."""
    logging.getLogger().setLevel(level.upper())
    for name in QUIET_LIBRARIES:
        logging.getLogger(name).setLevel(logging.DEBUG if level == "debug" else logging.WARNING)
