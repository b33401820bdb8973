"""The text files start-up reads (the config, the price book, kubeconfigs, the SMTP password):
bytes decoded as UTF-8 and YAML parsed, every failure one line saying what is wrong and
where (the byte offset of a byte that is not UTF-8, the line and column of a YAML mistake).

Each caller names the file and the setting; ``Unreadable`` carries only the reason.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml


class Unreadable(ValueError):
    """A file (or a value) that cannot be read as text or as YAML; the message is one line."""


def not_utf8(exc: UnicodeDecodeError) -> str:
    """A failed UTF-8 decoding as one line: the first bad byte and its offset."""
    return f"not UTF-8: byte 0x{exc.object[exc.start]:02x} at offset {exc.start}"


def decode(data: bytes) -> str:
    """``data`` as UTF-8 text (a byte-order mark dropped), else ``Unreadable``."""
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise Unreadable(not_utf8(exc)) from None


def not_utf8_text(value: str) -> str | None:
    """What is wrong with a string read from the environment or a command line (where
    Python keeps the bytes that are not UTF-8 as lone surrogates), or None."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raw = value.encode("utf-8", "surrogateescape")
        prefix = len(value[:exc.start].encode("utf-8", "surrogateescape"))
        return f"not UTF-8: byte 0x{raw[prefix]:02x} at offset {prefix}"
    return None


def read_text(path: Path) -> str:
    """The file's text, else ``Unreadable`` (cannot be read, or not UTF-8)."""
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise Unreadable(f"cannot read: {exc.strerror or exc}") from None
    return decode(data)


def yaml_problem(exc: yaml.YAMLError) -> str:
    """A YAML parser's error as one line, with the line and column of the mistake."""
    if isinstance(exc, yaml.MarkedYAMLError):
        mark = exc.problem_mark or exc.context_mark
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        what = exc.problem or type(exc).__name__
        if exc.context:
            began = exc.context_mark
            what += f" ({exc.context}" + (f" from line {began.line + 1}" if began else "") + ")"
        return f"not valid YAML{where}: {' '.join(what.split())}"
    return f"not valid YAML: {' '.join(str(exc).split())}"


_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
"""libyaml's safe loader where PyYAML was built with it: a tenth of the pure-Python one's
time on a price book."""


def parse_yaml(text: str) -> Any:
    """The YAML document of ``text``, else ``Unreadable`` (one line). Read by libyaml where
    it can; what it cannot read is read again by PyYAML's own parser, whose messages say
    what it found where it expected something else."""
    if _LOADER is not yaml.SafeLoader:
        try:
            return yaml.load(text, Loader=_LOADER)  # a safe loader
        except Exception:  # told below, as PyYAML tells it
            pass
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise Unreadable(yaml_problem(exc)) from None
    except RecursionError:
        raise Unreadable("not valid YAML: nested too deeply") from None
    except Exception as exc:  # a value PyYAML parses but cannot build (2026-13-01,
        # "\U0fffffff", !!timestamp x): its constructors raise what they meet
        why = " ".join(str(exc).split()) or type(exc).__name__
        raise Unreadable(f"not valid YAML: a value that cannot be read ({why})") from None


def read_yaml(path: Path) -> Any:
    """The YAML document of a file, else ``Unreadable`` (one line)."""
    return parse_yaml(read_text(path))


def read_secret(path: Path) -> str:
    """A secret mounted as a file (a password): its text without surrounding white space,
    else ``Unreadable`` (cannot be read, not UTF-8, or empty)."""
    secret = read_text(path).strip()
    if not secret:
        raise Unreadable("empty")
    return secret
