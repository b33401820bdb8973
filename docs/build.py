"""The generated sections of the pages in ``docs/``: ``python docs/build.py`` (``make docs``)
rewrites each one from its single declaration in the code; a test checks the committed pages
are what this produces.

A generated section sits in a hand-written page between two marker lines::

    <!-- BEGIN configuration (generated) -->
    ...
    <!-- END configuration (generated) -->

Each entry of ``SECTIONS`` names a section, the page that holds it and the function that
renders it; adding a section is one function and one entry.
"""

from __future__ import annotations

import ast
import re
import sys
import textwrap
import types
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Annotated, Literal, NamedTuple, Union, get_args, get_origin

import annotated_types
import yaml
from pydantic import BaseModel, SecretStr
from pydantic.fields import FieldInfo

from analytics.tables import HEADLINE, PRICE_BASIS, Column
from analytics.tables import TABLES as REPORT_TABLES
from exporter.config import ENV_PREFIX, Config
from exporter.metrics.families import DEVICE_LABELS, FAMILIES, Family
from exporter.model.durations import parse_duration
from exporter.model.prices import load_price_book
from exporter.model.totals import QUEUE_BUCKETS
from exporter.sinks.schema import TABLES, Table

HERE = Path(__file__).parent


def markers(name: str) -> tuple[str, str]:
    """The lines that open and close the generated section ``name``."""
    return f"<!-- BEGIN {name} (generated) -->", f"<!-- END {name} (generated) -->"


def _span(text: str, name: str) -> re.Match[str] | None:
    begin, end = markers(name)
    return re.search(rf"^{re.escape(begin)}$(.*?)^{re.escape(end)}$", text, re.M | re.S)


def section(text: str, name: str) -> str | None:
    """The body of the generated section ``name`` in a page's text; None without one."""
    found = _span(text, name)
    return found[1].strip("\n") if found else None


def replace(text: str, name: str, body: str) -> str:
    """The page's text with the body of the section ``name`` replaced by ``body`` (a blank
    line on either side of it)."""
    found = _span(text, name)
    if found is None:
        raise ValueError(f"no section {name!r}: add the lines {' and '.join(markers(name))}")
    return f"{text[:found.start(1)]}\n\n{body}\n\n{text[found.end(1):]}"


def markdown(text: str) -> str:
    """A docstring as Markdown: one line, its reST literals (in double backquotes) as code."""
    return re.sub(r"``(.+?)``", r"`\1`", " ".join(text.split()))


def cell(text: str) -> str:
    """Text for one cell of a Markdown table: no bare ``|``."""
    return markdown(text).replace("|", "\\|")


def paragraph(text: str) -> str:
    """Prose as the pages wrap it, in lines of at most 92 characters."""
    return textwrap.fill(markdown(text), width=92, break_long_words=False,
                         break_on_hyphens=False)


def table(header: tuple[str, ...], rows: Sequence[tuple[str, ...]]) -> str:
    """A Markdown table of the cells given (each already one line)."""
    lines = [header, tuple("---" for _ in header), *rows]
    return "".join(f"| {' | '.join(line)} |\n" for line in lines)


# Configuration: every section and setting of ``exporter.config``.

def _attribute_docs(model: type[BaseModel]) -> tuple[str, dict[str, str]]:
    """A model class's docstring and its fields' attribute docstrings (the string literal
    that follows a field's declaration), read from its source."""
    source = Path(sys.modules[model.__module__].__file__ or "").read_text()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ClassDef) and node.name == model.__name__:
            docs = {}
            for stmt, after in zip(node.body, node.body[1:], strict=False):
                if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name) \
                        and isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant) \
                        and isinstance(after.value.value, str):
                    docs[stmt.target.id] = after.value.value
            return ast.get_docstring(node) or "", docs
    raise LookupError(f"no class {model.__name__} in {model.__module__}")


def _is_duration(field: FieldInfo) -> bool:
    return any(getattr(m, "func", None) is parse_duration for m in field.metadata)


_TYPE_NAMES: dict[object, str] = {str: "string", int: "integer", float: "number",
                                  bool: "boolean", Path: "path", SecretStr: "secret string"}


def type_name(tp: object) -> str:
    """A declared type in words: ``list[str]`` is a list of strings."""
    origin, args = get_origin(tp), get_args(tp)
    if origin is Annotated:  # a type with its own validation: the type it refines
        return type_name(args[0])
    if origin is Literal:
        names = [f"`{a}`" for a in args]
        return "one of " + ", ".join(names[:-1]) + " or " + names[-1]
    if origin in (Union, types.UnionType):
        return " or ".join(type_name(a) for a in args)
    if origin is list:
        return f"list of {type_name(args[0])}s"
    if origin is dict:
        return f"mapping of {type_name(args[0])} to {type_name(args[1])}"
    return _TYPE_NAMES.get(tp, getattr(tp, "__name__", str(tp)))


