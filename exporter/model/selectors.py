"""Kubernetes label and field selectors, as the API server parses them.

Label selectors: ``a=b``, ``a==b``, ``a!=b``, ``a in (x,y)``, ``a notin (x)``, ``a``, ``!a``,
joined by commas. Field selectors: ``path=value``, ``path==value``, ``path!=value`` over
dotted paths such as ``metadata.name``, ``spec.nodeName`` and ``status.phase``.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

Obj = dict[str, Any]
Predicate = Callable[[Obj], bool]

_SET = re.compile(r"^\s*([A-Za-z0-9./_-]+)\s+(in|notin)\s+\(([^)]*)\)\s*$")
_EQ = re.compile(r"^\s*([A-Za-z0-9./_-]+)\s*(==|!=|=)\s*([A-Za-z0-9._-]*)\s*$")
_EXISTS = re.compile(r"^\s*(!?)\s*([A-Za-z0-9./_-]+)\s*$")
FIELDS = {"metadata.name", "metadata.namespace", "spec.nodeName", "status.phase",
          "spec.schedulerName", "spec.restartPolicy", "spec.serviceAccountName",
          "status.podIP", "spec.unschedulable"}


class SelectorError(ValueError):
    """A selector the API server would reject (HTTP 400)."""


def _split(selector: str) -> list[str]:
    """Split on commas that are not inside parentheses."""
    parts: list[str] = []
    cur: list[str] = []
    depth = 0
    for ch in selector:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    parts.append("".join(cur))
    return [p for p in parts if p.strip()]


def label_selector(selector: str | None) -> Predicate:
    if not selector:
        return lambda _: True
    tests: list[Predicate] = []
    for term in _split(selector):
        if m := _SET.match(term):
            k, op, values = m.group(1), m.group(2), {v.strip() for v in m.group(3).split(",")}
            tests.append(_label_in(k, values, negate=op == "notin"))
        elif m := _EQ.match(term):
            k, op, value = m.group(1), m.group(2), m.group(3)
            tests.append(_label_in(k, {value}, negate=op == "!="))
        elif m := _EXISTS.match(term):
            neg, k = m.group(1) == "!", m.group(2)
            tests.append(_label_exists(k, negate=neg))
        else:
            raise SelectorError(f"unable to parse requirement: {term.strip()!r}")
    return lambda o: all(t(o) for t in tests)


def field_selector(selector: str | None) -> Predicate:
    if not selector:
        return lambda _: True
    tests: list[Predicate] = []
    for term in _split(selector):
        m = _EQ.match(term)
        if m is None:
            raise SelectorError(f"invalid field selector: {term.strip()!r}")
        path, op, value = m.group(1), m.group(2), m.group(3)
        if path not in FIELDS:
            raise SelectorError(f'field label not supported: "{path}"')
        tests.append(_field_is(path, value, negate=op == "!="))
    return lambda o: all(t(o) for t in tests)


def _label_in(k: str, values: set[str], negate: bool) -> Predicate:
    def test(obj: Obj) -> bool:
        return (_labels(obj).get(k) in values) != negate

    return test


def _label_exists(k: str, negate: bool) -> Predicate:
    def test(obj: Obj) -> bool:
        return (k in _labels(obj)) != negate

    return test


def _field_is(path: str, value: str, negate: bool) -> Predicate:
    def test(obj: Obj) -> bool:
        return (_field(obj, path) == value) != negate

    return test


def _labels(obj: Obj) -> dict[str, str]:
    labels: dict[str, str] = obj.get("metadata", {}).get("labels") or {}
    return labels


def _field(obj: Obj, path: str) -> str:
    cur: Any = obj
    for part in path.split("."):
        cur = cur.get(part) if isinstance(cur, dict) else None
    if cur is None:
        return ""
    if isinstance(cur, bool):
        return "true" if cur else "false"
    return str(cur)
