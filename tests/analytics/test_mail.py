"""The report by email, received by a real SMTP server on loopback and parsed back."""

from __future__ import annotations

import email
import email.policy
import logging
import re
import socket
from collections.abc import Iterator
from email.message import EmailMessage
from email.utils import parsedate_to_datetime
from pathlib import Path
from typing import Any

import pytest
from aiosmtpd.controller import Controller

from analytics import headline_text, mail, mail_parts
from analytics.charts import CHARTS
from analytics.render import md
from analytics.report import build
from analytics.store import DuckDBStore
from analytics.week import parse_week
from analytics.weekly import run_weekly, team_dir
from exporter.cli import main
from exporter.config import Config, load_config
from exporter.errors import ConfigError
from exporter.model.prices import load_price_book
from tests.analytics.conftest import HOSTILE, PASSWORD, REFUSED_DOMAIN, Inbox
from tests.analytics.conftest import _auth as auth
from tests.layout import layout_problems


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
    monkeypatch.setattr(mail_parts, "ROWS", 2)  # tables longer than the email shows
    cfg = config(port, ca_file)
    store = DuckDBStore(small_warehouse)
    with caplog.at_level(logging.DEBUG):
        report, mailed = run_weekly(store, parse_week("2026-W47"), cfg,
                                    load_price_book(None, "us-central1"), tmp_path,
                                    email=True)
    store.close()
    assert mailed == 3
    by_rcpt = {tuple(rcpts): msg for rcpts, msg in inbox.messages}
    assert set(by_rcpt) == {("platform@example.com",), ("alpha-lead@example.com",),
                            ("hostile-lead@example.com",)}
    platform, alpha = by_rcpt[("platform@example.com",)], by_rcpt[("alpha-lead@example.com",)]
    cost = report.headline["cost_usd"]
    assert cost is not None and cost > 0
    assert platform["Subject"] == \
        f"GPU cost and bottleneck report 2026-W47 — c, all teams: ${cost:,.0f}"
    assert re.fullmatch(r"GPU cost and bottleneck report 2026-W47 — team alpha: \$[\d,]+",
                        alpha["Subject"])
    ids = {msg["Message-ID"] for msg in by_rcpt.values()}
    assert len(ids) == 3 and all(i.endswith("@example.com>") for i in ids)
    for msg in by_rcpt.values():
        assert msg["Auto-Submitted"] == "auto-generated"
        assert parsedate_to_datetime(msg["Date"]).tzinfo is not None
        text = msg.get_body(("plain",))
        html = msg.get_body(("html",))
        assert text is not None and html is not None
        body = html.get_content()
        images = [p for p in msg.walk() if p.get_content_type() == "image/png"]
        assert len(images) == len(CHARTS)
        for img in images:
            cid = img["Content-ID"].strip("<>")
            assert f'src="cid:{cid}"' in body
            assert img.get_content()[:4] == b"\x89PNG"
        assert HOSTILE not in body and HOSTILE not in text.get_content()
        # under the headline, what the costs are priced on
        basis = "Prices: GPU component only, at list prices of us-central1 from the price book"
        assert basis in text.get_content() and basis in body
        # each table cut says so and where all its rows are: the folder the report was
        # written to, and here (tables this short) the CSV attached whole
        folder = re.search(r"Every row of every table, as CSV: `([^`]+)`", text.get_content())
        assert folder is not None
        assert Path(folder[1]) == (tmp_path if msg is platform else
                                   tmp_path / "teams" / team_dir(HOSTILE if "hostile" in
                                                                 msg["To"] else "alpha"))
        cut = re.findall(r"2 of \d+ rows shown; all of them in the attached `([a-z_]+\.csv)` "
                         r"and in the report folder\.", text.get_content())
        attached = {p.get_filename() or "": p for p in msg.iter_attachments()}
        assert set(attached) == set(cut) and cut
        for name, part in attached.items():
            assert part.get_content_type() == "text/csv"
            assert part.get_content() == (Path(folder[1]) / name).read_text()
    line = headline_text.basis_line(report)
    assert line is not None and md(line) in platform.get_body(  # type: ignore[union-attr]
        ("plain",)).get_content()
    # a team gets only its slice
    alpha_html = alpha.get_body(("html",)).get_content()  # type: ignore[union-attr]
    assert "train" in alpha_html and "&lt;script&gt;" not in alpha_html
    # with its own what to do, first
    alpha_text = alpha.get_body(("plain",)).get_content()  # type: ignore[union-attr]
    headings = [line[3:] for line in alpha_text.splitlines() if line.startswith("## ")]
    assert headings[0] == "What to do this week"
    assert "| move batch Jobs to spot | all pools |" in alpha_text
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
    with caplog.at_level(logging.DEBUG), pytest.raises(
            mail.MailError, match=f"SMTP server 127.0.0.1:{port} refused the login of 'reports'"
    ) as caught:
        mail.send(mail.messages(r, {}, cfg.report), cfg.report.smtp)
    assert "not-the-password" not in caplog.text + str(caught.value)


