"""The events watch: Events about pods listed (page by page) and watched from a server that
replays the fixture's objects (``tests/fixtures/scheduling/events_real.yaml``), kept per pod
and reason, deduplicated, bounded, forgotten with their pod, relisted after a 410, and never
waited for: a cluster that forbids them, or does not serve them, is watched all the same."""

from __future__ import annotations

import asyncio
import contextlib
import copy
import json
import logging
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from aiohttp import web
from aiohttp.test_utils import TestServer

from exporter.backoff import Backoff
from exporter.runtime.readiness import VIEW_KINDS
from exporter.sources import kube
from exporter.sources.kube import EVENT_SWEEP_SECONDS, EVENT_UNKNOWN_POD_TTL, KubeSource
from exporter.sources.kube_client import KubeClient
from simulator.kubeapi import status_error
from tests.timing import limit

Obj = dict[str, Any]
EVENTS = [e["object"] for e in yaml.safe_load(
    (Path(__file__).parents[1] / "fixtures" / "scheduling" / "events_real.yaml")
    .read_text())["items"]]
WAITING = "5d0f3c5e-7a8b-4a63-9d0c-1f1e2b3c4d5e"
"""The pod waiting for its GPUs (the scheduler's and the autoscaler's events)."""
PULLING = "c79a534d-9c74-45bf-acf4-5a9985c39c14"
"""The pod pulling its image (the kubelet's)."""
PLURALS = {"nodes": "Node", "pods": "Pod", "namespaces": "Namespace", "events": "Event"}


def pod(name: str, uid: str, gpus: int, namespace: str = "default") -> Obj:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace, "uid": uid,
                         "creationTimestamp": "2024-10-24T09:40:00Z"},
            "spec": {"containers": [{"name": "main", "resources": {
                "limits": {"nvidia.com/gpu": str(gpus)}} if gpus else {}}]},
            "status": {"phase": "Pending"}}


def event(base: int, **change: Any) -> Obj:
    """Fixture event ``base`` (index), changed."""
    obj = copy.deepcopy(EVENTS[base])
    for key, value in change.items():
        obj[key] = value
    return obj


