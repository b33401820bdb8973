"""The report's first lines, written from its own tables (``analytics.story``): each
figure in them is the tables' figure."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from analytics import render, story
from analytics.headline_text import headline_items
from tests.analytics.test_report import report


def test_the_story_says_what_the_tables_say(small_warehouse: Path) -> None:
    r = report(small_warehouse)
    said = story.story(r)
    h = r.headline
    teams = r.frame("cost_by_team").sort_values("cost_usd", ascending=False)
    assert said[0].startswith(f"The cluster's GPUs cost ${h['cost_usd']:,.0f} this week for "
                              f"{h['gpu_hours']:,.0f} GPU-hours")
    assert f"{teams.team.iloc[0]} spent the most: ${teams.cost_usd.iloc[0]:,.0f}" in said[0]
    assert f"${h['unallocated_cost_usd']:,.0f} for GPUs no pod held" in said[1]


def test_a_team_s_story_is_of_that_team(small_warehouse: Path) -> None:
    r = report(small_warehouse, team="alpha")
    said = story.story(r)
    assert said[0].startswith("Team alpha's GPUs cost")
    assert "spent the most" not in said[0] and "no pod held" not in " ".join(said)


@pytest.mark.parametrize(("waits", "words"), [
    ([("no_capacity", 30.0), ("starting", 10.0)],
     "Pods waited 40 GPU-hours for GPUs; 75% of that because the pools they fit were full."),
    ([("fragmented", 1.0)], "Pods waited 1 GPU-hours for GPUs; 100% of that because GPUs "
     "were free, but not enough of them on one node."),
    ([], None),
])
def test_the_waits_are_told_by_their_main_cause(small_warehouse: Path,
                                                waits: list[tuple[str, float]],
                                                words: str | None) -> None:
    r = report(small_warehouse)
    r.tables["waits"] = pd.DataFrame(waits, columns=["cause", "gpu_hours"])
    assert story._waited(r) == words


@pytest.mark.parametrize(("why", "tail"), [
    ("Weighed 3 settings, replayed: ...", "saving $900 a week (its replay's figure)."),
    ("idle cost of pods under 30% utilisation", "saving $900 a week (an estimate: not "
     "replayed)."),
])
def test_the_change_worth_the_most_says_whether_a_replay_priced_it(
        small_warehouse: Path, why: str, tail: str) -> None:
    r = report(small_warehouse)
    r.tables["actions"] = pd.DataFrame({
        "action": ["set p to autoscale 0-2 nodes", "move batch Jobs to spot"],
        "where": ["p (nvidia-l4)", "all pools"], "weekly_saving_usd": [900.0, None],
        "why": [why, "Trade-off, replayed"]})
    said = story._change(r)
    assert said is not None and said.startswith(
        "The change worth the most: set p to autoscale 0-2 nodes (p (nvidia-l4))")
    assert said.endswith(tail)


def test_the_contents_lead_to_every_section(small_warehouse: Path) -> None:
    r = report(small_warehouse)
    page = render.html_page(r, {k: f"{k}.png" for k in render.CHARTS})
    text = render.markdown(r)
    for name in r.tables:
        anchor = story.slug(r.section_title(name))
        assert f'href="#{anchor}"' in page and f'<h2 id="{anchor}">' in page
        assert f"(#{anchor})" in text


def test_a_team_s_headline_has_no_fleet_lines(small_warehouse: Path) -> None:
    """A team holds no GPU nobody held, and its cost per utilised GPU-hour is its own."""
    team = dict(headline_items(report(small_warehouse, team="alpha")))
    fleet = dict(headline_items(report(small_warehouse)))
    assert "Unallocated capacity" in fleet and "Unallocated capacity" not in team
    assert "Fleet cost per utilised GPU-hour" in fleet
    assert "Cost per utilised GPU-hour" in team
    assert "Held GPUs' unused time" in team and "Held GPUs' unused time" in fleet
