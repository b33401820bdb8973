"""The Kubernetes API client: credentials, and raw GETs for list and watch.

The exporter reads three collections (nodes, pods, namespaces) as raw JSON: a list, then a
watch streaming newline-delimited JSON events. That needs an authenticated HTTPS GET and
nothing more, so this module does it with aiohttp (which the exporter uses anyway), the
standard library's ``ssl`` and PyYAML. Measured on CPython 3.13 (resident memory and
import time on top of aiohttp, PyYAML and ssl): kubernetes_asyncio's client, config and
watch modules add 35.6 MiB and 0.19-0.30 s; lightkube 1.0 with httpx2 (an AsyncClient from
a kubeconfig, the core resources) adds 9.1 MiB and 0.09 s, lightkube 0.22 with httpx
12.1 MiB and 0.40 s, each bringing a second HTTP stack and typed models the exporter
would not use; this module adds 1.4 MiB (0.1 MiB of Python objects) and 0.01 s.

Credentials come from:

- a kubeconfig (``load_kubeconfig``): an explicit file, else ``$KUBECONFIG`` (files
  merged as kubectl does: the first to set a name or ``current-context`` wins), else
  ``~/.kube/config``. The current context's cluster gives ``server``,
  ``certificate-authority`` or ``certificate-authority-data``,
  ``insecure-skip-tls-verify`` and ``tls-server-name``; its user a ``token``, a
  ``tokenFile`` (read again each minute and after a 401), ``client-certificate`` and
  ``client-key`` (or their ``-data`` forms), ``username`` and ``password``, or an
  ``exec`` credential plugin (``client.authentication.k8s.io`` ``v1`` or ``v1beta1``, as
  ``gke-gcloud-auth-plugin`` on GKE): its token is kept until its
  ``expirationTimestamp`` and the plugin is run again after it, or after a 401. Relative
  file paths are relative to the directory of the kubeconfig that names them.
- a pod's service account (``load_incluster``): ``KUBERNETES_SERVICE_HOST`` and
  ``KUBERNETES_SERVICE_PORT``, the mounted token (read again each minute: the kubelet
  rotates it) and the cluster's CA.

Not supported: exec plugins that answer with a client certificate instead of a token, and
the legacy ``auth-provider`` entries (GKE replaced its ``gcp`` provider with
``gke-gcloud-auth-plugin``); both are refused at start with that reason.

As kubectl does, certificates are checked without Python's ``VERIFY_X509_STRICT``
(clusters' own CAs often lack the extensions it demands). ``HTTPS_PROXY`` and ``NO_PROXY``
are honoured.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import shutil
import ssl
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, Protocol

import aiohttp

from exporter.files import Unreadable, read_text, read_yaml

SERVICE_HOST_ENV = "KUBERNETES_SERVICE_HOST"
SERVICE_PORT_ENV = "KUBERNETES_SERVICE_PORT"
SERVICE_TOKEN_FILE = "/var/run/secrets/kubernetes.io/serviceaccount/token"
SERVICE_CA_FILE = "/var/run/secrets/kubernetes.io/serviceaccount/ca.crt"
DEFAULT_KUBECONFIG = "~/.kube/config"
TOKEN_REREAD_SECONDS = 60.0
"""How long a token read from a file is used before the file is read again."""
EXEC_TIMEOUT_SECONDS = 60.0
"""How long an exec credential plugin may run."""
READ_BUFSIZE = 1 << 21
"""The read buffer of a response; a watch line (one object) may be twice as long."""


class KubeConfigError(Exception):
    """Credentials that cannot be loaded: a missing or malformed kubeconfig or file."""


class CredentialError(Exception):
    """Credentials that could not be renewed while running (an exec plugin failed, a token
    file went away)."""


class Auth(Protocol):
    async def header(self) -> str | None:
        """The ``Authorization`` header to send, if any."""

    def rejected(self) -> bool:
        """The server answered 401 to the last header: forget it; True if a new one may be
        accepted (worth a second try)."""


@dataclass(slots=True)
class StaticAuth:
    value: str | None

    async def header(self) -> str | None:
        return self.value

    def rejected(self) -> bool:
        return False


class TokenFileAuth:
    """A bearer token read from a file, read again each ``reread`` seconds and after a 401."""

    def __init__(self, path: Path, reread: float = TOKEN_REREAD_SECONDS,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.path = path
        self._reread = reread
        self._clock = clock
        self._token = self._read()
        self._read_at = clock()

    def _read(self) -> str:
        try:
            token = read_text(self.path).strip()
        except Unreadable as exc:
            raise CredentialError(f"cannot use the token file {self.path}: {exc}") from exc
        if not token:
            raise CredentialError(f"the token file {self.path} is empty")
        return token

    async def header(self) -> str | None:
        if self._clock() - self._read_at >= self._reread:
            self._token = self._read()
            self._read_at = self._clock()
        return f"Bearer {self._token}"

    def rejected(self) -> bool:
        self._read_at = float("-inf")
        return True


class ExecAuth:
    """A bearer token from an exec credential plugin, kept until it expires or is refused."""

    def __init__(self, spec: Mapping[str, Any], base: Path,
                 cluster: Mapping[str, Any] | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        command = spec.get("command")
        api_version = spec.get("apiVersion")
        if not command or not isinstance(command, str):
            raise KubeConfigError("exec: no command")
        if not api_version or not isinstance(api_version, str):
            raise KubeConfigError("exec: no apiVersion")
        args = spec.get("args") or []
        env = spec.get("env") or []
        if not isinstance(args, list) or not isinstance(env, list):
            raise KubeConfigError("exec: args and env must be lists")
        # a relative path with a directory is relative to the kubeconfig; a bare name is
        # looked up on PATH
        if os.sep in command and not os.path.isabs(command):
            command = str(base / command)
        self.argv = [command, *map(str, args)]
        self.api_version = api_version
        self._env = {str(e["name"]): str(e["value"]) for e in env
                     if isinstance(e, dict) and "name" in e and "value" in e}
        self._cluster = cluster if spec.get("provideClusterInfo") else None
        self.clock = clock
        """Wall-clock time, against which ``expirationTimestamp`` is compared."""
        self._token: str | None = None
        self._expires: float | None = None
        self._lock = asyncio.Lock()
        self.runs = 0

    def environ(self) -> dict[str, str]:
        """The plugin's environment: this process's, with the kubeconfig's ``env`` over it."""
        return {**os.environ, **self._env}

    def _valid(self) -> bool:
        return self._token is not None and (self._expires is None or
                                            self.clock() < self._expires)

    async def header(self) -> str | None:
        if not self._valid():
            async with self._lock:  # concurrent requests wait for one run
                if not self._valid():
                    self._token, self._expires = await self._run()
        return f"Bearer {self._token}"

    def rejected(self) -> bool:
        self._token = None
        return True

    async def _run(self) -> tuple[str, float | None]:
        info: dict[str, Any] = {"apiVersion": self.api_version, "kind": "ExecCredential",
                                "spec": {"interactive": False}}
        if self._cluster is not None:
            info["spec"]["cluster"] = self._cluster
        env = {**self.environ(), "KUBERNETES_EXEC_INFO": json.dumps(info)}
        self.runs += 1
        name = self.argv[0]
        try:
            proc = await asyncio.create_subprocess_exec(
                *self.argv, env=env, stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        except OSError as exc:
            raise CredentialError(f"exec plugin {name}: {exc.strerror or exc}") from exc
        try:
            async with asyncio.timeout(EXEC_TIMEOUT_SECONDS):
                out, err = await proc.communicate()
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()
            raise CredentialError(f"exec plugin {name}: no answer in "
                                  f"{EXEC_TIMEOUT_SECONDS:g} s") from None
        except asyncio.CancelledError:  # a stop while it runs: it goes too
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()
            raise
        if proc.returncode != 0:
            detail = " ".join(err.decode(errors="replace").split())[:300]
            raise CredentialError(f"exec plugin {name} exited {proc.returncode}"
                                  + (f": {detail}" if detail else ""))
        return parse_exec_credential(out, self.api_version, name)


def parse_exec_credential(out: bytes, api_version: str, name: str) -> tuple[str, float | None]:
    """The token and expiry (epoch seconds, or None) of an ExecCredential."""
    try:
        cred = json.loads(out)
    except ValueError as exc:
        raise CredentialError(f"exec plugin {name} printed no JSON: {exc}") from exc
    if not isinstance(cred, dict) or cred.get("kind") != "ExecCredential":
        raise CredentialError(f"exec plugin {name} printed no ExecCredential")
    if cred.get("apiVersion") != api_version:
        raise CredentialError(f"exec plugin {name} answered {cred.get('apiVersion')}, "
                              f"not {api_version}")
    status = cred.get("status")
    if not isinstance(status, dict) or not status.get("token"):
        what = "client certificates" if isinstance(status, dict) and \
            status.get("clientCertificateData") else "no token"
        raise CredentialError(f"exec plugin {name} gave {what}: a token is needed")
    expires: float | None = None
    if stamp := status.get("expirationTimestamp"):
        try:
            expires = datetime.fromisoformat(str(stamp).replace("Z", "+00:00")).timestamp()
        except ValueError as exc:
            raise CredentialError(f"exec plugin {name}: bad expirationTimestamp "
                                  f"{stamp!r}") from exc
    return str(status["token"]), expires


class KubeClient:
    """GETs against one API server with one set of credentials.

    ``get`` answers the response unread; the caller reads and releases it. A 401 renews
    the credentials where they can be (a token file, an exec plugin) and tries once more.
    """

    def __init__(self, server: str, ssl_context: ssl.SSLContext | None = None,
                 auth: Auth | None = None, server_hostname: str | None = None) -> None:
        self.server = server.rstrip("/")
        self.auth: Auth = auth or StaticAuth(None)
        self._ssl = ssl_context
        self._server_hostname = server_hostname
        self._session: aiohttp.ClientSession | None = None

    def _open(self) -> aiohttp.ClientSession:
        if self._session is None:
            connector = aiohttp.TCPConnector(limit=8, ssl=self._ssl if self._ssl else True)
            self._session = aiohttp.ClientSession(
                connector=connector, trust_env=True, read_bufsize=READ_BUFSIZE,
                cookie_jar=aiohttp.DummyCookieJar(), timeout=aiohttp.ClientTimeout(),
                headers={"Accept": "application/json", "User-Agent": "gke-gpu-exporter"})
        return self._session

    async def get(self, path: str, params: Mapping[str, str] | None = None, *,
                  total_seconds: float | None = None) -> aiohttp.ClientResponse:
        """GET ``path`` (``/api/v1/pods``) with ``params``, within ``total_seconds`` in all:
        the body read included, so the limit holds where ``asyncio.timeout`` would end at
        the headers."""
        session = self._open()
        client_timeout = aiohttp.ClientTimeout(total=total_seconds)
        for attempt in (1, 2):
            header = await self.auth.header()
            headers = {"Authorization": header} if header else None
            resp = await session.get(self.server + path, params=params, headers=headers,
                                     timeout=client_timeout,
                                     server_hostname=self._server_hostname)
            if resp.status == 401 and attempt == 1 and self.auth.rejected():
                resp.release()
                continue
            return resp
        raise AssertionError("unreachable")

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None


# ---------------------------------------------------------------------- loading


def load_incluster(environ: Mapping[str, str] | None = None,
                   token_file: str | Path | None = None, ca_file: str | Path | None = None,
                   reread: float = TOKEN_REREAD_SECONDS) -> KubeClient:
    """A client with the pod's service account (by default: the process' environment, the
    mounted token and CA)."""
    environ = os.environ if environ is None else environ
    token_file = SERVICE_TOKEN_FILE if token_file is None else token_file
    ca_file = SERVICE_CA_FILE if ca_file is None else ca_file
    host, port = environ.get(SERVICE_HOST_ENV), environ.get(SERVICE_PORT_ENV)
    if not host or not port:
        raise KubeConfigError(f"{SERVICE_HOST_ENV} and {SERVICE_PORT_ENV} are not set: "
                              "not in a pod")
    if ":" in host:  # IPv6
        host = f"[{host}]"
    try:
        auth = TokenFileAuth(Path(token_file), reread)
    except CredentialError as exc:
        raise KubeConfigError(str(exc)) from exc
    try:
        context = ssl.create_default_context(cafile=str(ca_file))
    except (OSError, ssl.SSLError) as exc:
        raise KubeConfigError(f"cannot load the service account CA {ca_file}: "
                              f"{getattr(exc, 'strerror', None) or exc}") from exc
    context.verify_flags &= ~ssl.VERIFY_X509_STRICT
    return KubeClient(f"https://{host}:{port}", context, auth)


def kubeconfig_paths(path: str | Path | None = None,
                     environ: Mapping[str, str] | None = None) -> list[Path]:
    """The kubeconfig files to read: ``path``, else ``$KUBECONFIG``'s, else the default."""
    if path is not None:
        return [Path(path).expanduser()]
    env = (os.environ if environ is None else environ).get("KUBECONFIG")
    if env:
        return [Path(p).expanduser() for p in env.split(os.pathsep) if p]
    return [Path(DEFAULT_KUBECONFIG).expanduser()]


@dataclass(slots=True)
class _Named:
    """A cluster or user entry and the directory its relative paths start from."""

    fields: dict[str, Any]
    base: Path


def _merge(paths: list[Path]) -> tuple[str | None, dict[str, dict[str, Any]],
                                      dict[str, _Named], dict[str, _Named]]:
    current: str | None = None
    contexts: dict[str, dict[str, Any]] = {}
    named: dict[str, dict[str, _Named]] = {"cluster": {}, "user": {}}
    found = False
    for path in paths:
        if not path.exists():
            continue  # $KUBECONFIG may name files that do not exist
        try:
            doc = read_yaml(path) or {}
        except Unreadable as exc:
            raise KubeConfigError(f"{path}: {exc}") from exc
        found = True
        if not isinstance(doc, dict):
            raise KubeConfigError(f"{path} is not a kubeconfig (a YAML mapping)")
        base = path.resolve().parent
        current = current or doc.get("current-context") or None
        for key in ("context", "cluster", "user"):
            entries = doc.get(key + "s") or []
            if not isinstance(entries, list):
                raise KubeConfigError(f"{path}: {key}s is not a list")
            for entry in entries:
                if not isinstance(entry, dict) or not isinstance(entry.get("name"), str):
                    continue
                name, body = entry["name"], entry.get(key) or {}
                if not isinstance(body, dict):
                    raise KubeConfigError(f"{path}: {key} {name!r} is not a mapping")
                if key == "context":
                    contexts.setdefault(name, body)
                else:
                    named[key].setdefault(name, _Named(body, base))
    if not found:
        raise KubeConfigError(f"no kubeconfig at {', '.join(map(str, paths))}")
    return current, contexts, named["cluster"], named["user"]


def _file(base: Path, name: Any) -> Path:
    path = Path(str(name)).expanduser()
    return path if path.is_absolute() else base / path


def _data(value: Any, what: str) -> bytes:
    try:
        return base64.b64decode(str(value), validate=False)
    except ValueError as exc:
        raise KubeConfigError(f"{what} is not base64") from exc


def _read(path: Path, what: str) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise KubeConfigError(f"cannot read the {what} {path}: {exc.strerror or exc}: "
                              "mount it there or fix the kubeconfig's path") from exc


def _ssl_context(cluster: _Named, user: _Named) -> ssl.SSLContext:
    c, u = cluster.fields, user.fields
    if c.get("certificate-authority-data"):
        ca = _data(c["certificate-authority-data"], "certificate-authority-data")
    elif c.get("certificate-authority"):
        ca = _read(_file(cluster.base, c["certificate-authority"]), "certificate-authority")
    else:
        ca = b""
    try:
        context = ssl.create_default_context(cadata=ca.decode("ascii") if ca else None)
    except (ssl.SSLError, UnicodeDecodeError, ValueError) as exc:
        raise KubeConfigError(f"the cluster's certificate authority is not PEM: {exc}") from exc
    context.verify_flags &= ~ssl.VERIFY_X509_STRICT
    if c.get("insecure-skip-tls-verify"):
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    cert = _data(u["client-certificate-data"], "client-certificate-data") \
        if u.get("client-certificate-data") else \
        _read(_file(user.base, u["client-certificate"]), "client-certificate") \
        if u.get("client-certificate") else None
    key = _data(u["client-key-data"], "client-key-data") if u.get("client-key-data") else \
        _read(_file(user.base, u["client-key"]), "client-key") if u.get("client-key") else None
    if cert is not None or key is not None:
        if cert is None or key is None:
            raise KubeConfigError("a client certificate needs both a certificate and a key")
        _load_cert_chain(context, cert, key)
    return context


def _load_cert_chain(context: ssl.SSLContext, cert: bytes, key: bytes) -> None:
    """Load a client certificate and key given as bytes (``ssl`` only reads files: they are
    written to a private directory for the time of the call)."""
    with tempfile.TemporaryDirectory(prefix="kube-") as tmp:
        cert_path, key_path = Path(tmp, "cert.pem"), Path(tmp, "key.pem")
        for path, data in ((cert_path, cert), (key_path, key)):
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "wb") as f:
                f.write(data)
        try:
            context.load_cert_chain(cert_path, key_path)
        except ssl.SSLError as exc:
            raise KubeConfigError(f"the client certificate or key is unusable: {exc}") from exc


