"""Credentials from a kubeconfig or a pod's service account, against the simulated API over
TLS: tokens, token files, client certificates, exec plugins, CAs and server names."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import ssl
import subprocess
import sys
import textwrap
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import trustme
import yaml
from aiohttp import web

from exporter.backoff import Backoff
from exporter.config import load_config
from exporter.errors import StartupError
from exporter.runtime.app import _kube_client
from exporter.sources import kube_client
from exporter.sources.kube import KubeSource
from exporter.sources.kube_client import (
    ExecAuth,
    KubeClient,
    KubeConfigError,
    load_incluster,
    load_kubeconfig,
)
from simulator.server import SimulatorServer, free_port
from tests.timing import limit


class Api:
    """The simulator's Kubernetes API served over HTTPS, admitting the requests ``admit``
    accepts (401 otherwise) and recording each one's Authorization header."""

    def __init__(self, url: str, seen: list[str | None]) -> None:
        self.url = url
        self.seen = seen


@pytest.fixture(scope="module")
def ca() -> trustme.CA:
    return trustme.CA()


@contextlib.asynccontextmanager
async def serve_api(sim: SimulatorServer, cert: trustme.LeafCert,
                    admit: Callable[[str | None], bool] = lambda _: True,
                    client_ca: trustme.CA | None = None) -> AsyncIterator[Api]:
    seen: list[str | None] = []

    @web.middleware
    async def auth(request: web.Request, handler: Any) -> web.StreamResponse:
        header = request.headers.get("Authorization")
        seen.append(header)
        if not admit(header):
            return web.json_response({"kind": "Status", "apiVersion": "v1", "status": "Failure",
                                      "message": "Unauthorized", "reason": "Unauthorized",
                                      "code": 401}, status=401)
        response: web.StreamResponse = await handler(request)
        return response

    app = web.Application(middlewares=[auth, sim.api.middleware])
    app.add_routes(sim.api.routes())
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    cert.configure_cert(context)
    if client_ca is not None:
        client_ca.configure_trust(context)
        context.verify_mode = ssl.CERT_REQUIRED
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.1)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port, ssl_context=context).start()
    try:
        yield Api(f"https://127.0.0.1:{port}", seen)
    finally:
        await runner.cleanup()


def write_kubeconfig(directory: Path, cluster: dict[str, Any], user: dict[str, Any],
                     name: str = "kubeconfig") -> Path:
    path = directory / name
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config",
        "clusters": [{"name": "c", "cluster": cluster}],
        "users": [{"name": "u", "user": user}],
        "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u",
                                               "namespace": "ignored"}}],
        "current-context": "x",
    }))
    return path


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


async def node_names(client: KubeClient) -> set[str]:
    resp = await client.get("/api/v1/nodes", total_seconds=5)
    try:
        assert resp.status == 200, await resp.text()
        return {n["metadata"]["name"] for n in (await resp.json())["items"]}
    finally:
        resp.release()


def sim_nodes(sim: SimulatorServer) -> set[str]:
    return {o["metadata"]["name"] for o in sim.store.list_objects("Node")}


# ---------------------------------------------------------------------- kubeconfig


async def test_a_token_and_ca_data_list_and_watch(sim: SimulatorServer, ca: trustme.CA,
                                                  tmp_path: Path) -> None:
    """A KubeSource on a kubeconfig with a token and certificate-authority-data lists and
    watches through it; the context's namespace plays no part."""
    cert = ca.issue_cert("127.0.0.1")
    async with serve_api(sim, cert, lambda h: h == "Bearer s3cret") as api:
        path = write_kubeconfig(tmp_path, {"server": api.url, "certificate-authority-data":
                                           b64(ca.cert_pem.bytes())}, {"token": "s3cret"})
        client = await load_kubeconfig(path)
        source = KubeSource(client, watch_timeout=5, watchdog=1.0, request_timeout=5,
                            backoff=lambda: Backoff(base=0.05, cap=0.2))
        source.start()
        try:
            async with asyncio.timeout(limit(10)):
                await source.wait_synced()
            pod = sim.cluster.submit("train", run_seconds=60)[0]
            async with asyncio.timeout(limit(10)):
                while pod.uid not in source.pods:  # noqa: ASYNC110 - the watch brings it
                    await asyncio.sleep(0.02)
        finally:
            await source.stop()
            await client.close()
        assert set(source.nodes) == sim_nodes(sim)
        assert set(api.seen) == {"Bearer s3cret"}
        assert source.stats["pods"].errors == 0