_BOUNDS = {annotated_types.Ge: ("≥", "ge"), annotated_types.Gt: (">", "gt"),
           annotated_types.Le: ("≤", "le"), annotated_types.Lt: ("<", "lt")}


def kind(field: FieldInfo) -> str:
    """A setting's type in words, with its bounds: ``integer, ≥ 1, ≤ 65535, or unset``."""
    tp = field.annotation
    union = get_origin(tp) in (Union, types.UnionType)
    optional = union and type(None) in get_args(tp)
    named = " or ".join(type_name(a) for a in get_args(tp) if a is not type(None)) \
        if optional else type_name(tp)
    words = ["duration" if _is_duration(field) else named]
    words += [f"{sign} {getattr(m, attr):g}" for m in field.metadata
              for bound, (sign, attr) in _BOUNDS.items() if isinstance(m, bound)]
    return ", ".join(words) + (", or unset" if optional else "")


def duration(seconds: float) -> str:
    """Seconds as the configuration writes them: ``90s``, ``30m``, ``1d6h``."""
    if seconds == 0:
        return "0s"
    out, left = "", seconds
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        whole, left = divmod(left, size)
        out += f"{whole:g}{unit}" if whole else ""
    return out + (f"{left:g}s" if left else "")


def default(name: str, field: FieldInfo) -> str:
    """A setting's default as it would be written in the configuration file."""
    value = field.get_default(call_default_factory=True)
    if value is None:
        return "unset"
    if _is_duration(field):
        return f"`{duration(value)}`"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, list | tuple):
        return f"`[{', '.join(map(str, value))}]`"
    if isinstance(value, dict):
        return "`{}`" if not value else f"`{value}`"
    if isinstance(value, int) and name.endswith("_bytes") and value % 2**20 == 0:
        return f"`{value}` ({value // 2**20} MiB)"
    if isinstance(value, float):
        return f"`{value:g}`"
    return f"`{value}`" if str(value) else '`""`'


def _nested(field: FieldInfo) -> type[BaseModel] | None:
    """The section a field holds, if it holds one rather than a setting."""
    tp = field.annotation
    return tp if isinstance(tp, type) and issubclass(tp, BaseModel) else None


def _sections(model: type[BaseModel], path: tuple[str, ...] = ()
              ) -> Iterator[tuple[tuple[str, ...], type[BaseModel]]]:
    """The model and every section nested in it, each with its path of field names."""
    yield path, model
    for name, field in model.model_fields.items():
        if (nested := _nested(field)) is not None:
            yield from _sections(nested, (*path, name))


def configuration() -> str:
    """One table per section of the configuration, from the top level down."""
    blocks = []
    for path, model in _sections(Config):
        about, docs = _attribute_docs(model)
        rows = []
        for name, field in model.model_fields.items():
            if _nested(field) is not None:
                continue
            env = ENV_PREFIX + "__".join((*path, name)).upper()
            rows.append((f"`{'.'.join((*path, name))}`", cell(kind(field)),
                         cell(default(name, field)), f"`{env}`", cell(docs.get(name, ""))))
        heading = f"`{'.'.join(path)}`" if path else "Top level"
        blocks.append(f"### {heading}\n\n" + (f"{paragraph(about)}\n\n" if about else "")
                      + table(("setting", "type", "default", "environment variable",
                               "meaning"), rows))
    return "\n".join(blocks).removesuffix("\n")


# Warehouse schema: the tables of ``exporter.sinks.schema``.

def _table(t: Table) -> str:
    rows = [(f"`{c.name}`", f"`{c.type}`", f"`{t.duckdb_types[c.name]}`",
             "yes" if c.required else "", cell(c.description)) for c in t.columns]
    clustered = ", ".join(f"`{name}`" for name in t.cluster_by)
    about = f"{t.description} Partitioned by day on `{t.partition_by}`, clustered by {clustered}."
    return (f"### `{t.name}`\n\n{paragraph(about)}\n\n"
            + table(("column", "BigQuery type", "DuckDB type", "required", "meaning"), rows))


def schema() -> str:
    """One table per warehouse table: its columns, types and meanings."""
    return "\n".join(_table(t) for t in TABLES).removesuffix("\n")


# Metrics: every family of ``exporter.metrics.families``.

def _labels(f: Family) -> str:
    """A family's labels, the device labels as one word."""
    labels = list(f.labels)
    if labels[:len(DEVICE_LABELS)] == list(DEVICE_LABELS):
        return ", ".join(["device", *(f"`{x}`" for x in labels[len(DEVICE_LABELS):])])
    return ", ".join(f"`{x}`" for x in labels)


def _meaning(f: Family) -> str:
    extra = ""
    if f.name == "queue_wait_seconds":
        extra = f"; buckets (`le`): {', '.join(duration(b) for b in QUEUE_BUCKETS)}"
    if f.cloud_monitoring:
        extra += "; written to Cloud Monitoring by default"
    return cell(f.help).removesuffix(".") + extra