class ReplayApi:
    """The list + watch part of an API server over objects the test puts: lists (with
    ``limit`` and ``continue``), watches from a resourceVersion (410 once the history is
    compacted), 403 for the kinds forbidden, 404 for those not served."""

    def __init__(self, served: tuple[str, ...] = tuple(PLURALS)) -> None:
        self.served = set(served)
        self.forbidden: set[str] = set()
        self.objects: dict[str, dict[str, Obj]] = {p: {} for p in PLURALS}
        self.rv = 100
        self.floor = 0
        self.history: list[tuple[int, str, str, Obj]] = []
        self.queries: dict[str, list[dict[str, str]]] = {p: [] for p in PLURALS}
        self._streams: set[asyncio.Queue[tuple[str, str, Obj] | None]] = set()

    # ---------------------------------------------------------------- the test's side

    def put(self, plural: str, obj: Obj) -> None:
        obj = copy.deepcopy(obj)
        meta = obj["metadata"]
        key = f"{meta.get('namespace', '')}/{meta['name']}"
        etype = "MODIFIED" if key in self.objects[plural] else "ADDED"
        self._record(plural, etype, key, obj)

    def delete(self, plural: str, obj: Obj) -> None:
        meta = obj["metadata"]
        key = f"{meta.get('namespace', '')}/{meta['name']}"
        self._record(plural, "DELETED", key, copy.deepcopy(self.objects[plural][key]))

    def _record(self, plural: str, etype: str, key: str, obj: Obj) -> None:
        self.rv += 1
        obj["metadata"]["resourceVersion"] = str(self.rv)
        if etype == "DELETED":
            self.objects[plural].pop(key)
        else:
            self.objects[plural][key] = obj
        self.history.append((self.rv, plural, etype, obj))
        for q in self._streams:
            q.put_nowait((plural, etype, obj))

    def compact(self) -> None:
        """Forget the history: every watch resuming from a version seen gets 410."""
        self.floor = self.rv + 1

    def end_watches(self) -> None:
        for q in self._streams:
            q.put_nowait(None)

    # ---------------------------------------------------------------- the server's side

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/api/v1/{plural}", self._collection)
        return app

    async def _collection(self, request: web.Request) -> web.StreamResponse:
        plural = request.match_info["plural"]
        if plural not in self.served:
            return web.json_response(status_error(404, "NotFound", "the server could not "
                                                  "find the requested resource"), status=404)
        q = dict(request.query)
        self.queries[plural].append(q)
        if plural in self.forbidden:
            return web.json_response(status_error(
                403, "Forbidden", f'{plural} is forbidden: User "system:serviceaccount:x:y" '
                f'cannot list resource "{plural}" in API group "" at the cluster scope'),
                status=403)
        wanted = self._selected(plural, q.get("fieldSelector", ""))
        if q.get("watch") == "1":
            return await self._watch(request, plural, int(q["resourceVersion"]), wanted)
        items = [o for o in self.objects[plural].values() if wanted(o)]
        start = int(q.get("continue") or 0)
        limit = int(q.get("limit") or 0) or len(items)
        meta: Obj = {"resourceVersion": str(self.rv)}
        if start + limit < len(items):
            meta["continue"] = str(start + limit)
        return web.json_response({"kind": f"{PLURALS[plural]}List", "apiVersion": "v1",
                                  "metadata": meta, "items": items[start:start + limit]})

    @staticmethod
    def _selected(plural: str, selector: str) -> Callable[[Obj], bool]:
        if plural != "events" or not selector:
            return lambda _: True
        path, value = selector.split("=")
        assert path == "involvedObject.kind"
        return lambda o: o.get("involvedObject", {}).get("kind") == value

    async def _watch(self, request: web.Request, plural: str, since: int,
                     wanted: Callable[[Obj], bool]) -> web.StreamResponse:
        resp = web.StreamResponse()
        await resp.prepare(request)
        if since < self.floor:
            await self._send(resp, "ERROR", status_error(410, "Expired", "too old"))
            return resp
        queue: asyncio.Queue[tuple[str, str, Obj] | None] = asyncio.Queue()
        self._streams.add(queue)
        try:
            for rv, kind, etype, obj in self.history:
                if rv > since and kind == plural and wanted(obj):
                    await self._send(resp, etype, obj)
            while (got := await queue.get()) is not None:
                kind, etype, obj = got
                if kind == plural and wanted(obj):
                    await self._send(resp, etype, obj)
        finally:
            self._streams.discard(queue)
        return resp

    @staticmethod
    async def _send(resp: web.StreamResponse, etype: str, obj: Obj) -> None:
        await resp.write(json.dumps({"type": etype, "object": obj}).encode() + b"\n")


class Clock:
    def __init__(self) -> None:
        self.now = 1_729_764_000.0

    def __call__(self) -> float:
        return self.now


@contextlib.asynccontextmanager
async def watching(api: ReplayApi, clock: Callable[[], float] | None = None,
                   **options: Any) -> AsyncIterator[KubeSource]:
    server = TestServer(api.app())
    await server.start_server()
    client = KubeClient(str(server.make_url("")).rstrip("/"))
    src = KubeSource(client, watch_timeout=30, watchdog=30, request_timeout=5,
                     backoff=lambda: Backoff(base=0.05, cap=0.2),
                     **({"clock": clock} if clock else {}), **options)
    src.start()
    try:
        async with asyncio.timeout(limit(10)):
            await src.wait_synced()
        yield src
    finally:
        await src.stop()
        await client.close()
        await server.close()


async def until(condition: Callable[[], bool], limit: float = 10) -> None:
    async with asyncio.timeout(limit):
        while not condition():  # noqa: ASYNC110 - polling the state of another party
            await asyncio.sleep(0.01)


@pytest.fixture
def api() -> ReplayApi:
    api = ReplayApi()
    api.put("pods", pod("finetune-job-6k6mj", WAITING, 8))
    api.put("pods", pod("log-test", PULLING, 1))
    for obj in EVENTS:
        api.put("events", obj)
    api.put("events", {**event(1), "involvedObject": {"kind": "Node", "name": "n", "uid": "n"},
                       "metadata": {"name": "n.1", "namespace": "default"}})
    return api


def reasons(source: KubeSource) -> dict[str, set[str]]:
    return {uid: set(held) for uid, held in source.pod_events.items()}


