"""``gke-gpu-exporter report weekly``: build the platform report and every team's slice,
write them, and mail them."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable
from pathlib import Path

from analytics import mail, render
from analytics.report import WeeklyReport, build
from analytics.store import Store
from analytics.week import Week
from exporter.config import Config


def team_dir(team: str) -> str:
    """A file name for any team name (hostile ones included), unique per team."""
    slug = re.sub(r"[^A-Za-z0-9_.-]+", "_", team).strip("._")[:48] or "team"
    return f"{slug}-{hashlib.sha256(team.encode()).hexdigest()[:8]}"


def run_weekly(store: Store, week: Week, cfg: Config, prices: dict[tuple[str, str], float],
               out: Path | None, email: bool,
               step: Callable[[str], None] = lambda _: None) -> WeeklyReport:
    step("platform report")
    platform = build(store, week, prices, cfg.sla.target, cfg.cluster)
    found = [str(t) for t in platform.frame("cost_by_team").team if t != "(none)"]
    teams: dict[str, WeeklyReport] = {}
    for team in sorted(set(found) | set(cfg.report.team_recipients)):
        step(f"team {team}")
        teams[team] = build(store, week, prices, cfg.sla.target, cfg.cluster, team=team)
    if out is not None:
        step("writing")
        render.write(platform, out)
        for team, r in teams.items():
            render.write(r, out / "teams" / team_dir(team))
    if email:
        step("sending")
        mail.send(mail.messages(platform, teams, cfg.report), cfg.report.smtp)
    return platform
