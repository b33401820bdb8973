"""The report by email: an HTML body with its charts inline (by Content-ID), the Markdown
as the plain-text alternative; one platform-wide message and one per team, each team's
recipients getting only their slice. SMTP with STARTTLS or SSL; the password comes from
the environment or a mounted secret file and never reaches a log line."""

from __future__ import annotations

import logging
import smtplib
import ssl
from collections.abc import Sequence
from email.message import EmailMessage
from email.utils import make_msgid

from analytics import render
from analytics.charts import render_all
from analytics.report import WeeklyReport
from exporter.config import Report as ReportConfig
from exporter.config import Smtp
from exporter.errors import ConfigError
from exporter.logs import ctx

log = logging.getLogger(__name__)


def _header(value: str, what: str) -> str:
    if "\r" in value or "\n" in value:
        raise ValueError(f"{what} contains a line break")
    return value


def compose(report: WeeklyReport, cfg: ReportConfig, recipients: Sequence[str],
            charts: dict[str, bytes] | None = None) -> EmailMessage:
    """One message: text (Markdown) and HTML alternatives, the charts related to the HTML."""
    charts = charts if charts is not None else render_all(report)
    msg = EmailMessage()
    scope = f"team {report.team}" if report.team else f"{report.cluster}, all teams"
    msg["Subject"] = _header(cfg.subject.format(week=report.week.label, scope=scope),
                             "subject")
    msg["From"] = _header(cfg.sender, "sender")
    msg["To"] = ", ".join(_header(r, "recipient") for r in recipients)
    cids = {name: make_msgid(domain="gke-gpu-exporter") for name in charts}
    msg.set_content(render.markdown(report))
    msg.add_alternative(render.html_page(report, {k: f"cid:{v[1:-1]}" for k, v in cids.items()}),
                        subtype="html")
    html_part = msg.get_payload()[1]  # type: ignore[index]
    assert isinstance(html_part, EmailMessage)
    for name, png in charts.items():
        html_part.add_related(png, maintype="image", subtype="png", cid=cids[name],
                              filename=f"{name}.png", disposition="inline")
    return msg


def messages(platform: WeeklyReport, teams: dict[str, WeeklyReport],
             cfg: ReportConfig) -> list[EmailMessage]:
    """The platform report to its recipients; each team's slice to that team's."""
    out = []
    if cfg.platform_recipients:
        out.append(compose(platform, cfg, cfg.platform_recipients))
    for team, recipients in sorted(cfg.team_recipients.items()):
        if recipients and team in teams:
            out.append(compose(teams[team], cfg, recipients))
    return out


def password(smtp: Smtp) -> str | None:
    if smtp.password is not None:
        return smtp.password.get_secret_value()
    if smtp.password_file is not None:
        try:
            return smtp.password_file.read_text().strip()
        except OSError as exc:
            raise ConfigError(f"cannot read the SMTP password file {smtp.password_file}: "
                              f"{exc.strerror}") from None
    return None


def send(msgs: Sequence[EmailMessage], smtp: Smtp) -> None:
    """Deliver over one SMTP connection (blocking: run it in a thread from async code)."""
    if not msgs:
        return
    context = ssl.create_default_context(
        cafile=str(smtp.ca_file) if smtp.ca_file is not None else None)
    client: smtplib.SMTP
    if smtp.security == "ssl":
        client = smtplib.SMTP_SSL(smtp.host, smtp.port, timeout=smtp.timeout, context=context)
    else:
        client = smtplib.SMTP(smtp.host, smtp.port, timeout=smtp.timeout)
    with client:
        if smtp.security == "starttls":
            client.starttls(context=context)
        secret = password(smtp)
        if smtp.username and secret is not None:
            client.login(smtp.username, secret)
        for m in msgs:
            client.send_message(m)
            log.info("report sent", extra=ctx(to=m["To"], subject=m["Subject"],
                                              server=f"{smtp.host}:{smtp.port}"))