async def test_events_about_pods_are_listed_page_by_page_and_kept_per_pod_and_reason(
        api: ReplayApi, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(kube.PAGED, "events", 2)
    async with watching(api) as source:
        await until(lambda: source.synced["events"].is_set())
        assert reasons(source) == {
            WAITING: {"FailedScheduling", "TriggeredScaleUp", "FailedScaleUp",
                      "NotTriggerScaleUp"},
            PULLING: {"Pulling", "Pulled"}}
        assert source.up["events"] and source.stats["events"].lists == 1
        lists = [q for q in api.queries["events"] if "watch" not in q]
        assert len(lists) == 5, "nine events about pods, two a page"
        assert {q["fieldSelector"] for q in api.queries["events"]} == {
            "involvedObject.kind=Pod"}
        assert [q.get("continue") for q in lists] == [None, "2", "4", "6", "8"]
        scale_up = source.pod_events[WAITING]["TriggeredScaleUp"]
        assert (scale_up.count, scale_up.component) == (2, "cluster-autoscaler")


async def test_an_update_of_an_event_replaces_it_and_an_older_word_does_not(
        api: ReplayApi) -> None:
    async with watching(api) as source:
        held = source.pod_events[WAITING]
        api.put("events", event(3, count=28, lastTimestamp="2024-10-24T09:58:48Z"))
        await until(lambda: source.pod_events[WAITING]["NotTriggerScaleUp"].count == 28)
        assert source.pod_events[WAITING]["NotTriggerScaleUp"].last_unix == \
            held["NotTriggerScaleUp"].last_unix + 30
        assert held["NotTriggerScaleUp"].count == 27, "a pod's table is replaced, not changed"
        older = event(2, metadata={"name": "finetune-job-6k6mj.old", "namespace": "default"},
                      message="Node scale up in zones us-central1-b associated with this pod "
                              "failed: GCE quota exceeded. Pod is at risk of not being "
                              "scheduled.", lastTimestamp="2024-10-24T09:52:00Z")
        newer = event(1, metadata={"name": "finetune-job-6k6mj.new", "namespace": "default"},
                      lastTimestamp="2024-10-24T09:59:00Z", count=1)
        api.put("events", older)
        api.put("events", newer)
        await until(lambda: source.pod_events[WAITING]["TriggeredScaleUp"].count == 1)
        assert "out of resources" in source.pod_events[WAITING]["FailedScaleUp"].message
        api.delete("events", event(0))  # the API server's TTL: the pod's evidence stays
        api.put("events", event(3, count=29, lastTimestamp="2024-10-24T09:59:18Z"))
        await until(lambda: source.pod_events[WAITING]["NotTriggerScaleUp"].count == 29)
        assert "FailedScheduling" in source.pod_events[WAITING]


async def test_a_pods_events_go_when_it_runs_or_goes_and_a_pod_without_gpus_keeps_none(
        api: ReplayApi) -> None:
    async with watching(api) as source:
        running = pod("log-test", PULLING, 1)
        running["status"]["phase"] = "Running"
        api.put("pods", running)
        await until(lambda: PULLING not in source.pod_events)
        api.put("events", event(6, count=2, lastTimestamp="2024-10-24T09:46:00Z"))
        api.put("events", event(3, count=28, lastTimestamp="2024-10-24T09:58:48Z"))
        await until(lambda: source.pod_events[WAITING]["NotTriggerScaleUp"].count == 28)
        assert PULLING not in source.pod_events, "a late word about a running pod"
        api.delete("pods", running)
        await until(lambda: PULLING not in source.pods)
        api.put("pods", pod("finetune-job-6k6mj", WAITING, 0))  # edited to ask for none
        await until(lambda: WAITING not in source.pod_events)
        api.put("events", event(3, count=30, lastTimestamp="2024-10-24T10:00:00Z"))
        api.put("pods", pod("next", "next-uid", 2))
        api.put("events", event(5, involvedObject={
            "kind": "Pod", "name": "next", "namespace": "default", "uid": "next-uid"},
            metadata={"name": "next.1", "namespace": "default"}))
        await until(lambda: "next-uid" in source.pod_events)
        assert WAITING not in source.pod_events
        await until(lambda: "next-uid" in source.pods)
        api.delete("pods", pod("next", "next-uid", 2))
        await until(lambda: "next-uid" not in source.pod_events)


async def test_the_events_of_a_pod_never_listed_are_forgotten_after_a_while(
        api: ReplayApi) -> None:
    clock = Clock()
    async with watching(api, clock) as source:
        ghost = {"kind": "Pod", "name": "ghost", "namespace": "default", "uid": "ghost-uid"}
        api.put("events", event(5, involvedObject=ghost,
                                metadata={"name": "ghost.1", "namespace": "default"}))
        await until(lambda: "ghost-uid" in source.pod_events)
        clock.now += EVENT_UNKNOWN_POD_TTL / 2
        api.put("events", event(6, involvedObject=ghost,
                                metadata={"name": "ghost.2", "namespace": "default"}))
        await until(lambda: "Pulled" in source.pod_events["ghost-uid"])
        clock.now += EVENT_UNKNOWN_POD_TTL + EVENT_SWEEP_SECONDS
        api.put("events", event(3, count=28, lastTimestamp="2024-10-24T09:58:48Z"))
        await until(lambda: source.pod_events[WAITING]["NotTriggerScaleUp"].count == 28)
        assert "ghost-uid" not in source.pod_events
        assert WAITING in source.pod_events and PULLING in source.pod_events


async def test_beyond_the_cap_the_events_of_more_pods_are_dropped_and_counted(
        api: ReplayApi, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="exporter.sources.kube")
    async with watching(api, max_event_pods=1) as source:
        await until(lambda: source.synced["events"].is_set())
        assert len(source.pod_events) == 1
        assert source.rejected_objects["events"] >= 2  # the other pod's two events
        dropped = [r for r in caplog.records if r.getMessage() == "pod events dropped"]
        assert len(dropped) == 1 and dropped[0].ctx["max_pods"] == 1  # type: ignore[attr-defined]


async def test_after_a_410_the_events_are_listed_again_and_what_was_kept_stays(
        api: ReplayApi) -> None:
    async with watching(api) as source:
        await until(lambda: source.synced["events"].is_set())
        api.delete("events", event(5))  # expired on the server while the watch was away
        api.compact()
        api.end_watches()
        api.put("events", event(3, count=31, lastTimestamp="2024-10-24T10:01:00Z"))
        await until(lambda: source.stats["events"].expired >= 1)
        await until(lambda: source.pod_events[WAITING]["NotTriggerScaleUp"].count == 31)
        assert "Pulling" in source.pod_events[PULLING]
        assert source.stats["events"].lists >= 2


async def test_a_cluster_that_forbids_events_is_watched_all_the_same(
        caplog: pytest.LogCaptureFixture) -> None:
    """The view is listed and ready; events are down, counted as refused, with the grant
    they lack."""
    caplog.set_level(logging.WARNING, logger="exporter.sources.kube")
    api = ReplayApi()
    api.forbidden.add("events")
    api.put("pods", pod("finetune-job-6k6mj", WAITING, 8))
    async with watching(api) as source:
        assert all(source.synced[k].is_set() for k in VIEW_KINDS)
        await until(lambda: source.stats["events"].reasons.get("http_403", 0) >= 2)
        assert not source.up["events"] and not source.synced["events"].is_set()
        assert "events" in source.denied and "events" not in VIEW_KINDS
        assert "grant get/list/watch on events" in source.denied["events"]
        assert source.pod_events == {} and WAITING in source.pods
        refused = [r.ctx for r in caplog.records  # type: ignore[attr-defined]
                   if r.getMessage() == "kubernetes request failed"]
        assert [f["resource"] for f in refused] == ["events"]
        assert refused[0]["status"] == 403 and "events" in refused[0]["rbac"]
        api.forbidden.clear()
        await until(lambda: source.up["events"])
        assert "events" not in source.denied


async def test_an_api_that_serves_no_events_is_not_an_error(
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="exporter.sources.kube")
    api = ReplayApi(served=("nodes", "pods", "namespaces"))
    async with watching(api) as source:
        await until(lambda: any(r.getMessage() == "kubernetes kind not served"
                                for r in caplog.records))
        assert not source.up["events"] and source.stats["events"].errors == 0
        assert all(source.up[k] for k in VIEW_KINDS)


async def test_the_pods_of_a_job_told_the_same_keep_one_copy_of_it(api: ReplayApi) -> None:
    sibling = {"kind": "Pod", "name": "finetune-job-7p9qz", "namespace": "default",
               "uid": "sibling-uid"}
    api.put("pods", pod("finetune-job-7p9qz", "sibling-uid", 8))
    api.put("events", event(0, involvedObject=sibling, metadata={
        "name": "finetune-job-7p9qz.1", "namespace": "default"}))
    async with watching(api) as source:
        await until(lambda: "sibling-uid" in source.pod_events)
        mine = source.pod_events[WAITING]["FailedScheduling"]
        theirs = source.pod_events["sibling-uid"]["FailedScheduling"]
        assert mine.message == theirs.message and mine.message is theirs.message
        assert theirs.pod == "finetune-job-7p9qz"