def metrics() -> str:
    """One row per family, in the order ``/metrics`` shows them."""
    rows = [(f"`{f.exposed.removeprefix('gke_gpu_')}`", f.kind, f.unit or "—",
             _labels(f), _meaning(f)) for f in FAMILIES]
    return table(("metric", "type", "unit", "labels", "meaning"), rows).rstrip("\n")


# The weekly report's tables: ``analytics.tables``.

def report_tables() -> str:
    """The headline's figures, then one table per report table: its columns and meanings."""
    def rows(columns: Sequence[Column]) -> list[tuple[str, ...]]:
        return [(f"`{c.name}`", c.unit, cell(c.help)) for c in columns]

    blocks = ["### Headline (`report.json` `headline`)\n\n"
              + table(("figure", "unit", "meaning"), rows(HEADLINE)),
              "### Price basis (`report.json` `price_basis`)\n\n"
              "The line under the headline, and what it is made of.\n\n"
              + table(("figure", "unit", "meaning"), rows(PRICE_BASIS))]
    for t in REPORT_TABLES:
        more = f"\n\nThen {markdown(t.more_columns)}." if t.more_columns else ""
        blocks.append(f"### {t.title} (`{t.name}`)\n\n{paragraph(t.help)}{more}\n\n"
                      + table(("column", "unit", "meaning"), rows(t.columns)))
    return "\n".join(blocks).removesuffix("\n")


# The shipped price book: ``exporter/data/pricebook.yaml``.

def _money(value: float | None) -> str:
    return "—" if value is None else f"{value:.4f}"


def prices() -> str:
    """Per region and GPU model: the GPU's own prices, and beside them its share of the
    machine with the most of these GPUs (its whole node), where a machine type fixes it."""
    data = yaml.safe_load((HERE.parent / "exporter" / "data" / "pricebook.yaml").read_text())
    rows = []
    for region in sorted(data["regions"]):
        book = load_price_book(None, region)
        for accel in sorted(data["regions"][region]):
            machines = sorted(((m.gpus, name) for (name, prov), m in book.machines.items()
                               if m.accelerator == accel and prov == "on-demand"), reverse=True)
            on_demand = book.hourly(accel, "on-demand")
            machine, share = "—", None
            if machines:
                machine = f"`{machines[0][1]}`"
                share = book.machine_share(machines[0][1], "on-demand")
            both = None if on_demand is None or share is None else on_demand + share
            rows.append((region, f"`{accel}`", _money(on_demand),
                         _money(book.hourly(accel, "spot")), machine, _money(share),
                         _money(both)))
    sources = "\n".join(
        f"- `{s['package']}` (published {s['published']}, integrity `{s['integrity'][:19]}…`):"
        f" {', '.join(f'`{a}`' for a in s['accelerators'])}" for s in data["sources"])
    return (f"As of {data['as_of']}, basis `{data['basis']}`. Sources:\n\n{sources}\n\n"
            + table(("region", "GPU", "on-demand", "spot", "machine", "machine share",
                     "GPU + share"), rows)).rstrip("\n")


def trace_columns() -> str:
    from analytics.whatif.trace import COLUMNS
    return table(("column", "meaning"), [(f"`{k}`", cell(v)) for k, v in COLUMNS.items()]) \
        .rstrip("\n")


def pod_columns() -> str:
    from analytics.whatif.pods_csv import POD_COLUMNS
    return table(("column", "meaning"), [(f"`{k}`", cell(v)) for k, v in
                                         POD_COLUMNS.items()]).rstrip("\n")


class Section(NamedTuple):
    page: str
    """The page under ``docs/`` that holds the section."""
    render: Callable[[], str]
    """The section's body, from its declaration in the code."""


SECTIONS: dict[str, Section] = {
    "configuration": Section("configuration.md", configuration),
    "metrics": Section("metrics.md", metrics),
    "schema": Section("warehouse.md", schema),
    "report-tables": Section("report.md", report_tables),
    "prices": Section("prices.md", prices),
    "trace-columns": Section("whatif.md", trace_columns),
    "pod-columns": Section("whatif.md", pod_columns),
}
"""Every section this script generates, by name (the name in its marker lines)."""


def pages(root: Path = HERE) -> dict[Path, str]:
    """Every page that holds a generated section, with its sections as they are now."""
    out: dict[Path, str] = {}
    for name, spec in SECTIONS.items():
        path = root / spec.page
        text = out.get(path) or path.read_text()
        out[path] = replace(text, name, spec.render())
    return out


def main() -> None:
    for path, text in pages().items():
        if path.read_text() != text:
            path.write_text(text)
            print(f"wrote {path.relative_to(HERE.parent)}")


if __name__ == "__main__":
    main()