async def test_a_token_file_relative_to_the_kubeconfig_is_read_again_after_a_401(
        sim: SimulatorServer, ca: trustme.CA, tmp_path: Path) -> None:
    cert = ca.issue_cert("127.0.0.1")
    accepted = ["one"]
    (tmp_path / "creds").mkdir()
    (tmp_path / "creds" / "token").write_text("one\n")
    (tmp_path / "creds" / "ca.pem").write_bytes(ca.cert_pem.bytes())
    async with serve_api(sim, cert, lambda h: h == f"Bearer {accepted[0]}") as api:
        path = write_kubeconfig(tmp_path, {"server": api.url,
                                           "certificate-authority": "creds/ca.pem"},
                                {"tokenFile": "creds/token"})
        client = await load_kubeconfig(path)
        try:
            assert await node_names(client) == sim_nodes(sim)
            (tmp_path / "creds" / "token").write_text("two\n")  # rotated
            accepted[0] = "two"
            assert await node_names(client) == sim_nodes(sim)
        finally:
            await client.close()
        assert api.seen == ["Bearer one", "Bearer one", "Bearer two"]


async def test_a_client_certificate_from_data_fields(sim: SimulatorServer, ca: trustme.CA,
                                                     tmp_path: Path) -> None:
    cert = ca.issue_cert("127.0.0.1")
    client_ca = trustme.CA()
    user_cert = client_ca.issue_cert("exporter@example.com")
    async with serve_api(sim, cert, lambda h: h is None, client_ca=client_ca) as api:
        cluster = {"server": api.url, "certificate-authority-data": b64(ca.cert_pem.bytes())}
        path = write_kubeconfig(tmp_path, cluster, {
            "client-certificate-data": b64(b"".join(b.bytes() for b in
                                                    user_cert.cert_chain_pems)),
            "client-key-data": b64(user_cert.private_key_pem.bytes())})
        client = await load_kubeconfig(path)
        try:
            assert await node_names(client) == sim_nodes(sim)
        finally:
            await client.close()
        anonymous = await load_kubeconfig(write_kubeconfig(tmp_path, cluster, {}, "anon"))
        try:
            with pytest.raises(aiohttp.ClientError):  # the server wants a certificate
                await node_names(anonymous)
        finally:
            await anonymous.close()


async def test_tls_server_name_and_insecure_skip_verify(sim: SimulatorServer, ca: trustme.CA,
                                                        tmp_path: Path) -> None:
    """A certificate for another name is accepted with tls-server-name naming it, or
    without any check under insecure-skip-tls-verify; refused otherwise."""
    cert = ca.issue_cert("kubernetes.default.svc")
    async with serve_api(sim, cert) as api:
        ca_data = b64(ca.cert_pem.bytes())
        named = await load_kubeconfig(write_kubeconfig(tmp_path, {
            "server": api.url, "certificate-authority-data": ca_data,
            "tls-server-name": "kubernetes.default.svc"}, {}, "named"))
        insecure = await load_kubeconfig(write_kubeconfig(tmp_path, {
            "server": api.url, "insecure-skip-tls-verify": True}, {}, "insecure"))
        plain = await load_kubeconfig(write_kubeconfig(tmp_path, {
            "server": api.url, "certificate-authority-data": ca_data}, {}, "plain"))
        try:
            assert await node_names(named) == sim_nodes(sim)
            assert await node_names(insecure) == sim_nodes(sim)
            with pytest.raises(aiohttp.ClientConnectorCertificateError):  # not its name
                await node_names(plain)
        finally:
            for client in (named, insecure, plain):
                await client.close()


def test_kubeconfig_env_files_merge_first_wins(tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """$KUBECONFIG's files are merged as kubectl does, missing ones skipped; without it the
    default file is read; a missing explicit file is an error."""
    first = write_kubeconfig(tmp_path, {"server": "https://first:443"}, {"token": "a"}, "one")
    doc = yaml.safe_load(first.read_text())
    doc["clusters"][0]["cluster"]["server"] = "https://second:443"
    doc["clusters"].append({"name": "d", "cluster": {"server": "https://d:443"}})
    doc["current-context"] = "y"
    doc["contexts"].append({"name": "y", "context": {"cluster": "d", "user": "u"}})
    second = tmp_path / "two"
    second.write_text(yaml.safe_dump(doc))
    env = {"KUBECONFIG": os.pathsep.join([str(tmp_path / "gone"), str(first), str(second)])}
    client = asyncio.run(load_kubeconfig(environ=env))
    assert client.server == "https://first:443"
    env = {"KUBECONFIG": os.pathsep.join([str(second), str(first)])}
    assert asyncio.run(load_kubeconfig(environ=env)).server == "https://d:443"
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / ".kube").mkdir()
    first.rename(tmp_path / ".kube" / "config")
    assert asyncio.run(load_kubeconfig(environ={})).server == "https://first:443"
    with pytest.raises(KubeConfigError, match="no kubeconfig"):
        asyncio.run(load_kubeconfig(tmp_path / "gone"))


