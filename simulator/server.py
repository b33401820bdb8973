"""The simulator over real HTTP on loopback.

- One dcgm-exporter endpoint per node, at ``http://<node InternalIP>:<port>/metrics``. Each
  node has its own loopback address (``127.1.x.y``; Linux routes all of 127.0.0.0/8 to
  the loopback interface), as each GKE node has its own IP with dcgm-exporter on :9400.
  A NotReady node or an endpoint fault ``refuse`` closes the listener (connection
  refused); ``error`` answers 500; ``hang`` accepts and never answers.
- One Service in front of those endpoints, at ``http://127.2.0.1:<port>/metrics`` (its
  ClusterIP): each request is answered by the next reachable node's dcgm-exporter in turn
  (round robin, as kube-proxy spreads connections), among the nodes of the scenario's
  ``dcgm_service.pools``; 503 when none is reachable.
- The Kubernetes API subset (``kubeapi``) and the control API (``/sim/...``) on one port.
  ``refuse_api`` closes that port for a while (the control API with it).

Virtual time moves by ``advance`` (or ``POST /sim/advance``), or by itself at ``speed``
simulated seconds per real second.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import logging
import socket
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import yaml
from aiohttp import web
from pydantic import ValidationError

from simulator.cluster import Cluster, Node, Pod
from simulator.dcgm_pages import DcgmPages
from simulator.kubeapi import KubeApi
from simulator.scenario import Fault, Scenario
from simulator.store import ApiStore

log = logging.getLogger(__name__)

HANG_LIMIT_SECONDS = 600.0
SERVICE_ADDRESS = "127.2.0.1"
"""The dcgm-exporter Service's ClusterIP (on dcgm-exporter's port, as on a cluster)."""
_TEXT = "text/plain; version=0.0.4; charset=utf-8"


@dataclass(frozen=True, slots=True)
class Outputs:
    kubeconfig: Path
    targets: Path


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        port: int = s.getsockname()[1]
        return port


class SimulatorServer:
    """The simulated cluster served over HTTP; use as an async context manager."""

    def __init__(self, scenario: Scenario, *, host: str = "127.0.0.1", api_port: int = 0,
                 dcgm_port: int = 0, speed: float = 0.0, bookmark_interval: float = 10.0,
                 history: int = 50000) -> None:
        self.scenario = scenario
        self.host = host
        self._api_port = api_port
        self.dcgm_port = dcgm_port or free_port("127.1.0.1")
        self.speed = speed
        self.store = ApiStore(history=history)
        self.cluster = Cluster(scenario, self.store, dcgm_port=self.dcgm_port)
        self.api = KubeApi(self.store, lambda: self.cluster.now, scenario.kubernetes_version,
                           bookmark_interval=bookmark_interval, kueue=scenario.kueue is not None)
        self._api_runner: web.AppRunner | None = None
        self._api_site: web.TCPSite | None = None
        self._reopen: asyncio.Task[None] | None = None
        self._dcgm_runner: web.AppRunner | None = None
        self._sites: dict[str, web.TCPSite] = {}
        self._by_address: dict[str, str] = {}
        self.pages = DcgmPages(self.cluster, scenario.dcgm_collect_interval)
        self._service_turn = 0
        self.service_answers: collections.deque[tuple[float, str]] = \
            collections.deque(maxlen=10000)
        """Who answered the latest requests to the Service: (virtual time, node)."""
        self._ticker: asyncio.Task[None] | None = None
        self._lock = asyncio.Lock()
        self._changed = asyncio.Condition()
        self.api_port = 0

    # ------------------------------------------------------------------ lifecycle

    async def __aenter__(self) -> SimulatorServer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def start(self) -> None:
        api_app = web.Application(middlewares=[self.api.middleware])
        api_app.add_routes(self.api.routes())
        api_app.add_routes(self._control_routes())
        self._api_runner = web.AppRunner(api_app, access_log=None, shutdown_timeout=0.5)
        await self._api_runner.setup()
        site = self._api_site = web.TCPSite(self._api_runner, self.host, self._api_port)
        await site.start()
        sockets = self._api_runner.addresses
        self.api_port = sockets[0][1]
        dcgm_app = web.Application()
        dcgm_app.add_routes([web.get("/metrics", self._metrics)])
        self._dcgm_runner = web.AppRunner(dcgm_app, access_log=None, shutdown_timeout=0.5)
        await self._dcgm_runner.setup()
        await self._sync_endpoints()
        await web.TCPSite(self._dcgm_runner, SERVICE_ADDRESS, self.dcgm_port,
                          reuse_address=True).start()
        if self.speed > 0:
            self.start_ticking()

    def start_ticking(self) -> None:
        """Let virtual time flow at ``speed`` simulated seconds per real second."""
        if self._ticker is None and self.speed > 0:
            self._ticker = asyncio.create_task(self._tick_forever())

    async def refuse_api(self, seconds: float) -> None:
        """Close the API's listener and its connections (connection refused) for
        ``seconds`` of wall time."""
        if self._reopen is not None:
            self._reopen.cancel()
        if self._api_site is not None:
            await self._api_site.stop()
            self._api_site = None
        self.api.end_watches()
        assert self._api_runner is not None and self._api_runner.server is not None
        for conn in list(self._api_runner.server.connections):
            conn.force_close()
        self._reopen = asyncio.create_task(self._reopen_api(seconds))

    async def _refuse_soon(self, seconds: float) -> None:
        await asyncio.sleep(0.05)
        self._reopen = None
        await self.refuse_api(seconds)

    async def _reopen_api(self, seconds: float) -> None:
        await asyncio.sleep(seconds)
        assert self._api_runner is not None
        site = web.TCPSite(self._api_runner, self.host, self.api_port, reuse_address=True)
        await site.start()
        self._api_site = site
        self._reopen = None

    async def stop(self) -> None:
        if self._reopen is not None:
            self._reopen.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reopen
        if self._ticker is not None:
            self._ticker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._ticker
        self.api.end_watches()
        for runner in (self._api_runner, self._dcgm_runner):
            if runner is not None:
                await runner.cleanup()
        self._sites.clear()

    # ------------------------------------------------------------------ time

    async def advance(self, seconds: float) -> None:
        """Advance virtual time by whole steps, keeping the event loop responsive."""
        async with self._lock:
            steps = max(0, round(seconds / self.cluster.step))
            for i in range(steps):
                self.cluster.advance(self.cluster.step)
                self.pages.stepped()
                if i % 20 == 19:
                    await asyncio.sleep(0)
            await self._bump()

    async def _bump(self) -> None:
        """Publish a state change: new exposition, listeners opened or closed."""
        self.pages.changed()
        await self._sync_endpoints()
        async with self._changed:
            self._changed.notify_all()

    async def inject(self, fault: Fault) -> None:
        async with self._lock:
            self.cluster.inject(fault)
            await self._bump()

    async def delete_pod(self, pod: Pod, *, grace_seconds: int = 30) -> None:
        """``Cluster.delete_pod``, served at once."""
        async with self._lock:
            self.cluster.delete_pod(pod, grace_seconds=grace_seconds)
            await self._bump()

    async def _tick_forever(self) -> None:
        interval = self.cluster.step / self.speed
        next_at = time.monotonic() + interval
        while True:
            await asyncio.sleep(max(0.0, next_at - time.monotonic()))
            next_at += interval
            await self.advance(self.cluster.step)

    # ------------------------------------------------------------------ dcgm endpoints

    def endpoint_url(self, node: Node) -> str:
        return f"http://{node.address}:{self.dcgm_port}/metrics"

    @property
    def service_url(self) -> str:
        """The Service in front of the dcgm-exporters of ``dcgm_service.pools``' nodes."""
        return f"http://{SERVICE_ADDRESS}:{self.dcgm_port}/metrics"

    def service_nodes(self) -> list[Node]:
        """The nodes the Service fronts, reachable or not, by name."""
        pools = self.scenario.dcgm_service.pools
        return sorted((n for n in self.cluster.live_nodes()
                       if pools is None or n.pool.name in pools), key=lambda n: n.name)

    def _service_backend(self) -> Node | None:
        """The node whose dcgm-exporter answers this request to the Service: the next
        reachable one in turn."""
        reachable = [n for n in self.service_nodes() if n.name in self._sites]
        if not reachable:
            return None
        node = reachable[self._service_turn % len(reachable)]
        self._service_turn += 1
        self.service_answers.append((self.cluster.now, node.name))
        return node

    @property
    def targets(self) -> list[str]:
        return [self.endpoint_url(n) for n in sorted(self.cluster.live_nodes(),
                                                     key=lambda n: n.name)]

    async def _sync_endpoints(self) -> None:
        """Open a listener for each reachable node, close the rest."""
        assert self._dcgm_runner is not None
        wanted = {n.name: n for n in self.cluster.live_nodes()
                  if n.ready and n.endpoint_mode != "refuse"}
        for name in [n for n in self._sites if n not in wanted]:
            await self._sites.pop(name).stop()
        for name, node in wanted.items():
            if name not in self._sites:
                site = web.TCPSite(self._dcgm_runner, node.address, self.dcgm_port,
                                   reuse_address=True)
                await site.start()
                self._sites[name] = site
                self._by_address[node.address] = name
        self.pages.keep(wanted)

    async def _metrics(self, request: web.Request) -> web.StreamResponse:
        sockname = request.transport.get_extra_info("sockname") if request.transport else None
        if sockname and sockname[0] == SERVICE_ADDRESS:
            node = self._service_backend()
            if node is None:
                return web.Response(status=503, text="no endpoints available for service "
                                    "\"gke-managed-system/dcgm-exporter\"\n")
        else:
            name = self._by_address.get(sockname[0]) if sockname else None
            node = self.cluster.nodes.get(name) if name else None
        if node is None:
            raise web.HTTPNotFound()
        if node.endpoint_mode == "hang":
            async with self._changed:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(
                        self._changed.wait_for(lambda: node.endpoint_mode != "hang"),
                        timeout=HANG_LIMIT_SECONDS)
        if node.endpoint_mode == "error":
            return web.Response(status=500, text="failed to collect metrics: DCGM error\n")
        return web.Response(body=self.pages.page(node), headers={"Content-Type": _TEXT})

    # ------------------------------------------------------------------ outputs

    @property
    def api_url(self) -> str:
        return f"http://{self.host}:{self.api_port}"

    def kubeconfig(self) -> str:
        s = self.scenario
        name = f"gke_{s.project}_{s.region}_{s.cluster}"
        return yaml.safe_dump({
            "apiVersion": "v1", "kind": "Config", "preferences": {},
            "clusters": [{"name": name, "cluster": {"server": self.api_url}}],
            "users": [{"name": name, "user": {}}],
            "contexts": [{"name": name, "context": {"cluster": name, "user": name,
                                                    "namespace": "default"}}],
            "current-context": name,
        }, sort_keys=False)

    def write_outputs(self, out_dir: Path) -> Outputs:
        out_dir.mkdir(parents=True, exist_ok=True)
        kubeconfig = out_dir / "kubeconfig"
        kubeconfig.write_text(self.kubeconfig())
        targets = out_dir / "targets.txt"
        targets.write_text("".join(t + "\n" for t in self.targets))
        return Outputs(kubeconfig, targets)

    # ------------------------------------------------------------------ control API

    def _control_routes(self) -> list[web.RouteDef]:
        return [
            web.get("/sim/status", self._status),
            web.post("/sim/advance", self._advance),
            web.post("/sim/faults", self._fault),
            web.post("/sim/api-faults", self._api_fault),
            web.get("/sim/truth", self._truth),
            web.get("/sim/targets", self._targets),
            web.get("/sim/kueue/metrics", self._kueue_metrics),
        ]

    async def _kueue_metrics(self, _: web.Request) -> web.Response:
        """What Kueue's own controller exports for the simulated events (404 without Kueue)."""
        if self.cluster.kueue is None:
            raise web.HTTPNotFound(text="this scenario has no Kueue")
        return web.Response(text=self.cluster.kueue.exposition(),
                            content_type="text/plain", charset="utf-8")

    def status(self) -> dict[str, Any]:
        c = self.cluster
        return {"now": datetime.fromtimestamp(c.now).astimezone().isoformat(),
                "now_unix": c.now, "step_seconds": c.step, "nodes": len(c.live_nodes()),
                "gpus": sum(len(n.gpus) for n in c.live_nodes()),
                "gpus_by_state": c.gpus_by_state(),
                "pods": len(c.pods), "pending_pods": len(c.pending),
                "resource_version": self.store.resource_version, "speed": self.speed}

    async def _status(self, _: web.Request) -> web.Response:
        return web.json_response(self.status())

    async def _advance(self, request: web.Request) -> web.Response:
        try:
            seconds = float(request.query["seconds"])
        except (KeyError, ValueError):
            return web.json_response({"error": "seconds=<number> is required"}, status=400)
        await self.advance(seconds)
        return web.json_response(self.status())

    async def _fault(self, request: web.Request) -> web.Response:
        try:
            body = await request.json()
            fault = Fault.model_validate({"at": 0, **body})
        except (json.JSONDecodeError, ValidationError, TypeError) as exc:
            return web.json_response({"error": str(exc)}, status=400)
        if fault.pool_name not in {p.name for p in self.scenario.pools}:
            return web.json_response({"error": f"unknown pool {fault.pool_name!r}"}, status=400)
        await self.inject(fault)
        return web.json_response(self.status())

    async def _api_fault(self, request: web.Request) -> web.Response:
        try:
            body = await request.json()
            action, seconds = body["action"], float(body.get("seconds", 0))
        except (json.JSONDecodeError, KeyError, TypeError, ValueError):
            return web.json_response({"error": "body: {action, seconds}"}, status=400)
        if action == "down":
            try:
                self.api.set_down(seconds, int(body.get("status", 503)), body.get("resource"))
            except (TypeError, ValueError) as exc:
                return web.json_response({"error": str(exc)}, status=400)
        elif action == "forbid" and isinstance(body.get("resource"), str):
            self.api.forbid(body["resource"], seconds)
        elif action == "stall":
            self.api.stall(seconds)
        elif action == "refuse":  # once this answer is sent: it closes this connection too
            self._reopen = asyncio.create_task(self._refuse_soon(seconds))
        elif action == "hang-watches":
            self.api.hang_watches(seconds)
        elif action == "end-watches":
            self.api.end_watches()
        elif action == "compact":
            self.api.compact()
        else:
            return web.json_response(
                {"error": "action is one of down (status 503, 403 or 429; resource), forbid "
                 "(resource: a plural or an API group), stall, "
                 "refuse, hang-watches, end-watches, compact"},
                status=400)
        return web.json_response({"ok": True})

    async def _truth(self, request: web.Request) -> web.Response:
        c = self.cluster
        try:
            start = _time_arg(request.query.get("start"), c.start)
            end = _time_arg(request.query.get("end"), c.now)
        except ValueError as exc:
            return web.json_response({"error": str(exc)}, status=400)
        c.close()
        truth = c.truth.report(start, min(end, c.now))
        return web.json_response(truth.to_json())

    async def _targets(self, _: web.Request) -> web.Response:
        return web.Response(text="".join(t + "\n" for t in self.targets))


def _time_arg(value: str | None, default: float) -> float:
    if value is None:
        return default
    try:
        return float(value)
    except ValueError:
        return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
