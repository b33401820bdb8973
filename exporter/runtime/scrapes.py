"""The reading source's targets: each one's last answer, errors and rejected samples
(``health.SourceHealth``), the nodes its last answer covered, whether its page stands
still while its GPUs are busy, each failure logged once per episode."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from exporter.errors import SourceError
from exporter.logs import Episodes
from exporter.metrics.health import PageRuns, SourceHealth, SourceTarget
from exporter.model import compute
from exporter.model.records import DeviceReading, ParseResult, PodInfo, TargetScrape
from exporter.model.snapshot import Placed
from exporter.sources import ReadingSource


class Scrapes:
    """The health of every target of ``source`` since start."""

    def __init__(self, source: ReadingSource, stuck_after_seconds: float,
                 episodes: Episodes) -> None:
        self.source = source
        self.stuck_after_seconds = stuck_after_seconds
        self.health = SourceHealth()
        self.covered: dict[str, set[str]] = {}
        """The nodes each target's last answer covered: unknown while it fails."""
        self._page_runs = PageRuns()
        self._episodes = episodes
        """Failing targets, (url, "scrape" or "rejected:<reason>"): logged per episode."""

    def targets(self, pods: Iterable[PodInfo]) -> dict[str, str | None]:
        """Target URL -> the node it belongs to (None while unknown)."""
        return self.source.targets(pods)

    def answered(self, url: str, res: TargetScrape | Exception, placed: Placed,
                 now: float) -> None:
        """The health of one target after its answer: up or its error, the samples it
        lost, logged once per episode."""
        health = self.health
        key = SourceTarget("dcgm", url)
        if isinstance(res, TargetScrape):
            health.up[key] = True
            health.last_success[key] = now
            health.duration[key] = res.duration_seconds
            self._episodes.recovered((url, "scrape"), now, "dcgm scrape recovered", target=url)
            self._page_read(url, res.result, now)
            rejects = dict(res.result.rejected)
            lost, stray = placed.unplaced.get(url, (0, None))
            if lost:
                rejects["unknown_node"] = rejects.get("unknown_node", 0) + lost
            for reason, n in rejects.items():
                health.rejected[reason] += n
            if not self.source.whole_cluster:
                self.covered[url] = placed.covered[url]
            self._log_rejects(url, rejects, stray, now)
            return
        assert isinstance(res, SourceError)
        health.up[key] = False
        health.errors[key] += 1
        health.error_reasons[key][res.label] += 1
        for reason, n in res.rejected.items():  # an answer with no sample we keep
            health.rejected[reason] += n
        self._episodes.failed((url, "scrape"), now, "dcgm scrape failed", target=url,
                              reason=res.label, error=res.reason,
                              **({"rejected": res.rejected} if res.rejected else {}))

    def forget_gone(self, targets: Mapping[str, str | None]) -> None:
        """The targets that went with their node: their series go too."""
        health = self.health
        for gone in [k for k in health.up if k[0] == "dcgm" and k[1] not in targets]:
            for table in (health.up, health.duration, health.errors, health.last_success):
                table.pop(gone, None)
            health.error_reasons.pop(gone, None)
            self.covered.pop(gone[1], None)
            self._episodes.forget(gone[1])
            self._page_runs.forget(gone[1])
            health.stuck.pop(gone[1], None)

    def stuck(self, answers: Mapping[str, TargetScrape | Exception],
              states: Sequence[compute.DeviceState], now: float) -> None:
        """Each answering target's page compared with its last: the same for
        ``dcgm.stuck_after`` while GPUs of its nodes are allocated, it is flagged stuck,
        logged once per episode."""
        allocated = {d.node for d in states if d.state == "allocated"}
        for url, res in answers.items():
            if not isinstance(res, TargetScrape) or res.page_crc is None:
                continue
            run = self._page_runs.see(url, (res.page_crc, res.bytes_read), now)
            unchanged = self._page_runs.unchanged_seconds(url, now)
            busy = sorted(self.covered.get(url, set()) & allocated)
            stuck = self.health.stuck[url] = PageRuns.stuck(
                run, unchanged, self.stuck_after_seconds, len(busy))
            if stuck:
                self._episodes.failed((url, "stuck"), now, "dcgm page unchanged while its "
                                      "gpus are allocated", target=url, scrapes=run,
                                      unchanged_seconds=round(unchanged, 3), nodes=busy)
            else:
                self._episodes.recovered((url, "stuck"), now, "dcgm page changing again",
                                         target=url)

    def _page_read(self, url: str, result: ParseResult, now: float) -> None:
        """How a page was read, counted; a plan that failed logged once, until a page of
        the target is read by a plan again."""
        how = result.read_by
        if how is None:
            return
        self.health.pages[how] += 1
        if how == "plan_failed":
            self._episodes.failed((url, "page_plan"), now, "dcgm page read in full: its plan "
                                  "failed", target=url, error=result.plan_error)
        elif how != "full":
            self._episodes.recovered((url, "page_plan"), now, "dcgm page read by plan again",
                                     target=url)

    def _log_rejects(self, url: str, rejects: Mapping[str, int], stray: DeviceReading | None,
                     now: float) -> None:
        """One line when a target's answers begin to have samples dropped for a reason (a
        GPU on no known node: with its labels), one when an answer has none again."""
        for reason, n in rejects.items():
            if reason == "unknown_node" and stray is not None:
                self._episodes.failed(
                    (url, "rejected:unknown_node"), now, "gpu on no known node", target=url,
                    count=n, gpu=stray.uuid, hostname=stray.hostname,
                    pods=[f"{p.namespace}/{p.pod}" for p in stray.pods])
            else:
                self._episodes.failed((url, f"rejected:{reason}"), now,
                                      "dcgm samples rejected", target=url, reason=reason,
                                      count=n)
        for kind in self._episodes.failing(url):
            reason = kind.removeprefix("rejected:")
            if kind != reason and reason not in rejects:
                self._episodes.recovered((url, kind), now, "dcgm samples accepted again",
                                         target=url, reason=reason)