def test_a_refused_recipient_is_an_error_naming_it(small_warehouse: Path,
                                                   smtp_server: tuple[Inbox, int, Path],
                                                   tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """The others still get their report; "mailed" is never said of a refused one."""
    inbox, port, ca_file = smtp_server
    monkeypatch.setenv("GKE_GPU_EXPORTER_REPORT__SMTP__PASSWORD", PASSWORD)
    cfg = config(port, ca_file, platform_recipients=[f"gone@{REFUSED_DOMAIN}"],
                 team_recipients={"alpha": ["alpha-lead@example.com"]})
    store = DuckDBStore(small_warehouse)
    with pytest.raises(mail.MailError, match=f"127.0.0.1:{port} refused gone@{REFUSED_DOMAIN} "
                       r"\(550 5\.1\.1 no such user here\)"):
        run_weekly(store, parse_week("2026-W47"), cfg, {}, None, email=True)
    store.close()
    assert [rcpts for rcpts, _ in inbox.messages] == [["alpha-lead@example.com"]]


def test_an_unreachable_server_is_named(small_warehouse: Path) -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens there once closed
    cfg = load_config(None, {"report": {"platform_recipients": ["p@example.com"],
                                        "smtp": {"host": "127.0.0.1", "port": port}}})
    store = DuckDBStore(small_warehouse)
    r = build(store, parse_week("2026-W47"), {}, 0.995, "c")
    with pytest.raises(mail.MailError, match=f"SMTP server 127.0.0.1:{port}: .*refused"):
        mail.send(mail.messages(r, {}, cfg.report), cfg.report.smtp)


@pytest.mark.parametrize(("report", "error"), [
    ({"platform_recipients": [], "team_recipients": {}}, "nobody to mail the report to"),
    ({"team_recipients": {"alpha": ["a@example.com"], "nobody-here": ["n@example.com"]}},
     "names 'nobody-here', which had no GPU time in 2026-W47; teams that week: "),
], ids=["no recipients", "unknown team"])
def test_mailing_nobody_or_an_unknown_team_is_refused_before_sending(
        small_warehouse: Path, smtp_server: tuple[Inbox, int, Path],
        report: dict[str, Any], error: str) -> None:
    inbox, port, ca_file = smtp_server
    cfg = config(port, ca_file, **report)
    store = DuckDBStore(small_warehouse)
    with pytest.raises(ConfigError, match=re.escape(error)):
        run_weekly(store, parse_week("2026-W47"), cfg, {}, None, email=True)
    store.close()
    assert inbox.messages == []


def test_a_subject_template_with_an_unknown_placeholder_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"report: subject .*placeholders are .*'month'"):
        load_config(None, {"report": {"subject": "GPU report {month}"}})


def test_line_breaks_never_reach_a_header(small_warehouse: Path) -> None:
    """A cluster's name is the subject's; its line breaks read as spaces there."""
    cfg = load_config(None, {"report": {"platform_recipients": ["p@example.com"]}})
    store = DuckDBStore(small_warehouse)
    r = build(store, parse_week("2026-W47"), {}, 0.995,
              only_cluster="c\r\nBcc: evil@example.com")
    msg = mail.compose(r, cfg.report, cfg.report.platform_recipients,
                       charts=dict.fromkeys(CHARTS, b""))
    assert msg["Bcc"] is None
    assert "c  Bcc: evil@example.com, all teams" in str(msg["Subject"])
    with pytest.raises(ValueError, match="line break"):
        mail.compose(r, cfg.report.model_copy(update={"sender": "a@b\r\nBcc: e@x"}),
                     cfg.report.platform_recipients, charts=dict.fromkeys(CHARTS, b""))


@pytest.mark.parametrize("login", [
    {"username": "reports"},
    {"username": "reports", "password": PASSWORD},
    {"password_file": "/run/secrets/smtp/password"},
], ids=["username", "username and password", "password file"])
def test_a_login_over_security_none_is_refused(login: dict[str, str]) -> None:
    with pytest.raises(ConfigError) as caught:
        load_config(None, {"report": {"smtp": {"security": "none"} | login}})
    lines = str(caught.value).splitlines()
    assert [line for line in lines if "in clear" in line] == [
        "config: report.smtp: a login over security: none sends the password in clear; use "
        "starttls or ssl (or set allow_plaintext_auth: true)"]


def test_security_none_without_a_login_is_allowed() -> None:
    assert load_config(None, {"report": {"smtp": {"security": "none"}}}).report.smtp.security \
        == "none"


