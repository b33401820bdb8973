"""Start-up checks: what ``run`` needs from this host, checked without side effects.

``problems(cfg)`` returns one ``StartupError`` per setting the host refuses, each naming
the setting and the fix: the Kubernetes credentials (the kubeconfig's current context as
the client reads it, ``read_kubeconfig``: the certificate authority, client certificate,
key and token files it names read, an exec plugin's command found; or a pod's service
account with ``kubernetes.in_cluster``), the files configured features read (the price
book and the SMTP CA bundle readable, the SMTP password file readable, UTF-8 and not
empty), the warehouse directory (exists, writable), and the listening socket (the address
resolves and the port is free: bound and closed at once). ``run --check-config`` prints
them all; ``run`` stops on them before it starts anything, so that what it refuses later
is only what cannot be known without starting (an exec plugin that fails when run, a port
taken in between). ``listen_error`` words a failed bind the same way when the socket is
really opened.
"""

from __future__ import annotations

import errno
import os
import socket
from collections.abc import Callable
from pathlib import Path

from exporter.config import Config
from exporter.errors import StartupError
from exporter.files import Unreadable, read_secret
from exporter.sources.kube_client import (
    DEFAULT_KUBECONFIG,
    SERVICE_CA_FILE,
    SERVICE_HOST_ENV,
    SERVICE_PORT_ENV,
    SERVICE_TOKEN_FILE,
    KubeConfigError,
    kubeconfig_paths,
    read_kubeconfig,
)


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
    env = os.environ.get("KUBECONFIG")
    named = str(k.kubeconfig) if k.kubeconfig is not None else \
        f"$KUBECONFIG ({env})" if env else str(DEFAULT_KUBECONFIG)
    if not any(p.exists() for p in kubeconfig_paths(k.kubeconfig)):
        return StartupError("kubernetes.kubeconfig", (
            f"no kubeconfig at {named}: set kubernetes.kubeconfig to a kubeconfig file, or "
            "kubernetes.in_cluster: true in a pod"))
    try:
        read_kubeconfig(k.kubeconfig)
    except KubeConfigError as exc:
        why = " ".join(str(exc).split())
        return StartupError("kubernetes.kubeconfig",
                            why if named in why else f"{why} (in the kubeconfig {named})")
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
    """The file the report's mail reads its password from: readable, UTF-8, not empty."""
    path = cfg.report.smtp.password_file
    if path is None:
        return None
    try:
        read_secret(path)
    except Unreadable as exc:
        return StartupError("report.smtp.password_file", (
            f"the SMTP password file {path}: {exc}: mount the secret there, or give the "
            "password in GKE_GPU_EXPORTER_REPORT__SMTP__PASSWORD"))
    return None


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