@pytest.mark.parametrize(("user", "error"), [
    ({"token": "t", "client-certificate-data": b64(b"not a cert"), "client-key-data": b64(b"x")},
     "client certificate"),
    ({"client-certificate-data": b64(b"only a cert")}, "both a certificate and a key"),
    ({"tokenFile": "nowhere"}, "cannot use the token file .*nowhere: cannot read"),
    ({"auth-provider": {"name": "gcp"}}, "gke-gcloud-auth-plugin"),
    ({"exec": {"command": "true"}}, "apiVersion"),
])
async def test_a_bad_user_fails_at_load(tmp_path: Path, user: dict[str, Any],
                                        error: str) -> None:
    path = write_kubeconfig(tmp_path, {"server": "https://127.0.0.1:1"}, user)
    with pytest.raises(KubeConfigError, match=error):
        await load_kubeconfig(path)


# ---------------------------------------------------------------------- exec plugins

PLUGIN = textwrap.dedent("""\
    import datetime, json, os, sys
    runs = os.environ["RUNS"]
    with open(runs, "a") as f:
        f.write("run\\n")
    n = sum(1 for _ in open(runs))
    info = json.loads(os.environ["KUBERNETES_EXEC_INFO"])
    if os.environ.get("FAIL"):
        sys.exit("no credentials: run gcloud auth login")
    expires = datetime.datetime.now(datetime.UTC) + datetime.timedelta(
        seconds=float(sys.argv[1]))
    print(json.dumps({"apiVersion": info["apiVersion"], "kind": "ExecCredential",
                      "status": {"token": f"token-{n}",
                                 "expirationTimestamp": expires.strftime("%Y-%m-%dT%H:%M:%SZ")}}))
""")


def exec_user(tmp_path: Path, api_version: str, lifetime: float = 3600,
              **env: str) -> dict[str, Any]:
    """An exec plugin named relative to the kubeconfig's directory."""
    (tmp_path / "bin").mkdir(exist_ok=True)
    (tmp_path / "bin" / "plugin.py").write_text(PLUGIN)
    wrapper = tmp_path / "bin" / "plugin"
    wrapper.write_text(f'#!/bin/sh\nexec "{sys.executable}" "$(dirname "$0")/plugin.py" "$@"\n')
    wrapper.chmod(0o755)
    return {"exec": {
        "apiVersion": api_version, "command": "bin/plugin", "args": [str(lifetime)],
        "env": [{"name": "RUNS", "value": str(tmp_path / "runs")},
                *({"name": k, "value": v} for k, v in env.items())],
        "interactiveMode": "Never"}}


def runs(tmp_path: Path) -> int:
    path = tmp_path / "runs"
    return len(path.read_text().splitlines()) if path.exists() else 0


@pytest.mark.parametrize("api_version", ["client.authentication.k8s.io/v1",
                                         "client.authentication.k8s.io/v1beta1"])
async def test_an_exec_token_is_kept_until_it_expires(sim: SimulatorServer, ca: trustme.CA,
                                                      tmp_path: Path, api_version: str) -> None:
    cert = ca.issue_cert("127.0.0.1")
    async with serve_api(sim, cert, lambda h: bool(h and h.startswith("Bearer token-"))) as api:
        path = write_kubeconfig(tmp_path, {"server": api.url, "certificate-authority-data":
                                           b64(ca.cert_pem.bytes())},
                                exec_user(tmp_path, api_version, lifetime=3600))
        client = await load_kubeconfig(path)
        try:
            assert runs(tmp_path) == 1  # at load: a broken plugin fails at start
            for _ in range(3):
                await node_names(client)
            assert runs(tmp_path) == 1
            assert isinstance(client.auth, ExecAuth)
            client.auth.clock = lambda: time.time() + 3601  # past its expirationTimestamp
            await node_names(client)
            assert runs(tmp_path) == 2
            await node_names(client)
            assert runs(tmp_path) == 3  # the new one, an hour from now, has expired too
        finally:
            await client.close()
        assert api.seen == ["Bearer token-1"] * 3 + ["Bearer token-2", "Bearer token-3"]