def _auth(user: _Named, cluster: _Named, server: str) -> Auth:
    u = user.fields
    if u.get("token"):
        return StaticAuth(f"Bearer {u['token']}")
    if u.get("tokenFile"):
        try:
            return TokenFileAuth(_file(user.base, u["tokenFile"]))
        except CredentialError as exc:
            raise KubeConfigError(str(exc)) from exc
    if isinstance(u.get("exec"), dict):
        c = cluster.fields
        info = {"server": server, "insecure-skip-tls-verify":
                bool(c.get("insecure-skip-tls-verify"))}
        if c.get("certificate-authority-data"):
            info["certificate-authority-data"] = c["certificate-authority-data"]
        if c.get("tls-server-name"):
            info["tls-server-name"] = c["tls-server-name"]
        return ExecAuth(u["exec"], user.base, info)
    if u.get("auth-provider"):
        name = (u["auth-provider"] or {}).get("name", "")
        raise KubeConfigError(f"auth-provider {name!r} is not supported: use an exec "
                              "credential plugin (on GKE, gke-gcloud-auth-plugin)")
    if u.get("username") is not None and u.get("password") is not None:
        basic = base64.b64encode(f"{u['username']}:{u['password']}".encode()).decode()
        return StaticAuth(f"Basic {basic}")
    return StaticAuth(None)


