"""The report by email: an HTML body with its charts inline (by Content-ID), the Markdown
as the plain-text alternative, the CSVs they cite attached; one platform-wide message and
one per team, each team's recipients getting only their slice. Each message has a
``Date``, a ``Message-ID`` of the sender's domain and ``Auto-Submitted: auto-generated``
(RFC 3834: no vacation replies to it); its subject carries the headline cost. SMTP with
STARTTLS or SSL (a login without either is refused unless ``allow_plaintext_auth`` says
otherwise, and then warned about at each send); the password comes from a mounted secret
file or the environment and never reaches a log line. A message counts as sent only once
the server has accepted it for every recipient; any failure names the server (``MailError``)."""

from __future__ import annotations

import logging
import smtplib
import ssl
from collections.abc import Sequence
from datetime import UTC, datetime
from email.message import EmailMessage
from email.utils import format_datetime, getaddresses, make_msgid

from analytics import format as fmt
from analytics import render
from analytics.charts import render_all
from analytics.report import WeeklyReport
from exporter.config import Report as ReportConfig
from exporter.config import Smtp
from exporter.errors import ConfigError
from exporter.files import Unreadable, read_secret
from exporter.logs import ctx

log = logging.getLogger(__name__)


class MailError(Exception):
    """The report could not be handed to the SMTP server (or not for every recipient)."""


def subject(template: str, week: str, scope: str, cost_usd: float | None) -> str:
    """``report.subject`` filled in: ``{week}``, ``{scope}`` and ``{cost}`` (the headline
    cost, to the dollar)."""
    return template.format(week=week, scope=scope,
                           cost="n/a" if cost_usd is None else f"${cost_usd:,.0f}")


def _header(value: str, what: str) -> str:
    if "\r" in value or "\n" in value:
        raise ValueError(f"{what} contains a line break")
    return value


def compose(report: WeeklyReport, cfg: ReportConfig, recipients: Sequence[str],
            charts: dict[str, bytes] | None = None) -> EmailMessage:
    """One message: text (Markdown) and HTML alternatives, the charts related to the HTML,
    the CSVs they cite attached (``render.cited_csvs``)."""
    charts = charts if charts is not None else render_all(report)
    msg = EmailMessage()
    scope = fmt.text(f"team {report.team}" if report.team else f"{report.cluster}, all teams")
    msg["Subject"] = _header(subject(cfg.subject, report.week.label, scope,
                                     report.headline.get("cost_usd")), "subject")
    msg["From"] = _header(cfg.sender, "sender")
    msg["To"] = ", ".join(_header(r, "recipient") for r in recipients)
    msg["Date"] = format_datetime(datetime.now(UTC))
    domain = cfg.sender.rpartition("@")[2] or "localhost"
    msg["Message-ID"] = make_msgid(domain=domain)
    msg["Auto-Submitted"] = "auto-generated"
    cids = {name: make_msgid(domain=domain) for name in charts}
    msg.set_content(render.markdown(report))
    msg.add_alternative(render.html_page(report, {k: f"cid:{v[1:-1]}" for k, v in cids.items()}),
                        subtype="html")
    html_part = msg.get_payload()[1]  # type: ignore[index]
    assert isinstance(html_part, EmailMessage)
    for name, png in charts.items():
        html_part.add_related(png, maintype="image", subtype="png", cid=cids[name],
                              filename=f"{name}.png", disposition="inline")
    for filename, data in render.cited_csvs(report).items():
        msg.add_attachment(data, maintype="text", subtype="csv", filename=filename)
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
            return read_secret(smtp.password_file)
        except Unreadable as exc:
            raise ConfigError(f"the SMTP password file {smtp.password_file}: {exc}") from None
    return None


def send(msgs: Sequence[EmailMessage], smtp: Smtp) -> int:
    """Deliver over one SMTP connection (blocking: run it in a thread from async code);
    the number of recipients the server accepted, every one of them. A refused recipient
    does not stop the other messages; it is a ``MailError`` once they are sent."""
    if not msgs:
        return 0
    server = f"{smtp.host}:{smtp.port}"
    secret = password(smtp)
    accepted, refused = 0, {}
    try:
        context = ssl.create_default_context(
            cafile=str(smtp.ca_file) if smtp.ca_file is not None else None)
        client: smtplib.SMTP
        if smtp.security == "ssl":
            client = smtplib.SMTP_SSL(smtp.host, smtp.port, timeout=smtp.timeout,
                                      context=context)
        else:
            client = smtplib.SMTP(smtp.host, smtp.port, timeout=smtp.timeout)
        with client:
            if smtp.security == "starttls":
                client.starttls(context=context)
            if smtp.username and secret is not None:
                if smtp.security == "none":
                    log.warning("smtp login in clear", extra=ctx(
                        server=server, username=smtp.username,
                        why="security: none with allow_plaintext_auth"))
                client.login(smtp.username, secret)
            for m in msgs:
                to = getaddresses([str(m["To"])])
                try:
                    these = client.send_message(m)
                except smtplib.SMTPRecipientsRefused as exc:
                    these = exc.recipients
                refused.update(these)
                accepted += len(to) - len(these)
                log.info("report sent", extra=ctx(to=m["To"], subject=m["Subject"],
                                                  server=server,
                                                  **({"refused": sorted(these)} if these else {})))
    except smtplib.SMTPAuthenticationError as exc:
        raise MailError(f"SMTP server {server} refused the login of {smtp.username!r}: "
                        f"{exc.smtp_code} {_text(exc.smtp_error)}") from exc
    except smtplib.SMTPResponseException as exc:
        raise MailError(f"SMTP server {server}: {exc.smtp_code} {_text(exc.smtp_error)}"
                        ) from exc
    except (smtplib.SMTPException, OSError) as exc:
        raise MailError(f"SMTP server {server}: {exc}") from exc
    if refused:
        raise MailError(f"SMTP server {server} refused " + ", ".join(
            f"{addr} ({code} {_text(text)})" for addr, (code, text) in sorted(refused.items())))
    return accepted


def _text(reply: bytes | str) -> str:
    return reply.decode(errors="replace") if isinstance(reply, bytes) else reply
