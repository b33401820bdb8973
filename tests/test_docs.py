"""The README and docs/ stay true to the product: the generated sections are what the code
declares now, the layout names every module, the README stays short, and every link leads
somewhere."""

from __future__ import annotations

import importlib.util
import re
from collections import Counter
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
README = ROOT / "README.md"
PAGES = [README, *sorted(DOCS.glob("*.md"))]
PACKAGES = ("exporter", "analytics", "simulator")
README_MAX_BYTES = 12_400


def _load(path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location("docs_build", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


BUILD = _load(DOCS / "build.py")


def prose(text: str) -> list[str]:
    """The page's lines outside fenced code blocks."""
    lines, fenced = [], False
    for line in text.splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced:
            lines.append(line)
    return lines


def headings(text: str, level: str = "#+") -> list[str]:
    return [m[2] for line in prose(text) if (m := re.match(rf"({level}) (.+)", line))]


def slug(heading: str) -> str:
    """The anchor GitHub gives a heading: its text, lower case, punctuation dropped, spaces
    as hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading).replace("`", "").strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(text: str) -> set[str]:
    """Every heading's anchor; a repeated one gets -1, -2, ... as on GitHub."""
    seen: Counter[str] = Counter()
    out = set()
    for heading in headings(text):
        base = slug(heading)
        out.add(f"{base}-{seen[base]}" if seen[base] else base)
        seen[base] += 1
    return out


def links(text: str) -> list[str]:
    """The targets of the page's Markdown links and images (not those in code)."""
    return [target for line in prose(text)
            for target in re.findall(r"\]\(([^)\s]+)\)", re.sub(r"`[^`]*`", "", line))]


def relative(target: str) -> bool:
    return not re.match(r"[a-z][a-z0-9+.-]*:", target)


# Generated sections


@pytest.mark.parametrize("name", BUILD.SECTIONS)
def test_generated_section_is_what_docs_build_writes(name: str) -> None:
    spec = BUILD.SECTIONS[name]
    page = (DOCS / spec.page).read_text()
    assert BUILD.section(page, name) == spec.render(), \
        f"docs/{spec.page}: section {name!r} is stale: python docs/build.py (make docs)"


@pytest.mark.parametrize("page", PAGES, ids=[p.name for p in PAGES])
def test_every_generated_section_is_closed(page: Path) -> None:
    text = page.read_text()
    begun = re.findall(r"^<!-- BEGIN (\S+) \(generated\) -->$", text, re.M)
    ended = re.findall(r"^<!-- END (\S+) \(generated\) -->$", text, re.M)
    assert begun == ended
    assert len(set(begun)) == len(begun)


# Layout


def layout() -> set[str]:
    """The modules named by the items of the Layout section of docs/architecture.md."""
    text = (DOCS / "architecture.md").read_text()
    section = text.split("\n## Layout\n", 1)[1].split("\n## ", 1)[0]
    return set(re.findall(r"^- `([\w/]+\.py)` — \S", section, re.M))


def modules() -> set[str]:
    return {p.relative_to(ROOT).as_posix() for package in PACKAGES
            for p in (ROOT / package).rglob("*.py")
            if p.name not in ("__init__.py", "__main__.py")}


def test_layout_names_every_module() -> None:
    assert sorted(modules() - layout()) == [], "modules without a line in docs/architecture.md"


def test_layout_names_no_module_that_does_not_exist() -> None:
    assert sorted(layout() - modules()) == [], "lines in docs/architecture.md for no module"


def test_every_package_of_the_exporter_has_its_heading_and_its_place_in_the_picture() -> None:
    """The Layout section groups the exporter's modules under a heading per package, and
    the Packages picture draws each package: both as the tree has them."""
    text = (DOCS / "architecture.md").read_text()
    packages = {p.parent.relative_to(ROOT).as_posix()
                for p in (ROOT / "exporter").glob("*/__init__.py")}
    headings = set(re.findall(r"^#### `(exporter/\w+)/`", text, re.M)) - {"exporter/data"}
    assert headings == packages
    picture = text.split("\n## Packages\n", 1)[1].split("\n## ", 1)[0]
    drawn = set(re.findall(r"\bexporter\.(\w+)\b", picture.split("```")[1]))
    assert {p.split("/")[1] for p in packages} <= drawn


# README


def test_readme_is_short() -> None:
    assert len(README.read_bytes()) <= README_MAX_BYTES


def test_readme_table_of_contents_lists_its_sections_in_order() -> None:
    text = README.read_text()
    top = text.split("\n## ", 1)[0]
    contents = re.findall(r"^- \[[^\]]+\]\(#([^)]+)\)$", top, re.M)
    assert contents, "no table of contents before the first section"
    assert contents == [slug(h) for h in headings(text, "##")]


# Links


@pytest.mark.parametrize("page", PAGES, ids=[p.name for p in PAGES])
def test_relative_links_lead_to_files_that_exist(page: Path) -> None:
    missing = [target for target in links(page.read_text())
               if relative(target) and not target.startswith("#")
               and not (page.parent / target.split("#", 1)[0]).exists()]
    assert missing == []


@pytest.mark.parametrize("page", PAGES, ids=[p.name for p in PAGES])
def test_links_to_a_heading_find_it(page: Path) -> None:
    broken = []
    for target in links(page.read_text()):
        path, _, anchor = target.partition("#")
        linked = page.parent / path if path else page
        if anchor and relative(target) and linked.suffix == ".md" and linked.exists() \
                and anchor not in anchors(linked.read_text()):
            broken.append(target)
    assert broken == []


NUMBERS = ("no", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten",
           "eleven", "twelve")


def test_the_readme_counts_the_dashboards_that_ship() -> None:
    shipped = len(list((ROOT / "dashboards").glob("*.json")))
    said = re.search(r"(\w+) Grafana dashboards", README.read_text())
    assert said is not None and said[1] == NUMBERS[shipped]
