"""What each node's dcgm-exporter answers: its page as the cluster is now, rendered once per
change, or, with the scenario's ``dcgm_collect_interval``, the page as it last collected
(a real one updates its page only when it collects: every 30 s by default, its ``-c``)."""

from __future__ import annotations

from collections.abc import Container

from simulator.cluster import Cluster, Node
from simulator.exposition import render_node


class DcgmPages:
    """The pages of a cluster's dcgm-exporters."""

    def __init__(self, cluster: Cluster, collect_interval: float | None) -> None:
        self.cluster = cluster
        self.collect_interval = collect_interval
        """Seconds between collections, a whole multiple of the step; None: every change."""
        self._version = 0
        self._rendered: dict[str, tuple[int, bytes]] = {}
        self._collected: dict[str, bytes] = {}

    def changed(self) -> None:
        """The cluster changed: a page rendered before is out of date."""
        self._version += 1

    def stepped(self) -> None:
        """The cluster took a step: at a multiple of the collection interval from its start,
        every running dcgm-exporter collects; one not running (its node NotReady, its
        endpoint refusing) forgets its page, and collects at once when it starts again."""
        every, c = self.collect_interval, self.cluster
        if every is None:
            return
        collects = round((c.now - c.start) / c.step) % round(every / c.step) == 0
        for node in c.live_nodes():
            if not node.ready or node.endpoint_mode == "refuse":
                self._collected.pop(node.name, None)
            elif collects:
                self._collected[node.name] = render_node(c, node).encode()

    def keep(self, running: Container[str]) -> None:
        """Forget the pages of the nodes whose dcgm-exporter is not ``running``: one that
        starts again collects at once."""
        for pages in (self._rendered, self._collected):
            for name in [n for n in pages if n not in running]:
                del pages[name]

    def page(self, node: Node) -> bytes:
        """The page ``node``'s dcgm-exporter answers now."""
        if self.collect_interval is not None:
            page = self._collected.get(node.name)
            if page is None:  # it has just started: it collects at once
                page = self._collected[node.name] = render_node(self.cluster, node).encode()
            return page
        rendered = self._rendered.get(node.name)
        if rendered is None or rendered[0] != self._version:
            rendered = self._rendered[node.name] = (
                self._version, render_node(self.cluster, node).encode())
        return rendered[1]
