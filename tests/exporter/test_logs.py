"""Log lines: JSON entries Cloud Logging reads (severity, message), and text."""

from __future__ import annotations

import io
import json
import logging
from datetime import datetime

from exporter.logs import JsonFormatter, TextFormatter, ctx


def emit(formatter: logging.Formatter, level: int, event: str, **fields: object) -> str:
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(formatter)
    log = logging.Logger("exporter.test")
    log.addHandler(handler)
    log.log(level, event, extra=ctx(**fields))
    return out.getvalue()


def test_json_line_has_message_severity_and_context() -> None:
    line = emit(JsonFormatter(), logging.WARNING, "dcgm scrape failed",
                target="http://10.0.0.1:9400/metrics", error="timeout")
    assert line.count("\n") == 1
    entry = json.loads(line)
    assert entry["message"] == entry["event"] == "dcgm scrape failed"
    assert entry["severity"] == "WARNING" and entry["logger"] == "exporter.test"
    assert entry["target"] == "http://10.0.0.1:9400/metrics" and entry["error"] == "timeout"
    assert datetime.fromisoformat(entry["time"]).tzinfo is not None


def test_text_line_is_event_then_fields() -> None:
    line = emit(TextFormatter(), logging.INFO, "serving", port=9808)
    assert line.rstrip().endswith("INFO exporter.test serving port=9808")
