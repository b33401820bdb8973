"""The exporter's errors. Library errors are translated once, where they enter::

    ExporterError
    ├── ConfigError            bad configuration or price book (start-up, exit 1)
    └── SourceError            one source failed this cycle (the cycle goes on)
        ├── SourceUnavailable  refused, reset, HTTP status other than 200
        ├── SourceTimeout      no complete answer within the timeout
        └── SourceDataError    an answer we cannot use (too big, no valid samples)

Every ``SourceError`` names its ``source`` and ``target``.
"""

from __future__ import annotations


class ExporterError(Exception):
    """Base of every error the exporter raises on purpose."""


class ConfigError(ExporterError):
    """The configuration or the price book cannot be used."""


class SourceError(ExporterError):
    def __init__(self, source: str, target: str, message: str) -> None:
        super().__init__(f"{source} {target}: {message}")
        self.source = source
        self.target = target
        self.reason = message


class SourceUnavailable(SourceError):
    """The target refused, reset, or answered with an error status."""


class SourceTimeout(SourceError):
    """The target did not answer completely within the timeout."""


class SourceDataError(SourceError):
    """The target answered with something we cannot use."""
