"""Start-up checks: what ``run`` needs from this host, checked without side effects.

``problems(cfg)`` returns one ``StartupError`` per setting the host refuses, each naming
the setting and the fix: the Kubernetes credentials (a readable kubeconfig with a current
context, or a pod's service account with ``kubernetes.in_cluster``), the files configured
features read (the price book, the SMTP password file and CA bundle: each exists and is
readable), the warehouse directory (exists, writable), and the listening socket (the
address resolves and the port is free: bound and closed at once). ``run --check-config``
prints them all; ``run`` stops on them before it starts anything. ``listen_error`` words a
failed bind the same way when the socket is really opened.
"""

from __future__ import annotations

import errno
import os
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from exporter.config import Config
from exporter.errors import StartupError
from exporter.sources.kube_client import (
    SERVICE_CA_FILE,
    SERVICE_HOST_ENV,
    SERVICE_PORT_ENV,
    SERVICE_TOKEN_FILE,
)

DEFAULT_KUBECONFIG = Path("~/.kube/config")


def problems(cfg: Config) -> list[StartupError]:
    """Every start-up mistake found, in the order of the settings."""
    checks: tuple[Callable[[Config], StartupError | None], ...] = (
        kubernetes, price_book, warehouse, smtp_password_file, smtp_ca_file, listen)
    return [p for check in checks if (p := check(cfg)) is not None]


def kubernetes(cfg: Config) -> StartupError | None:
    k = cfg.kubernetes
    if k.in_cluster:
        if not (os.environ.get(SERVICE_HOST_ENV) and os.environ.get(SERVICE_PORT_ENV)):
            return StartupError("kubernetes.in_cluster", (
                f"{SERVICE_HOST_ENV} is not set: this is not a pod; "
                "set kubernetes.kubeconfig instead, or run the exporter in the cluster"))
        for path in (SERVICE_TOKEN_FILE, SERVICE_CA_FILE):
            if not os.access(path, os.R_OK):
                return StartupError("kubernetes.in_cluster", (
                    f"cannot read {path}: mount the service account token "
                    "(automountServiceAccountToken: true)"))
        return None
    if k.kubeconfig is not None:
        return _kubeconfig([k.kubeconfig], "kubernetes.kubeconfig", str(k.kubeconfig))
    env = os.environ.get("KUBECONFIG")
    paths = [Path(p).expanduser() for p in env.split(os.pathsep) if p] if env \
        else [DEFAULT_KUBECONFIG.expanduser()]
    return _kubeconfig(paths, "kubernetes.kubeconfig",
                       f"$KUBECONFIG ({env})" if env else str(DEFAULT_KUBECONFIG))


def _kubeconfig(paths: list[Path], setting: str, named: str) -> StartupError | None:
    found = [p for p in paths if p.exists()]
    if not found:
        return StartupError(setting, (
            f"no kubeconfig at {named}: set kubernetes.kubeconfig to a kubeconfig file, or "
            "kubernetes.in_cluster: true in a pod"))
    merged: dict[str, Any] = {}
    for path in found:
        try:
            doc = yaml.safe_load(path.read_text())
        except OSError as exc:
            return StartupError(setting, f"cannot read {path} ({exc.strerror}): make it "
                                "readable by the exporter's user")
        except yaml.YAMLError:
            return StartupError(setting, f"{path} is not YAML: point it at a kubeconfig file")
        if not isinstance(doc, dict):
            return StartupError(setting, f"{path} is not a kubeconfig (a YAML mapping): "
                                "point it at a kubeconfig file")
        for key, value in doc.items():
            merged.setdefault(key, value)
    current = merged.get("current-context")
    contexts = {c.get("name"): c.get("context") or {} for c in merged.get("contexts") or []
                if isinstance(c, dict)}
    clusters = {c.get("name"): c.get("cluster") or {} for c in merged.get("clusters") or []
                if isinstance(c, dict)}
    where = ", ".join(map(str, found))
    if not current or current not in contexts:
        return StartupError(setting, f"{where} has no current context: set one with kubectl "
                            "config use-context")
    cluster = clusters.get(contexts[current].get("cluster"))
    if not cluster or not cluster.get("server"):
        return StartupError(setting, f"{where}: context {current!r} names no cluster with a "
                            "server: fix the kubeconfig")
    return None


def _unreadable(path: Path | None, setting: str, what: str, fix: str) -> StartupError | None:
    """A file a setting names that cannot be read, as the setting and the fix."""
    if path is None:
        return None
    try:
        with path.open("rb") as f:
            f.read(1)
    except OSError as exc:
        return StartupError(setting, f"cannot read {what} {path} ({exc.strerror}): {fix}")
    return None


def price_book(cfg: Config) -> StartupError | None:
    return _unreadable(cfg.prices.book, "prices.book", "the price book",
                       "mount it there, or leave prices.book unset for the shipped one")


def smtp_password_file(cfg: Config) -> StartupError | None:
    return _unreadable(cfg.report.smtp.password_file, "report.smtp.password_file",
                       "the SMTP password file", "mount the secret there, or give the "
                       "password in GKE_GPU_EXPORTER_REPORT__SMTP__PASSWORD")


def smtp_ca_file(cfg: Config) -> StartupError | None:
    return _unreadable(cfg.report.smtp.ca_file, "report.smtp.ca_file", "the CA bundle",
                       "mount it there, or leave report.smtp.ca_file unset for the "
                       "system's")


def warehouse(cfg: Config) -> StartupError | None:
    w = cfg.warehouse
    if not w.enabled:
        return None
    directory = w.path.parent
    if not directory.is_dir():
        return StartupError("warehouse.path", (
            f"directory {directory} does not exist: create it (a volume mounted there) or "
            "set warehouse.path to a file in a writable directory"))
    if not os.access(directory, os.W_OK | os.X_OK):
        return StartupError("warehouse.path", (
            f"directory {directory} is not writable: mount a writable volume there or set "
            "warehouse.path elsewhere"))
    if w.path.exists() and not (w.path.is_file() and os.access(w.path, os.R_OK | os.W_OK)):
        return StartupError("warehouse.path", (
            f"{w.path} is not a writable file: fix its permissions or set warehouse.path "
            "elsewhere"))
    return None


def listen(cfg: Config) -> StartupError | None:
    host, port = cfg.listen_address, cfg.port
    try:
        infos = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM,
                                   flags=socket.AI_PASSIVE)
    except (socket.gaierror, UnicodeError) as exc:
        return listen_error(host, port, exc)
    for family, kind, proto, _, address in infos:
        with socket.socket(family, kind, proto) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            try:
                sock.bind(address)
            except OSError as exc:
                return listen_error(host, port, exc)
    return None


def listen_error(host: str, port: int, exc: BaseException) -> StartupError:
    """A failed bind of ``host:port`` as the setting to change and how."""
    code = getattr(exc, "errno", None)
    reason = getattr(exc, "strerror", None) or str(exc)
    if isinstance(exc, socket.gaierror | UnicodeError):
        return StartupError("listen_address", (
            f"{host!r} is not an address of this host ({reason}): use an IP address, e.g. "
            "0.0.0.0 (every interface) or 127.0.0.1"))
    if code == errno.EADDRINUSE:
        return StartupError("port", f"{port} is in use on {host}: stop what listens there or "
                            "choose another port")
    if code == errno.EACCES:
        return StartupError("port", f"{port} needs privileges on {host}: choose a port above "
                            "1023")
    return StartupError("listen_address", (
        f"cannot listen on {host}:{port} ({reason}): use an address of this host, e.g. "
        "0.0.0.0 (every interface) or 127.0.0.1"))