@pytest.fixture
def plaintext_smtp_server() -> Iterator[tuple[Inbox, int]]:
    """A server that offers no TLS and takes AUTH PLAIN in clear."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    inbox = Inbox()
    controller = Controller(inbox, hostname="127.0.0.1", port=port, authenticator=auth,
                            auth_require_tls=False)
    controller.start()
    yield inbox, port
    controller.stop()


def test_an_allowed_login_in_clear_is_sent_and_warned_about_at_each_send(
        small_warehouse: Path, plaintext_smtp_server: tuple[Inbox, int],
        caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    inbox, port = plaintext_smtp_server
    monkeypatch.setenv("GKE_GPU_EXPORTER_REPORT__SMTP__PASSWORD", PASSWORD)
    cfg = load_config(None, {"report": {
        "platform_recipients": ["platform@example.com"],
        "smtp": {"host": "127.0.0.1", "port": port, "security": "none",
                 "username": "reports", "allow_plaintext_auth": True}}})
    store = DuckDBStore(small_warehouse)
    r = build(store, parse_week("2026-W47"), {}, 0.995, "c")
    store.close()
    with caplog.at_level(logging.INFO):
        for _ in range(2):
            assert mail.send(mail.messages(r, {}, cfg.report), cfg.report.smtp) == 1
    assert len(inbox.messages) == 2
    warned = [rec for rec in caplog.records if rec.getMessage() == "smtp login in clear"]
    assert len(warned) == 2 and all(rec.levelno == logging.WARNING for rec in warned)
    assert PASSWORD not in caplog.text


def preview_config(tmp_path: Path, port: int, ca_file: Path) -> Path:
    path = tmp_path / "config.yaml"
    path.write_text(f"""
cluster: c
report:
  sender: gpu-reports@example.com
  platform_recipients: [platform@example.com]
  team_recipients:
    alpha: [alpha-lead@example.com]
  smtp: {{host: 127.0.0.1, port: {port}, security: starttls, username: reports,
          ca_file: "{ca_file}"}}
""")
    return path


def test_the_email_preview_is_what_the_server_receives(small_warehouse: Path,
                                                       smtp_server: tuple[Inbox, int, Path],
                                                       tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """``report weekly --email --email-preview DIR``: each message written as the bytes the
    SMTP server received, and its HTML beside its charts, for a browser."""
    inbox, port, ca_file = smtp_server
    monkeypatch.setenv("GKE_GPU_EXPORTER_REPORT__SMTP__PASSWORD", PASSWORD)
    preview = tmp_path / "preview"
    assert main(["report", "weekly", "--week", "2026-W47", "--store",
                 f"duckdb:{small_warehouse}", "--out", str(tmp_path / "out"),
                 "--config", str(preview_config(tmp_path, port, ca_file)),
                 "--whatif-budget", "0", "--email", "--email-preview", str(preview)]) == 0
    folders = {"platform@example.com": preview,
               "alpha-lead@example.com": preview / "teams" / team_dir("alpha")}
    assert sorted(to for (to,), _ in inbox.messages) == sorted(folders)
    for to, folder in folders.items():
        eml = (folder / "email.eml").read_bytes()
        assert eml == inbox.raw[to]
        msg = email.message_from_bytes(eml, policy=email.policy.default)
        assert isinstance(msg, EmailMessage) and msg["To"] == to
        page = (folder / "email.html").read_text()
        html = msg.get_body(("html",))
        assert html is not None
        by_file = html.get_content().replace("\r\n", "\n")
        for part in msg.walk():
            if part["Content-ID"]:
                by_file = by_file.replace(f"cid:{part['Content-ID'][1:-1]}", part.get_filename())
        assert page == by_file and "cid:" not in page
        images = re.findall(r'<img src="([^"]+)"', page)
        assert sorted(images) == sorted(f"{c}.png" for c in CHARTS)
        for name in images:
            png = (folder / name).read_bytes()
            assert png[:4] == b"\x89PNG"
            assert png in [p.get_content() for p in msg.walk()
                           if p.get_content_type() == "image/png"]
        assert layout_problems(page) == []
    assert set(p.name for p in preview.iterdir()) == \
        {"email.eml", "email.html", "teams", *(f"{c}.png" for c in CHARTS)}


def test_the_email_preview_needs_no_server_nor_recipients(small_warehouse: Path,
                                                          tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str]
                                                          ) -> None:
    """With no recipients configured, the platform report's message, addressed to nobody;
    no SMTP server is asked."""
    preview = tmp_path / "preview"
    assert main(["report", "weekly", "--week", "2026-W47", "--store",
                 f"duckdb:{small_warehouse}", "--out", str(tmp_path / "out"),
                 "--whatif-budget", "0", "--email-preview", str(preview)]) == 0
    assert f"Email preview in {preview}/" in capsys.readouterr().out
    assert sorted(p.name for p in preview.iterdir()) == \
        sorted(["email.eml", "email.html", *(f"{c}.png" for c in CHARTS)])
    msg = email.message_from_bytes((preview / "email.eml").read_bytes(),
                                   policy=email.policy.default)
    assert msg["To"] is None
    assert msg["Subject"].startswith("GPU cost and bottleneck report 2026-W47 — c, all teams")
    text = msg.get_body(("plain",))
    assert text is not None
    assert f"Every row of every table, as CSV: `{(tmp_path / 'out').absolute()}`" in \
        text.get_content()