async def test_an_exec_token_refused_runs_the_plugin_again(
        sim: SimulatorServer, ca: trustme.CA, tmp_path: Path) -> None:
    cert = ca.issue_cert("127.0.0.1")
    async with serve_api(sim, cert, lambda h: h != "Bearer token-1") as api:
        path = write_kubeconfig(tmp_path, {"server": api.url, "certificate-authority-data":
                                           b64(ca.cert_pem.bytes())},
                                exec_user(tmp_path, "client.authentication.k8s.io/v1"))
        client = await load_kubeconfig(path)
        try:
            assert await node_names(client) == sim_nodes(sim)
            await node_names(client)
        finally:
            await client.close()
        assert runs(tmp_path) == 2
        assert api.seen == ["Bearer token-1", "Bearer token-2", "Bearer token-2"]


async def test_concurrent_requests_share_one_plugin_run(
        sim: SimulatorServer, ca: trustme.CA, tmp_path: Path) -> None:
    cert = ca.issue_cert("127.0.0.1")
    async with serve_api(sim, cert) as api:
        path = write_kubeconfig(tmp_path, {"server": api.url, "certificate-authority-data":
                                           b64(ca.cert_pem.bytes())},
                                exec_user(tmp_path, "client.authentication.k8s.io/v1"))
        client = await load_kubeconfig(path)
        try:
            client.auth.rejected()  # as after a 401: the token is gone
            await asyncio.gather(*(node_names(client) for _ in range(3)))
        finally:
            await client.close()
        assert runs(tmp_path) == 2


async def test_a_failing_plugin_is_a_startup_error_naming_the_setting(tmp_path: Path) -> None:
    path = write_kubeconfig(tmp_path, {"server": "https://127.0.0.1:1"},
                            exec_user(tmp_path, "client.authentication.k8s.io/v1", FAIL="1"))
    cfg = load_config(None, overrides={"kubernetes": {"kubeconfig": str(path)}})
    with pytest.raises(StartupError) as err:
        await _kube_client(cfg)
    assert err.value.setting == "kubernetes.kubeconfig"
    assert "no credentials: run gcloud auth login" in str(err.value)


# ---------------------------------------------------------------------- in the cluster


@pytest.fixture
def service_account(tmp_path: Path, ca: trustme.CA,
                    monkeypatch: pytest.MonkeyPatch) -> Callable[[int], Path]:
    """A pod's service account mount (token, CA) and Kubernetes service variables, for a
    server on ``port``; the token file's path."""
    def mount(port: int) -> Path:
        (tmp_path / "token").write_text("sa-1")
        (tmp_path / "ca.crt").write_bytes(ca.cert_pem.bytes())
        monkeypatch.setattr(kube_client, "SERVICE_TOKEN_FILE", str(tmp_path / "token"))
        monkeypatch.setattr(kube_client, "SERVICE_CA_FILE", str(tmp_path / "ca.crt"))
        monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "127.0.0.1")
        monkeypatch.setenv("KUBERNETES_SERVICE_PORT", str(port))
        return tmp_path / "token"
    return mount


async def test_in_cluster_reads_the_rotated_token(
        sim: SimulatorServer, ca: trustme.CA, service_account: Callable[[int], Path]) -> None:
    cert = ca.issue_cert("127.0.0.1")
    async with serve_api(sim, cert, lambda h: h in ("Bearer sa-1", "Bearer sa-2")) as api:
        token = service_account(int(api.url.rsplit(":", 1)[1]))
        cfg = load_config(None, overrides={"kubernetes": {"in_cluster": True}})
        client = await _kube_client(cfg)
        periodic = load_incluster(reread=0)  # read again at each request
        try:
            assert await node_names(client) == sim_nodes(sim)
            token.write_text("sa-2")
            await node_names(client)  # within the minute: the token read before
            await node_names(periodic)
        finally:
            await client.close()
            await periodic.close()
        assert api.seen == ["Bearer sa-1", "Bearer sa-1", "Bearer sa-2"]


def test_in_cluster_outside_a_pod_is_a_startup_error(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    cfg = load_config(None, overrides={"kubernetes": {"in_cluster": True}})
    with pytest.raises(StartupError) as err:
        asyncio.run(_kube_client(cfg))
    assert err.value.setting == "kubernetes.in_cluster"


def test_the_service_does_not_import_kubernetes_asyncio(tmp_path: Path) -> None:
    path = write_kubeconfig(tmp_path, {"server": "https://127.0.0.1:1"}, {"token": "t"})
    code = textwrap.dedent(f"""\
        import asyncio, sys
        from exporter.runtime.app import _kube_client
        from exporter.config import load_config
        cfg = load_config(None, overrides={{"kubernetes": {{"kubeconfig": {str(path)!r}}}}})
        async def main():
            await (await _kube_client(cfg)).close()
        asyncio.run(main())
        print(sorted(m for m in sys.modules if m.startswith("kubernetes")))
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, cwd=Path(__file__).parents[2])
    assert json.loads(out.stdout.replace("'", '"')) == []
