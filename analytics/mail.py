"""The report by email: an HTML body with its charts inline (by Content-ID), the Markdown
as the plain-text alternative, the first rows of the tables longer than they show attached
(``mail_parts``), the report folder named for every row; one platform-wide message and one
per team, each team's recipients getting only their slice. A preview writes each message
as it would be sent, and its HTML with the charts beside it, for a browser.

Each message has a ``Date``, a ``Message-ID`` of the sender's domain and
``Auto-Submitted: auto-generated`` (RFC 3834: no vacation replies to it); its subject
carries the headline cost. SMTP with STARTTLS or SSL (a login without either is refused
unless ``allow_plaintext_auth`` says otherwise, and then warned about at each send); the
password comes from a mounted secret file or the environment and never reaches a log line.
A message counts as sent only once the server has accepted it for every recipient; any
failure names the server (``MailError``)."""

from __future__ import annotations

import io
import logging
import smtplib
import ssl
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from email.generator import BytesGenerator
from email.message import EmailMessage
from email.utils import format_datetime, getaddresses, make_msgid
from pathlib import Path

from analytics import format as fmt
from analytics import mail_parts, render
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
            charts: dict[str, bytes] | None = None,
            folder: Path | None = None) -> EmailMessage:
    """One message: text (Markdown) and HTML alternatives, the charts related to the HTML,
    the first rows of the tables cut attached (``mail_parts``); ``folder``: where the
    report was written, named as where every row is. No recipients: no ``To``."""
    charts = charts if charts is not None else render_all(report)
    msg = EmailMessage()
    scope = fmt.text(f"team {report.team}" if report.team else f"{report.cluster}, all teams")
    msg["Subject"] = _header(subject(cfg.subject, report.week.label, scope,
                                     report.headline.get("cost_usd")), "subject")
    msg["From"] = _header(cfg.sender, "sender")
    if recipients:
        msg["To"] = ", ".join(_header(r, "recipient") for r in recipients)
    msg["Date"] = format_datetime(datetime.now(UTC))
    domain = cfg.sender.rpartition("@")[2] or "localhost"
    msg["Message-ID"] = make_msgid(domain=domain)
    msg["Auto-Submitted"] = "auto-generated"
    cids = {name: make_msgid(domain=domain) for name in charts}
    where = None if folder is None else str(folder.absolute())
    rows = mail_parts.ROWS
    cuts = render.cuts(report, rows)
    attached = mail_parts.attachments(report, cuts)
    msg.set_content(render.markdown(report, mail_parts.notes(cuts, attached, where, "`"),
                                    where, rows))
    msg.add_alternative(render.html_page(report, {k: f"cid:{v[1:-1]}" for k, v in cids.items()},
                                         mail_parts.notes(cuts, attached, where), where, rows),
                        subtype="html")
    html_part = msg.get_payload()[1]  # type: ignore[index]
    assert isinstance(html_part, EmailMessage)
    for name, png in charts.items():
        html_part.add_related(png, maintype="image", subtype="png", cid=cids[name],
                              filename=f"{name}.png", disposition="inline")
    for a in attached.values():
        msg.add_attachment(a.data, maintype="text", subtype="csv", filename=a.filename)
    return msg


def letters(platform: WeeklyReport, teams: dict[str, WeeklyReport], cfg: ReportConfig,
            folders: Mapping[str | None, Path] | None = None,
            unaddressed: bool = False) -> dict[str | None, EmailMessage]:
    """The platform report to its recipients (key ``None``); each team's slice to that
    team's (key: the team). ``folders``: where each was written, by the same keys.
    ``unaddressed``: where the config names no recipient at all, the platform report's
    message anyway, to nobody (for a preview)."""
    where = folders or {}
    out: dict[str | None, EmailMessage] = {}
    if cfg.platform_recipients or (unaddressed and not any(cfg.team_recipients.values())):
        out[None] = compose(platform, cfg, cfg.platform_recipients, folder=where.get(None))
    for team, recipients in sorted(cfg.team_recipients.items()):
        if recipients and team in teams:
            out[team] = compose(teams[team], cfg, recipients, folder=where.get(team))
    return out


def messages(platform: WeeklyReport, teams: dict[str, WeeklyReport], cfg: ReportConfig,
             folders: Mapping[str | None, Path] | None = None) -> list[EmailMessage]:
    """The platform report to its recipients; each team's slice to that team's."""
    return list(letters(platform, teams, cfg, folders).values())


def wire(msg: EmailMessage) -> bytes:
    """The message as ``send`` hands it to the SMTP server (``smtplib``'s flattening, lines
    ending in CRLF)."""
    buf = io.BytesIO()
    BytesGenerator(buf).flatten(msg, linesep="\r\n")
    return buf.getvalue()


PREVIEW_EML = "email.eml"
PREVIEW_HTML = "email.html"


def write_preview(msg: EmailMessage, out: Path) -> list[Path]:
    """``msg`` into the folder ``out``, for a person to open: ``email.eml``, the bytes
    ``send`` would hand the server; ``email.html``, its HTML part with each inline image
    written beside it and referred to by file name instead of Content-ID. The paths
    written."""
    out.mkdir(parents=True, exist_ok=True)
    (out / PREVIEW_EML).write_bytes(wire(msg))
    html_part = msg.get_body(("html",))
    assert isinstance(html_part, EmailMessage)
    page = html_part.get_content()
    written = [out / PREVIEW_EML]
    for part in msg.walk():
        cid, filename = part["Content-ID"], part.get_filename()
        if cid is None or filename is None or part.get_content_maintype() != "image":
            continue
        path = out / Path(filename).name
        data = part.get_content()
        assert isinstance(data, bytes)
        path.write_bytes(data)
        page = page.replace(f'src="cid:{cid.strip("<>")}"', f'src="{path.name}"')
        written.append(path)
    (out / PREVIEW_HTML).write_text(page)
    return [*written, out / PREVIEW_HTML]


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
