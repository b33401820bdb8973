"""Each GPU's energy counter from one cycle to the next: the interval's energy of every GPU
(``energy.gpu_energy``, which carries each counter in a ``CounterState``), where it came
from counted, and a node whose GPUs' energy stops being their counters' logged once per
episode."""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Mapping, MutableMapping, Sequence

from exporter.logs import ctx
from exporter.model.compute import DeviceState
from exporter.model.energy import CounterState, Energy, EnergyBasis, gpu_energy

log = logging.getLogger(__name__)

ESTIMATED: dict[EnergyBasis, str] = {
    "reset": "GPU energy counter went backwards or jumped: the interval's energy is the "
             "power integral",
    "power": "no energy counter for the GPU, or it stopped counting: its energy is the "
             "power integral"}
"""What is logged when a GPU's energy stops being its counter's."""


class EnergyCounters:
    """The GPUs' energy counters as the last interval left them, and the GPUs whose energy
    that interval was not their counters'."""

    def __init__(self) -> None:
        self.counters: dict[str, CounterState] = {}
        """GPU UUID -> its counter, for each GPU read at the last cycle."""
        self._estimated: dict[str, EnergyBasis] = {}
        """GPUs whose energy the last interval was not their counter's, and why."""

    def interval(self, before: Sequence[DeviceState], after: Sequence[DeviceState],
                 start: float, seconds: float,
                 bases: MutableMapping[str, int]) -> dict[str, Energy]:
        """Each physical GPU's energy over the interval of ``seconds`` from ``start``
        between the states ``before`` and ``after`` it, by UUID; each one's basis is
        counted in ``bases``."""
        step = gpu_energy(before, after, start, seconds, self.counters)
        self.counters = step.counters
        self._bases(step.by_gpu, before, after, bases)
        return step.by_gpu

    def _bases(self, energy: Mapping[str, Energy], states: Sequence[DeviceState],
               after: Sequence[DeviceState], bases: MutableMapping[str, int]) -> None:
        """Count where each GPU's energy came from; a node whose GPUs' energy stops being
        their counters' is logged once per episode (a counter that restarts, a page without
        one), with how many of its GPUs. A GPU not read at the interval's end (its node
        gone, its exporter down) is an estimate too, and no news."""
        nodes = {d.gpu_uuid: d.node for d in states}
        read = {d.gpu_uuid for d in after if d.fields}
        before, self._estimated = self._estimated, {}
        started: dict[tuple[str, EnergyBasis], list[str]] = defaultdict(list)
        for uuid, e in energy.items():
            bases[e.basis] += 1
            if e.basis == "counter" or uuid not in read:
                continue
            self._estimated[uuid] = e.basis
            if before.get(uuid) != e.basis:
                started[nodes.get(uuid, ""), e.basis].append(uuid)
        for (node, basis), gpus in sorted(started.items()):
            log.info(ESTIMATED[basis], extra=ctx(node=node, gpus=len(gpus),
                                                 gpu=", ".join(gpus[:3])))
