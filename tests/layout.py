"""The layout rule of the report's HTML (a page in a browser, the body of its email), read
from the markup itself: what lets it read in a 700 px reading pane and on a 375 px phone.

- no element is fixed wider than a phone: no ``width`` attribute and no CSS ``width`` or
  ``min-width`` over ``PHONE_PX`` (em counted at 16 px; percentages and ``max-width`` are
  fluid);
- every table sits in a box of its own that scrolls sideways (``overflow-x:auto``) and is
  never wider than the page (``max-width:100%``), inline so that a client that drops the
  style sheet keeps it;
- every image shrinks to the page (``max-width:100%``, ``height:auto``), inline too;
- the page declares the device's width as its viewport.
"""

from __future__ import annotations

import re
from html.parser import HTMLParser

PHONE_PX = 375
_EM_PX = 16
_LENGTH = re.compile(r"^(-?[\d.]+)(px|em|rem|pt)?$")
_WIDTH = re.compile(r"(?:^|[;{\s])((?:min-)?width)\s*:\s*([^;}]+)")


def _px(value: str) -> float | None:
    """A length in CSS pixels; None for one that is not fixed (a percentage, auto)."""
    m = _LENGTH.match(value.strip().removesuffix("!important").strip())
    if m is None:
        return None
    number, unit = float(m[1]), m[2] or "px"
    return number * {"px": 1.0, "em": _EM_PX, "rem": _EM_PX, "pt": 4 / 3}[unit]


def _styles(css: str) -> dict[str, str]:
    return {k.strip().lower(): v.strip().lower() for k, _, v in
            (d.partition(":") for d in css.split(";") if ":" in d)}


class _Rule(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.problems: list[str] = []
        self.stack: list[tuple[str, dict[str, str]]] = []
        self.in_style = False
        self.viewport = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = {k: v or "" for k, v in attrs}
        style = _styles(a.get("style", ""))
        where = f"<{tag}{''.join(f' {k}={v!r}' for k, v in a.items())}>"[:120]
        width = a.get("width")
        if width is not None and not width.endswith("%") and (_px(width) or 0) > PHONE_PX:
            self.problems.append(f"a fixed width: {where}")
        self._css(a.get("style", ""), where)
        if tag == "table":
            box = self.stack[-1] if self.stack else ("", {})
            box_style = _styles(box[1].get("style", ""))
            if box[0] != "div" or box_style.get("overflow-x") != "auto" or \
                    box_style.get("max-width") != "100%":
                self.problems.append(f"a table outside a box that scrolls sideways: {where}")
        if tag == "img" and (style.get("max-width") != "100%" or style.get("height") != "auto"):
            self.problems.append(f"an image that does not shrink to the page: {where}")
        if tag == "meta" and a.get("name") == "viewport" and \
                "width=device-width" in a.get("content", "").replace(" ", ""):
            self.viewport = True
        if tag == "style":
            self.in_style = True
        if tag not in ("meta", "img", "br", "hr", "link", "input", "col"):
            self.stack.append((tag, a))

    def handle_endtag(self, tag: str) -> None:
        if tag == "style":
            self.in_style = False
        while self.stack:
            if self.stack.pop()[0] == tag:
                break

    def handle_data(self, data: str) -> None:
        if self.in_style:
            self._css(data, "<style>")

    def _css(self, css: str, where: str) -> None:
        for prop, value in _WIDTH.findall(css):
            px = _px(value)
            if px is not None and px > PHONE_PX:
                self.problems.append(f"a fixed {prop} of {value.strip()}: {where}")


def layout_problems(html: str) -> list[str]:
    """What in ``html`` breaks the layout rule (the module's docstring); none: it holds."""
    rule = _Rule()
    rule.feed(html)
    rule.close()
    return rule.problems + ([] if rule.viewport else ["no viewport of the device's width"])
