"""The exporter's errors. Library errors are translated once, where they enter::

    ExporterError
    ├── ConfigError            bad configuration or price book (start-up, exit 1)
    │   └── StartupError       a setting this host refuses: credentials, a directory,
    │                          the listening socket (start-up, exit 2)
    └── SourceError            one source failed this cycle (the cycle goes on)
        ├── SourceUnavailable  refused, reset, HTTP status other than 200
        ├── SourceTimeout      no complete answer within the timeout
        └── SourceDataError    an answer we cannot use (too big, no valid samples)

Every ``SourceError`` names its ``source`` and ``target``, and its ``label``: ``http_<status>``
for an error status, ``refused``, ``unavailable``, ``timeout`` or ``bad_answer``.
"""

from __future__ import annotations


class ExporterError(Exception):
    """Base of every error the exporter raises on purpose."""


class ConfigError(ExporterError):
    """The configuration or the price book cannot be used."""


class StartupError(ConfigError):
    """A valid setting that cannot be used here; the message names it and the fix."""

    def __init__(self, setting: str, message: str) -> None:
        super().__init__(f"{setting}: {message}")
        self.setting = setting


class SourceError(ExporterError):
    label = "error"
    """The ``reason`` label of ``exporter_errors_total`` for errors of this class."""

    def __init__(self, source: str, target: str, message: str, *, status: int | None = None,
                 label: str | None = None, rejected: dict[str, int] | None = None) -> None:
        super().__init__(f"{source} {target}: {message}")
        self.source = source
        self.target = target
        self.reason = message
        self.status = status
        """The HTTP status of the answer, when there was one."""
        if status is not None:
            self.label = f"http_{status}"
        elif label is not None:
            self.label = label
        self.rejected = rejected or {}
        """Samples the answer held that were dropped, by reason."""


class SourceUnavailable(SourceError):
    """The target refused, reset, or answered with an error status."""

    label = "unavailable"


class SourceTimeout(SourceError):
    """The target did not answer completely within the timeout."""

    label = "timeout"


class SourceDataError(SourceError):
    """The target answered with something we cannot use."""

    label = "bad_answer"
