"""The report by email, received by a real SMTP server on loopback and parsed back."""

from __future__ import annotations

import logging
import smtplib
from pathlib import Path
from typing import Any

import pytest

from analytics import mail
from analytics.report import build
from analytics.store import DuckDBStore
from analytics.week import parse_week
from analytics.weekly import run_weekly
from exporter.config import Config, load_config
from exporter.prices import load_price_book
from tests.analytics.conftest import HOSTILE, PASSWORD, Inbox


def config(port: int, ca_file: Path, **report: Any) -> Config:
    return load_config(None, {"cluster": "c", "report": {
        "sender": "gpu-reports@example.com",
        "platform_recipients": ["platform@example.com"],
        "team_recipients": {"alpha": ["alpha-lead@example.com"],
                            HOSTILE: ["hostile-lead@example.com"]},
        "smtp": {"host": "127.0.0.1", "port": port, "security": "starttls",
                 "username": "reports", "ca_file": str(ca_file)}} | report})


def test_reports_arrive_each_to_its_readers(small_warehouse: Path,
                                            smtp_server: tuple[Inbox, int, Path],
                                            tmp_path: Path, caplog: pytest.LogCaptureFixture,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    inbox, port, ca_file = smtp_server
    monkeypatch.setenv("GKE_GPU_EXPORTER_REPORT__SMTP__PASSWORD", PASSWORD)
    cfg = config(port, ca_file)
    store = DuckDBStore(small_warehouse)
    with caplog.at_level(logging.DEBUG):
        run_weekly(store, parse_week("2026-W47"), cfg,
                   load_price_book(None, "us-central1").prices, tmp_path, email=True)
    store.close()
    by_rcpt = {tuple(rcpts): msg for rcpts, msg in inbox.messages}
    assert set(by_rcpt) == {("platform@example.com",), ("alpha-lead@example.com",),
                            ("hostile-lead@example.com",)}
    platform, alpha = by_rcpt[("platform@example.com",)], by_rcpt[("alpha-lead@example.com",)]
    assert platform["Subject"] == "GPU cost and bottleneck report 2026-W47 — c, all teams"
    assert alpha["Subject"] == "GPU cost and bottleneck report 2026-W47 — team alpha"
    for msg in by_rcpt.values():
        assert msg.get_content_type() == "multipart/alternative"
        text = msg.get_body(("plain",))
        html = msg.get_body(("html",))
        assert text is not None and html is not None
        body = html.get_content()
        images = [p for p in msg.walk() if p.get_content_type() == "image/png"]
        assert len(images) == 3
        for img in images:
            cid = img["Content-ID"].strip("<>")
            assert f'src="cid:{cid}"' in body
            assert img.get_content()[:4] == b"\x89PNG"
        assert HOSTILE not in body and HOSTILE not in text.get_content()
    # a team gets only its slice
    alpha_html = alpha.get_body(("html",)).get_content()  # type: ignore[union-attr]
    assert "train" in alpha_html and "&lt;script&gt;" not in alpha_html
    assert "&lt;script&gt;" in platform.get_body(("html",)).get_content()  # type: ignore[union-attr]
    # the password appears in no log line
    assert PASSWORD not in caplog.text
    assert all(PASSWORD not in str(getattr(r, "ctx", "")) for r in caplog.records)


def test_wrong_password_is_refused_without_printing_it(small_warehouse: Path,
                                                       smtp_server: tuple[Inbox, int, Path],
                                                       tmp_path: Path,
                                                       caplog: pytest.LogCaptureFixture) -> None:
    _, port, ca_file = smtp_server
    secret = tmp_path / "password"
    secret.write_text("not-the-password\n")
    cfg = config(port, ca_file)
    cfg = cfg.model_copy(update={"report": cfg.report.model_copy(update={
        "smtp": cfg.report.smtp.model_copy(update={"password_file": secret})})})
    store = DuckDBStore(small_warehouse)
    r = build(store, parse_week("2026-W47"), {}, 0.995, "c")
    with caplog.at_level(logging.DEBUG), pytest.raises(smtplib.SMTPAuthenticationError):
        mail.send(mail.messages(r, {}, cfg.report), cfg.report.smtp)
    assert "not-the-password" not in caplog.text


def test_line_breaks_never_reach_a_header(small_warehouse: Path) -> None:
    cfg = load_config(None, {"report": {"platform_recipients": ["p@example.com"]}})
    store = DuckDBStore(small_warehouse)
    r = build(store, parse_week("2026-W47"), {}, 0.995, "c\r\nBcc: evil@example.com")
    with pytest.raises(ValueError, match="line break"):
        mail.compose(r, cfg.report, cfg.report.platform_recipients, charts={})
