"""A local BigQuery: the ``local-bigquery`` emulator in a child process.

It serves BigQuery's REST API on loopback and keeps its data in a directory, so it can be
stopped and started again like the real service going away and coming back. It runs on
DuckDB, whose extensions it needs are installed from the ``duckdb-extension-*`` wheels
(``pip install 'gke-gpu-exporter[emulator]'``): nothing is downloaded.
"""

from __future__ import annotations

import importlib.util
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from types import TracebackType
from typing import Self

import duckdb

from exporter.errors import ConfigError

PROJECT = "gpu-local"
EXTENSIONS = ("icu", "json", "parquet", "ducklake", "spatial")
_SERVE = "from local_bigquery.cli import main; main()"


def install_duckdb_extensions() -> None:
    """Install DuckDB's extensions from their wheels into DuckDB's extension directory."""
    con = duckdb.connect()
    try:
        for name in EXTENSIONS:
            spec = importlib.util.find_spec(f"duckdb_extension_{name}")
            files = [] if spec is None or spec.origin is None else \
                sorted(Path(spec.origin).parent.rglob("*.duckdb_extension"))
            if not files:
                raise ConfigError(f"DuckDB extension {name!r} is not installed: "
                                  "pip install 'gke-gpu-exporter[emulator]'")
            con.execute(f"INSTALL '{files[0]}'")
    finally:
        con.close()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Emulator:
    """``with Emulator(dir) as bq: ... bq.url ...``; ``stop()`` and ``start()`` again keep
    the data and the port."""

    def __init__(self, data_dir: Path, project: str = PROJECT) -> None:
        if importlib.util.find_spec("local_bigquery") is None:
            raise ConfigError("the BigQuery emulator is not installed: "
                              "pip install 'gke-gpu-exporter[emulator]'")
        self.data_dir = data_dir
        self.project = project
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 60.0) -> None:
        install_duckdb_extensions()
        self.data_dir.mkdir(parents=True, exist_ok=True)
        with (self.data_dir / "emulator.log").open("ab") as out:
            self._proc = subprocess.Popen(
                [sys.executable, "-c", _SERVE, "serve", "--host", "127.0.0.1", "--port",
                 str(self.port), "--grpc-port", str(_free_port()), "--project", self.project,
                 "--data-dir", str(self.data_dir)], stdout=out, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout
        probe = f"{self.url}/bigquery/v2/projects/{self.project}/datasets"
        while True:
            if self._proc.poll() is not None:
                raise RuntimeError(f"BigQuery emulator exited ({self._proc.returncode}); "
                                   f"see {self.data_dir / 'emulator.log'}")
            try:
                with urllib.request.urlopen(probe, timeout=1):
                    return
            except (urllib.error.URLError, OSError):
                if time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError(f"BigQuery emulator not up after {timeout:g} s") from None
                time.sleep(0.1)

    def stop(self, kill: bool = False) -> None:
        """Stop the emulator (``kill``: at once, as a crash would)."""
        if self._proc is None:
            return
        if kill:
            self._proc.kill()
        else:
            self._proc.terminate()
        try:
            self._proc.wait(10)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
        self._proc = None

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()
