"""The weekly email as a reader sees it, in headless Chromium: a 700 px reading pane and a
375 px phone. From an email preview (``report weekly --email-preview DIR``, or the demo's
``demo-out/email/``)::

    .venv/bin/python docs/screenshots.py demo-out/email

checks at each width that the page is no wider than the window (what does not fit scrolls
inside its own table's box), then writes the top of the page at each width as
``docs/report-email.png`` (700 px) and ``docs/report-email-phone.png`` (375 px), in 256
colours. Needs Chromium (Debian: ``apt-get install chromium-headless-shell``)."""

from __future__ import annotations

import argparse
import io
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from PIL import Image

HERE = Path(__file__).parent
WIDTHS = {700: HERE / "report-email.png", 375: HERE / "report-email-phone.png"}
"""The window widths, and where each screenshot goes."""
HEIGHT = 1400
"""The height of the top of the page each screenshot shows, in CSS pixels."""
BROWSERS = ("chromium-headless-shell", "chromium", "chromium-browser", "google-chrome")
_MEASURE = ("<script>document.title = 'width ' + document.documentElement.scrollWidth + "
            "' of ' + window.innerWidth;</script>")


def browser() -> str | None:
    """A headless Chromium on this machine, if there is one."""
    return next((path for name in BROWSERS if (path := shutil.which(name))), None)


def _run(chrome: str, page: Path, width: int, *args: str) -> str:
    done = subprocess.run([chrome, "--headless", "--no-sandbox", "--disable-gpu",
                           "--hide-scrollbars", f"--window-size={width},{HEIGHT}", *args,
                           page.absolute().as_uri()],
                          capture_output=True, text=True, timeout=120, check=True)
    return done.stdout


def page_width(chrome: str, page: Path, width: int) -> tuple[int, int]:
    """How wide the page lays out in a window ``width`` CSS pixels wide, and the window's
    width as the page sees it."""
    copy = page.with_name(f".measure-{page.name}")  # beside it: its images load the same
    try:
        copy.write_text(page.read_text().replace("</body>", _MEASURE + "</body>"))
        dom = _run(chrome, copy, width, "--dump-dom")
    finally:
        copy.unlink(missing_ok=True)
    m = re.search(r"<title>width (\d+) of (\d+)</title>", dom)
    if m is None:
        raise RuntimeError(f"{chrome} did not lay out {page}")
    return int(m[1]), int(m[2])


def screenshot(chrome: str, page: Path, width: int, out: Path) -> int:
    """The top of the page at ``width`` as a PNG of 256 colours; its bytes."""
    with tempfile.TemporaryDirectory() as tmp:
        shot = Path(tmp) / "shot.png"
        _run(chrome, page, width, f"--screenshot={shot}")
        buf = io.BytesIO()
        with Image.open(shot) as image:
            image.convert("RGB").quantize(256, method=Image.Quantize.MEDIANCUT) \
                .save(buf, format="PNG", optimize=True)
    out.write_bytes(buf.getvalue())
    return len(buf.getvalue())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("preview", type=Path, help="an email preview folder (email.html)")
    args = parser.parse_args()
    chrome = browser()
    if chrome is None:
        print("no Chromium found: " + ", ".join(BROWSERS), file=sys.stderr)
        return 1
    page = args.preview / "email.html"
    wide = []
    for width, out in WIDTHS.items():
        laid, window = page_width(chrome, page, width)
        print(f"{width} px: the page lays out {laid} px wide in a window of {window} px")
        if laid > window:
            wide.append(width)
        print(f"  {out.relative_to(HERE.parent)}: {screenshot(chrome, page, width, out):,} B")
    if wide:
        print(f"wider than the window at {', '.join(map(str, wide))} px", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
