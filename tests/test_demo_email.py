"""The demo week's email, as the demo writes it (``demo-out/email/``): whole in Gmail (its
HTML under the size at which Gmail clips), under 500 KB, and readable in a 700 px reading
pane and on a 375 px phone. The week runs at 30-minute steps: the same jobs, pools and
teams as at the demo's 5 minutes, so the same tables, in a fraction of the time."""

from __future__ import annotations

import email
import email.policy
import importlib.util
from email.message import EmailMessage
from pathlib import Path
from types import ModuleType

import pytest

from analytics.charts import CHARTS
from exporter.cli import main
from tests.layout import layout_problems

ROOT = Path(__file__).resolve().parent.parent
HTML_MOST = 100_000
"""Bytes of the HTML part, decoded: Gmail clips a message whose HTML passes about 102 KB."""
MESSAGE_MOST = 500_000


def _screenshots() -> ModuleType:
    spec = importlib.util.spec_from_file_location("screenshots", ROOT / "docs" / "screenshots.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def demo_email(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("demo")
    assert main(["demo", "--step", "30m", "--out", str(out)]) == 0
    return out / "email"


def test_the_demo_week_email_arrives_whole(demo_email: Path) -> None:
    raw = (demo_email / "email.eml").read_bytes()
    msg = email.message_from_bytes(raw, policy=email.policy.default)
    assert isinstance(msg, EmailMessage)
    html = msg.get_body(("html",))
    assert html is not None
    assert len(html.get_content().encode()) < HTML_MOST
    assert len(raw) < MESSAGE_MOST
    assert msg["To"] is None, "the demo configures no recipient"
    # the week's 1,200-odd workloads: their first rows attached, all of them in the folder
    attached = [p.get_filename() or "" for p in msg.iter_attachments()]
    assert any(a.startswith("bottlenecks-first-") for a in attached), attached
    assert "all of them in bottlenecks.csv in the report folder." in html.get_content()
    assert f"Every row of every table, as CSV: {demo_email.parent / 'report'}" in \
        html.get_content()
    assert sorted(p.name for p in demo_email.iterdir()) == \
        sorted(["email.eml", "email.html", *(f"{c}.png" for c in CHARTS)])


def test_the_demo_week_email_holds_to_the_layout_rule(demo_email: Path) -> None:
    assert layout_problems((demo_email / "email.html").read_text()) == []


@pytest.mark.parametrize("width", [700, 375])
def test_the_demo_week_email_fits_the_window_in_chromium(demo_email: Path, width: int) -> None:
    """What does not fit scrolls in its table's own box: the page is never wider than the
    reading pane or the phone."""
    shots = _screenshots()
    chrome = shots.browser()
    if chrome is None:
        pytest.skip("no headless Chromium on this machine (apt-get install "
                    "chromium-headless-shell)")
    laid, window = shots.page_width(chrome, demo_email / "email.html", width)
    assert window == width
    assert laid <= window
