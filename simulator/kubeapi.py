"""A read-only Kubernetes API server subset over the simulator's ``ApiStore``.

Serves what kubectl and kubernetes_asyncio need to list and watch nodes, pods,
namespaces and events (with the events' own field selectors: ``involvedObject.kind=Pod``):
discovery (``/version``, ``/api``, ``/api/v1``, ``/apis``), list with
``resourceVersion``, ``labelSelector``, ``fieldSelector``, ``limit``/``continue``; watch
(``watch=1``) as a stream of JSON events with ``allowWatchBookmarks`` and
``timeoutSeconds``, answering a too-old version with an ERROR event carrying a 410
``Status``; server-side Tables for ``kubectl get``; Kubernetes ``Status`` errors.

For failure testing the API can answer an error status for a while (503 unavailable, 403
forbidden, 429 too many requests; for every resource or one), forbid resources or an API
group's discovery each for its own while (an RBAC grant missing), stall (accept requests and
answer none), have its watches hung (open but silent) or ended (cleanly, or by an ERROR
event with a ``Status``), and its history compacted (every resume then gets 410).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import time
from collections.abc import Callable
from typing import Any

from aiohttp import web

from exporter.model.selectors import SelectorError, field_selector, label_selector
from simulator import events, tables
from simulator.store import ApiStore, Event, Expired

Obj = dict[str, Any]

RESOURCES = {
    # plural: (kind, namespaced, short names)
    "nodes": ("Node", False, ["no"]),
    "pods": ("Pod", True, ["po"]),
    "namespaces": ("Namespace", False, ["ns"]),
    "events": ("Event", True, ["ev"]),
}
KUEUE_GROUP, KUEUE_VERSION = "kueue.x-k8s.io", "v1beta2"
KUEUE_RESOURCES = {
    # Kueue's CRDs, as served since Kueue 0.16 (v1beta2 the storage version)
    "workloads": ("Workload", True, ["kwl", "kueueworkload", "kueueworkloads"]),
    "clusterqueues": ("ClusterQueue", False, ["cq"]),
    "localqueues": ("LocalQueue", True, ["queue", "queues", "lq"]),
}
_JSON = "application/json"
_FAULT_STATUS = frozenset({403, 429, 503})
DEFAULT_WATCH_TIMEOUT = 1800.0


def status_error(code: int, reason: str, message: str, details: Obj | None = None) -> Obj:
    out: Obj = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                "message": message, "reason": reason, "code": code}
    if details:
        out["details"] = details
    return out


def _error(code: int, reason: str, message: str) -> web.Response:
    return web.json_response(status_error(code, reason, message), status=code)


class KubeApi:
    """aiohttp routes for the API subset; ``now`` is the simulator's clock."""

    def __init__(self, store: ApiStore, now: Callable[[], float], version: str,
                 bookmark_interval: float = 10.0, kueue: bool = False) -> None:
        self.store = store
        self.kueue = kueue
        """Whether Kueue's CRDs are installed (``kueue.x-k8s.io`` is served)."""
        self.now = now
        self.version = version
        self.bookmark_interval = bookmark_interval
        self.down_until = 0.0
        self.down_status = 503
        self.down_resource: str | None = None
        self.stall_until = 0.0
        self.hang_until = 0.0
        self.forbidden: dict[str, float] = {}
        """Resource (a plural such as ``namespaces``) or API group (its discovery, such as
        ``kueue.x-k8s.io``) -> until when (``time.monotonic``) it is forbidden."""
        self._watch_ends: set[asyncio.Event] = set()
        self._end_status: Obj | None = None
        self.watches_served = 0

    # --------------------------------------------------------------- failure modes

    def set_down(self, seconds: float, status: int = 503, resource: str | None = None) -> None:
        """Answer every request (for ``resource``, a plural such as ``pods``, or all) with
        ``status`` (503, 403 or 429) for ``seconds`` of wall time; 0 ends it."""
        if status not in _FAULT_STATUS:
            raise ValueError(f"status is one of {sorted(_FAULT_STATUS)}")
        self.down_until = time.monotonic() + seconds
        self.down_status, self.down_resource = status, resource

    def forbid(self, resource: str, seconds: float) -> None:
        """Answer 403 Forbidden to every request for ``resource`` (a plural, or an API group
        for its discovery document) for ``seconds`` of wall time, as a ClusterRole without
        its grant does; 0 ends it. Several can be forbidden at once, each for its own time,
        beside ``set_down``'s fault."""
        if seconds <= 0:
            self.forbidden.pop(resource, None)
        else:
            self.forbidden[resource] = time.monotonic() + seconds

    def _is_forbidden(self, request: web.Request) -> str | None:
        """The resource or group of a request ``forbid`` refuses now, else None."""
        info = request.match_info
        name = info.get("plural") or info.get("group")
        if name is None or name not in self.forbidden:
            return None
        if time.monotonic() < self.forbidden[name]:
            return name
        del self.forbidden[name]
        return None

    def stall(self, seconds: float) -> None:
        """Accept every request and answer none for ``seconds`` of wall time; 0 ends it."""
        self.stall_until = time.monotonic() + seconds

    def hang_watches(self, seconds: float) -> None:
        """Keep watch streams open but deliver nothing for ``seconds`` of wall time."""
        self.hang_until = time.monotonic() + seconds

    def end_watches(self, status: Obj | None = None) -> None:
        """Close every open watch stream cleanly (as an API server restart does), after an
        ERROR event carrying ``status`` (a ``Status``, see ``status_error``) if given."""
        self._end_status = status
        for ev in self._watch_ends:
            ev.set()

    def compact(self) -> None:
        """Drop the event history: resuming watches get 410 Gone and must relist."""
        self.store.compact()

    # --------------------------------------------------------------- routing

    def routes(self) -> list[web.RouteDef]:
        return [
            web.get("/version", self._version),
            web.get("/api", self._api),
            web.get("/apis", self._apis),
            web.get("/api/v1", self._api_v1),
            web.get("/api/v1/{plural}", self._collection),
            web.get("/api/v1/{plural}/{name}", self._item),
            web.get("/api/v1/namespaces/{namespace}/{plural}", self._collection),
            web.get("/api/v1/namespaces/{namespace}/{plural}/{name}", self._item),
            web.get("/apis/{group}/{version}", self._group_version),
            web.get("/apis/{group}/{version}/{plural}", self._collection),
            web.get("/apis/{group}/{version}/{plural}/{name}", self._item),
            web.get("/apis/{group}/{version}/namespaces/{namespace}/{plural}", self._collection),
            web.get("/apis/{group}/{version}/namespaces/{namespace}/{plural}/{name}",
                    self._item),
        ]

    @web.middleware
    async def middleware(self, request: web.Request,
                         handler: Callable[[web.Request], Any]) -> web.StreamResponse:
        if request.path.startswith("/sim/"):
            response: web.StreamResponse = await handler(request)
            return response
        while time.monotonic() < self.stall_until:  # noqa: ASYNC110 - until stall(0) too
            await asyncio.sleep(0.05)
        plural = request.match_info.get("plural")
        if time.monotonic() < self.down_until and self.down_resource in (None, plural):
            return self._fault_answer(request, plural or "")
        if (refused := self._is_forbidden(request)) is not None:
            return self._forbidden(request, refused)
        if request.method not in ("GET", "HEAD"):
            return _error(405, "MethodNotAllowed",
                          f"the server does not allow this method on the requested resource "
                          f"({request.method} {request.path}): the simulator is read-only")
        try:
            response = await handler(request)
        except web.HTTPNotFound:
            return _error(404, "NotFound", "the server could not find the requested resource")
        except web.HTTPMethodNotAllowed:
            return _error(405, "MethodNotAllowed", "method not allowed")
        return response

    @staticmethod
    def _forbidden(request: web.Request, plural: str) -> web.Response:
        """403 as the API server words it (for a group's discovery: its path)."""
        user = 'User "system:serviceaccount:gke-gpu-exporter:gke-gpu-exporter"'
        if "plural" not in request.match_info:
            return web.json_response(status_error(
                403, "Forbidden", f'forbidden: {user} cannot get path "{request.path}"'),
                status=403)
        verb = "watch" if request.query.get("watch", "").lower() in ("1", "true") else \
            "list" if "name" not in request.match_info else "get"
        scope = f'in the namespace "{request.match_info["namespace"]}"' \
            if "namespace" in request.match_info else "at the cluster scope"
        group = request.match_info.get("group", "")
        return web.json_response(status_error(
            403, "Forbidden", f'{plural} is forbidden: {user} cannot {verb} resource '
            f'"{plural}" in API group "{group}" {scope}', {"kind": plural}), status=403)

    def _fault_answer(self, request: web.Request, plural: str) -> web.Response:
        if self.down_status == 403:
            return self._forbidden(request, plural)
        if self.down_status == 429:
            return web.json_response(status_error(
                429, "TooManyRequests", "too many requests, please try again later",
                {"retryAfterSeconds": 1}), status=429, headers={"Retry-After": "1"})
        return _error(503, "ServiceUnavailable", "the server is currently unable to handle "
                      "the request")

    # --------------------------------------------------------------- discovery

    async def _version(self, _: web.Request) -> web.Response:
        minor = self.version.split(".")[1]
        return web.json_response({
            "major": "1", "minor": minor, "gitVersion": self.version,
            "gitCommit": "0" * 40, "gitTreeState": "clean", "buildDate": "2026-10-01T00:00:00Z",
            "goVersion": "go1.24.9", "compiler": "gc", "platform": "linux/amd64"})

    async def _api(self, request: web.Request) -> web.Response:
        return web.json_response({
            "kind": "APIVersions", "versions": ["v1"],
            "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0",
                                            "serverAddress": request.host}]})

    async def _apis(self, _: web.Request) -> web.Response:
        version = {"groupVersion": f"{KUEUE_GROUP}/{KUEUE_VERSION}", "version": KUEUE_VERSION}
        groups = [{"name": KUEUE_GROUP, "versions": [version], "preferredVersion": version}] \
            if self.kueue else []
        return web.json_response({"kind": "APIGroupList", "apiVersion": "v1", "groups": groups})

    async def _group_version(self, request: web.Request) -> web.Response:
        if not self._serves(request):
            raise web.HTTPNotFound()
        resources = [
            {"name": plural, "singularName": kind.lower(), "namespaced": namespaced,
             "kind": kind, "verbs": ["get", "list", "watch"], "shortNames": short}
            for plural, (kind, namespaced, short) in KUEUE_RESOURCES.items()]
        return web.json_response({"kind": "APIResourceList", "apiVersion": "v1",
                                  "groupVersion": f"{KUEUE_GROUP}/{KUEUE_VERSION}",
                                  "resources": resources})

    def _serves(self, request: web.Request) -> bool:
        """Whether the request's group and version (none: the core group) are served."""
        group = request.match_info.get("group")
        return group is None or (self.kueue and group == KUEUE_GROUP
                                 and request.match_info.get("version") == KUEUE_VERSION)

    async def _api_v1(self, _: web.Request) -> web.Response:
        resources = [
            {"name": plural, "singularName": kind.lower(), "namespaced": namespaced,
             "kind": kind, "verbs": ["get", "list", "watch"], "shortNames": short,
             **({"categories": ["all"]} if kind == "Pod" else {})}
            for plural, (kind, namespaced, short) in RESOURCES.items()
        ]
        return web.json_response({"kind": "APIResourceList", "groupVersion": "v1",
                                  "resources": resources})

    # --------------------------------------------------------------- objects

    def _resource(self, request: web.Request) -> tuple[str, str | None]:
        plural = request.match_info["plural"]
        namespace = request.match_info.get("namespace")
        served = RESOURCES if "group" not in request.match_info else KUEUE_RESOURCES
        if not self._serves(request) or plural not in served:
            raise web.HTTPNotFound()
        kind, namespaced, _ = served[plural]
        if namespace is not None and not namespaced:
            raise web.HTTPNotFound()
        return kind, namespace

    async def _item(self, request: web.Request) -> web.StreamResponse:
        kind, namespace = self._resource(request)
        name = request.match_info["name"]
        key = f"{namespace}/{name}" if namespace else name
        obj = self.store.get(kind, key)
        if obj is None:
            plural = request.match_info["plural"]
            return web.json_response(
                status_error(404, "NotFound", f'{plural} "{name}" not found',
                             {"name": name, "kind": plural}), status=404)
        if _wants_table(request):
            return web.json_response(tables.table(kind, [obj], self.now(),
                                                  obj["metadata"]["resourceVersion"]))
        return web.json_response(obj)

    async def _collection(self, request: web.Request) -> web.StreamResponse:
        kind, namespace = self._resource(request)
        q = request.query
        try:
            match_labels = label_selector(q.get("labelSelector"))
            match_fields = (events.field_selector if kind == "Event" else field_selector)(
                q.get("fieldSelector"))
        except SelectorError as exc:
            return _error(400, "BadRequest", str(exc))

        def matches(obj: Obj) -> bool:
            if namespace is not None and obj["metadata"].get("namespace") != namespace:
                return False
            return match_labels(obj) and match_fields(obj)

        if q.get("watch", "").lower() in ("1", "true"):
            return await self._watch(request, kind, matches)
        return self._list(request, kind, matches)

    def _list(self, request: web.Request, kind: str,
              matches: Callable[[Obj], bool]) -> web.Response:
        items = [o for o in self.store.list_objects(kind) if matches(o)]
        rv = str(self.store.resource_version)
        meta: Obj = {"resourceVersion": rv}
        limit = int(request.query.get("limit") or 0)
        offset = 0
        if token := request.query.get("continue"):
            try:
                rv, offset_s = base64.urlsafe_b64decode(token.encode()).decode().split(":")
                offset = int(offset_s)
            except ValueError:
                return _error(400, "BadRequest", "invalid continue token")
            meta["resourceVersion"] = rv
        if limit > 0:
            page = items[offset: offset + limit]
            if offset + limit < len(items):
                meta["continue"] = base64.urlsafe_b64encode(
                    f"{rv}:{offset + limit}".encode()).decode()
                meta["remainingItemCount"] = len(items) - offset - limit
            items = page
        if _wants_table(request):
            body = tables.table(kind, items, self.now(), meta["resourceVersion"])
            body["metadata"] = meta
            return web.json_response(body)
        return web.json_response({"kind": f"{kind}List", "apiVersion": _api_version(kind),
                                  "metadata": meta, "items": items})

    async def _watch(self, request: web.Request, kind: str,
                     matches: Callable[[Obj], bool]) -> web.StreamResponse:
        q = request.query
        as_table = _wants_table(request)
        bookmarks = q.get("allowWatchBookmarks", "").lower() in ("1", "true")
        timeout = float(q.get("timeoutSeconds") or DEFAULT_WATCH_TIMEOUT)
        start_rv = q.get("resourceVersion", "")
        queue: asyncio.Queue[Event] = asyncio.Queue()
        try:
            if start_rv in ("", "0"):
                backlog = [Event(0, kind, "ADDED", o) for o in self.store.list_objects(kind)]
            else:
                backlog = self.store.events_since(kind, int(start_rv))
        except Expired as exc:
            backlog = []
            expired: Expired | None = exc
        except ValueError:
            return _error(400, "BadRequest", f"invalid resourceVersion {start_rv!r}")
        else:
            expired = None
        unsubscribe = self.store.listen(
            lambda e: queue.put_nowait(e) if e.kind == kind else None)
        ended = asyncio.Event()
        self._watch_ends.add(ended)
        self.watches_served += 1
        response = web.StreamResponse(headers={"Content-Type": _JSON,
                                               "Cache-Control": "no-cache, private"})
        try:
            await response.prepare(request)
            if expired is not None:
                await _send(response, "ERROR", status_error(410, "Expired", str(expired)))
                return response
            first_table = True
            for event in backlog:
                if matches(event.obj):
                    await self._emit(response, event, as_table, first_table)
                    first_table = False
            deadline = time.monotonic() + timeout
            next_bookmark = time.monotonic() + self.bookmark_interval
            while not ended.is_set():
                now = time.monotonic()
                if now >= deadline:
                    break
                wait = min(deadline, next_bookmark) - now
                incoming = await _next_event(queue, ended, max(0.01, wait))
                if ended.is_set():
                    break
                if incoming is None:
                    if bookmarks and time.monotonic() >= next_bookmark and \
                            time.monotonic() >= self.hang_until:
                        await _send(response, "BOOKMARK", {
                            "kind": kind, "apiVersion": _api_version(kind),
                            "metadata": {"resourceVersion": str(self.store.resource_version)}})
                    next_bookmark = time.monotonic() + self.bookmark_interval
                    continue
                if (hung := self.hang_until - time.monotonic()) > 0:
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(ended.wait(), timeout=hung)
                if ended.is_set():
                    break
                if matches(incoming.obj):
                    await self._emit(response, incoming, as_table, first_table)
                    first_table = False
            if ended.is_set() and self._end_status is not None:
                await _send(response, "ERROR", self._end_status)
        except ConnectionResetError:
            pass
        finally:
            unsubscribe()
            self._watch_ends.discard(ended)
        return response

    async def _emit(self, response: web.StreamResponse, event: Event, as_table: bool,
                    first_table: bool) -> None:
        obj = event.obj
        if as_table:
            kind = obj["kind"]
            obj = tables.table(kind, [obj], self.now(), obj["metadata"]["resourceVersion"],
                               with_columns=first_table)
        await _send(response, event.type, obj)


async def _next_event(queue: asyncio.Queue[Event], ended: asyncio.Event,
                      seconds: float) -> Event | None:
    """The next event, or None when ``seconds`` pass or the watch is ended first."""
    if not queue.empty():
        return queue.get_nowait()
    get = asyncio.ensure_future(queue.get())
    end = asyncio.ensure_future(ended.wait())
    try:
        await asyncio.wait({get, end}, timeout=seconds, return_when=asyncio.FIRST_COMPLETED)
    finally:
        end.cancel()
        if not get.done():
            get.cancel()
    return get.result() if get.done() and not get.cancelled() else None


async def _send(response: web.StreamResponse, etype: str, obj: Obj) -> None:
    await response.write(json.dumps({"type": etype, "object": obj},
                                    separators=(",", ":")).encode() + b"\n")


def _api_version(kind: str) -> str:
    kueue = {k for k, _, _ in KUEUE_RESOURCES.values()}
    return f"{KUEUE_GROUP}/{KUEUE_VERSION}" if kind in kueue else "v1"


def _wants_table(request: web.Request) -> bool:
    return "as=Table" in request.headers.get("Accept", "")
