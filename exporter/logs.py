"""Structured logs: short lowercase event names with context as fields.

``log.warning("scrape failed", extra=ctx(target=url, error=msg))``. Text on a terminal
(``time LEVEL logger event k=v ...``), JSON lines otherwise, which Cloud Logging on GKE reads
as structured entries: ``severity`` is the entry's level and ``message`` its summary line
(the event name, also kept as ``event``), the context fields follow.

``Episodes`` logs a failing target once per outage: when it begins and when it ends.
"""

from __future__ import annotations

import json
import logging
import sys
from dataclasses import dataclass
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


@dataclass(slots=True)
class _Episode:
    since: float
    attempts: int = 1


class Episodes:
    """Failures of targets, logged per episode: a warning when one begins, an info line
    when it ends, with how long it lasted and how many attempts failed; the attempts
    between say nothing. ``now`` is the caller's clock."""

    def __init__(self, logger: logging.Logger) -> None:
        self._log = logger
        self._open: dict[tuple[str, str], _Episode] = {}

    def failed(self, key: tuple[str, str], now: float, event: str, **fields: Any) -> bool:
        """One more failed attempt; True when it began an episode (and was logged)."""
        ep = self._open.get(key)
        if ep is not None:
            ep.attempts += 1
            return False
        self._open[key] = _Episode(now)
        self._log.warning(event, extra=ctx(**fields))
        return True

    def recovered(self, key: tuple[str, str], now: float, event: str, **fields: Any) -> bool:
        """A success; True when it ended an episode (and was logged)."""
        ep = self._open.pop(key, None)
        if ep is None:
            return False
        self._log.info(event, extra=ctx(**fields, outage_seconds=round(now - ep.since, 3),
                                        failed_attempts=ep.attempts))
        return True

    def failing(self, target: str) -> list[str]:
        """The kinds of failure of ``target`` whose episode is open."""
        return [k for t, k in self._open if t == target]

    def forget(self, target: str) -> None:
        """Drop the open episodes of a target that is gone."""
        for key in [k for k in self._open if k[0] == target]:
            del self._open[key]
