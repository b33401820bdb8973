"""``gke-gpu-exporter report weekly``: build the platform report and every team's slice,
write them, and mail them (or write the messages for a person to open)."""

from __future__ import annotations

import hashlib
import logging
import re
from collections.abc import Callable, Mapping
from pathlib import Path

import pandas as pd

from analytics import mail, render
from analytics.figures.cost import POOLED
from analytics.figures.headline import Pricing
from analytics.report import SECTIONS, WeeklyReport, build
from analytics.store import Store
from analytics.week import Week
from analytics.whatif.priced import priced
from exporter.config import Config
from exporter.errors import ConfigError
from exporter.logs import ctx
from exporter.model.prices import PriceBook

log = logging.getLogger(__name__)


def team_dir(team: str) -> str:
    """A file name for any team name (hostile ones included), unique per team."""
    slug = re.sub(r"[^A-Za-z0-9_.-]+", "_", team).strip("._")[:48] or "team"
    return f"{slug}-{hashlib.sha256(team.encode()).hexdigest()[:8]}"


class ThinWeek(Exception):
    """The week has too little data for a report that says what it cost."""

    def __init__(self, message: str, coverage: float) -> None:
        super().__init__(message)
        self.coverage = coverage
        """The share of the week's hours with data, 0 to 1."""


def reconcile_with_bill(report: WeeklyReport, store: Store, week: Week, cfg: Config,
                        cluster: str | None,
                        prices: Mapping[tuple[str, str], float]) -> None:
    """Add the week's reconciliation with ``report.billing_table`` to the platform report;
    bill lines converted from another currency or left out as implausible are logged."""
    from analytics import reconcile
    from exporter.sinks.bigquery import make_client

    table = cfg.report.billing_table
    assert table is not None
    bq = cfg.warehouse.bigquery.model_copy(update={"project": table.split(".", 1)[0]})
    bill = reconcile.BillingExport(make_client(bq), table)
    checked = reconcile.check(bill.gpu_lines(week.start, week.end, cluster,
                                             reconcile.cost_bound(prices)))
    if checked.note():
        log.warning("reconciliation: bill lines converted or left out", extra=ctx(
            week=week.label, table=table, note=checked.note()))
    found = reconcile.compare(reconcile.ours(store, week.start, week.end, cluster),
                              checked.lines)
    report.tables = {name: found if name == "reconciliation" else report.tables[name]
                     for name in SECTIONS if name in report.tables or name == "reconciliation"}


Replays = Callable[[WeeklyReport], dict[str, pd.DataFrame]]
"""What the platform report's actions do, replayed, and the settings weighed per pool
(``exporter.whatif.replay_levers``): the ``replayed`` and ``settings`` tables."""
ReplaysOf = Callable[[Store, Week, Config], Replays]
"""The replays of a week in a warehouse."""


def run_weekly(store: Store, week: Week, cfg: Config,
               prices: PriceBook | Mapping[tuple[str, str], float],
               out: Path | None, email: bool,
               step: Callable[[str], None] = lambda _: None,
               force: bool = False, cluster: str | None = None,
               replays: Replays | None = None,
               preview: Path | None = None) -> tuple[WeeklyReport, int]:
    """The platform report, written to ``out`` with each team's slice, and (with
    ``email``) mailed; with the number of recipients the SMTP server accepted. ``preview``:
    the messages written there instead of (or as well as) sent (``mail.write_preview``),
    the platform's in the folder itself and each team's in ``teams/<team>/``; where the
    config names no recipient, the platform's, addressed to nobody. Mailing
    nobody, or a team in ``report.team_recipients`` that had no GPU time that week, is a
    ``ConfigError`` before anything is sent; a refused message a ``mail.MailError``. A week
    with data for less than ``report.min_coverage`` of its hours is ``ThinWeek``, unless
    ``force``. ``cluster``: that cluster's rows only (default: every cluster's).
    ``prices``: the book the costs are priced with (the report states its basis: the
    book's dates, ``cfg.prices``' discounts), or list prices alone. ``replays``: the table
    of what the platform report's actions do, replayed (none without it)."""
    report_cfg = cfg.report
    if email and not report_cfg.platform_recipients and \
            not any(report_cfg.team_recipients.values()):
        raise ConfigError("nobody to mail the report to: set report.platform_recipients "
                          "or report.team_recipients")
    step("platform report")
    pricing = Pricing.of(prices, cfg.prices) if isinstance(prices, PriceBook) else \
        Pricing(prices)
    allocation = cfg.allocation.title if cfg.allocation.enabled else None
    carbon = cfg.carbon.in_force().basis
    platform = build(store, week, pricing, cfg.sla.target, cfg.cluster, only_cluster=cluster,
                     allocation=allocation, carbon=carbon)
    covered = platform.headline["coverage"] or 0.0
    if covered < report_cfg.min_coverage and not force:
        raise ThinWeek(f"{week.label}: the warehouse has data for {covered:.1%} of the "
                       f"week's hours, below report.min_coverage ({report_cfg.min_coverage:.0%})"
                       "; --force writes the report anyway", covered)
    found = sorted({str(t) for t in platform.frame("cost_by_team").team
                    if t != "(none)" and t not in POOLED})
    unknown = sorted(t for t, who in report_cfg.team_recipients.items()
                     if who and t not in found)
    if email and unknown:
        raise ConfigError(
            f"report.team_recipients names {', '.join(map(repr, unknown))}, which had no GPU "
            f"time in {week.label}; teams that week: {', '.join(map(repr, found)) or 'none'}")
    if report_cfg.billing_table:
        step("reconciling with the bill")
        try:
            reconcile_with_bill(platform, store, week, cfg, cluster,
                                prices.prices if isinstance(prices, PriceBook) else prices)
        except Exception as exc:  # the bill unreadable: the report goes out without it
            log.warning("report without reconciliation: the bill could not be read",
                        extra=ctx(week=week.label, table=report_cfg.billing_table,
                                  error=f"{type(exc).__name__}: {exc}"[:500]))
    if replays is not None:
        step("replaying the actions")
        try:
            replayed = replays(platform)
        except Exception as exc:  # a week the engine cannot replay: the report goes out
            log.warning("report without replays: the week could not be replayed",
                        extra=ctx(week=week.label, error=f"{type(exc).__name__}: {exc}"[:500]))
        else:
            platform.tables = {name: replayed[name] if name in replayed
                               else platform.tables[name] for name in SECTIONS
                               if name in platform.tables or name in replayed}
            platform.tables["actions"] = priced(platform.frame("actions"),
                                                replayed["replayed"], replayed["settings"])
    teams: dict[str, WeeklyReport] = {}
    for team in found:
        step(f"team {team}")
        teams[team] = build(store, week, pricing, cfg.sla.target, cfg.cluster, team=team,
                            only_cluster=cluster, allocation=allocation, carbon=carbon)
    folders: dict[str | None, Path] = {}
    if out is not None:
        step("writing")
        render.write(platform, out)
        folders[None] = out
        for team, r in teams.items():
            folders[team] = out / "teams" / team_dir(team)
            render.write(r, folders[team])
    if not email and preview is None:
        return platform, 0
    letters = mail.letters(platform, teams, report_cfg, folders, unaddressed=not email)
    if preview is not None:
        step("writing the email preview")
        for who, msg in letters.items():
            mail.write_preview(msg, preview if who is None else
                               preview / "teams" / team_dir(who))
    mailed = 0
    if email:
        step("sending")
        mailed = mail.send(list(letters.values()), report_cfg.smtp)
    return platform, mailed