@dataclass(frozen=True, slots=True)
class Kubeconfig:
    """What the current context of a kubeconfig resolves to, every file it names read."""

    server: str
    ssl_context: ssl.SSLContext | None
    auth: Auth
    server_hostname: str | None


def _found_on_path(auth: ExecAuth) -> None:
    """``KubeConfigError`` unless the exec plugin's command is there to run."""
    command = auth.argv[0]
    path = auth.environ().get("PATH", os.defpath)
    if shutil.which(command, path=path) is None:
        where = "is not an executable file" if os.sep in command else "is not on PATH"
        raise KubeConfigError(f"the exec credential plugin {command} {where}: install it "
                              "(on GKE: gke-gcloud-auth-plugin) or fix the user's "
                              "exec.command")


def read_kubeconfig(path: str | Path | None = None,
                    environ: Mapping[str, str] | None = None) -> Kubeconfig:
    """The current context of the kubeconfig (see ``kubeconfig_paths``), checked without
    contacting anything: its cluster and user, the files they name (certificate
    authority, client certificate and key, token file) read, an exec plugin's command
    found. What ``run --check-config`` checks and ``run`` starts from; a
    ``KubeConfigError`` naming what is wrong."""
    paths = kubeconfig_paths(path, environ)
    current, contexts, clusters, users = _merge(paths)
    where = ", ".join(map(str, paths))
    if not current:
        raise KubeConfigError(f"{where} has no current-context: set one with kubectl "
                              "config use-context")
    context = contexts.get(current)
    if context is None:
        raise KubeConfigError(f"{where}: no context {current!r}: choose one of "
                              f"{', '.join(map(repr, contexts)) or 'none'} with kubectl "
                              "config use-context")
    cluster = clusters.get(str(context.get("cluster")))
    if cluster is None or not cluster.fields.get("server"):
        raise KubeConfigError(f"{where}: context {current!r} names no cluster with a server")
    user = users.get(str(context.get("user"))) or _Named({}, cluster.base)
    server = str(cluster.fields["server"])
    if not server.startswith(("https://", "http://")):
        server = "https://" + server
    auth = _auth(user, cluster, server)
    if isinstance(auth, ExecAuth):
        _found_on_path(auth)
    ssl_context = _ssl_context(cluster, user) if server.startswith("https://") else None
    return Kubeconfig(server, ssl_context, auth,
                      cluster.fields.get("tls-server-name") or None)


async def load_kubeconfig(path: str | Path | None = None,
                          environ: Mapping[str, str] | None = None) -> KubeClient:
    """A client for the current context of the kubeconfig (``read_kubeconfig``). An exec
    plugin is run once here, so that a broken one fails at start."""
    k = read_kubeconfig(path, environ)
    client = KubeClient(k.server, k.ssl_context, k.auth, server_hostname=k.server_hostname)
    auth = k.auth
    if isinstance(auth, ExecAuth):
        try:
            await auth.header()
        except CredentialError as exc:
            raise KubeConfigError(str(exc)) from exc
    return client
