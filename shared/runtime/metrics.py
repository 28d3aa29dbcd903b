"""Gauges that describe state, recomputed from a service's own view on every pass.

A labelled `Gauge` keeps every label set it was ever given: a job that ended, a pool that
was removed, would report its last value forever. A `Snapshot` instead holds the families
of the last pass and nothing else, so what Prometheus scrapes is exactly the current view.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field

from prometheus_client import REGISTRY, CollectorRegistry
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector


@dataclass(frozen=True)
class GaugeSpec:
    """One gauge family: its name, help and label names."""

    name: str
    documentation: str
    labels: Sequence[str] = ()

    def family(self, samples: Iterable[tuple[Sequence[str], float]] = ()) -> GaugeMetricFamily:
        family = GaugeMetricFamily(self.name, self.documentation, labels=list(self.labels))
        for label_values, value in samples:
            family.add_metric(list(label_values), value)
        return family


@dataclass(eq=False)  # a registry keys collectors by identity
class Snapshot(Collector):
    """The families of the latest pass; every declared family is exported, empty until set."""

    specs: Sequence[GaugeSpec]
    _families: Mapping[str, Metric] = field(default_factory=dict)

    def replace(self, samples: Mapping[GaugeSpec, Iterable[tuple[Sequence[str], float]]]) -> None:
        """Swap in a whole pass at once: a scrape sees either the old view or the new one."""
        self._families = {spec.name: spec.family(samples.get(spec, ())) for spec in self.specs}

    def collect(self) -> Iterator[Metric]:
        families = self._families
        for spec in self.specs:
            yield families.get(spec.name) or spec.family()

    def describe(self) -> Iterator[Metric]:
        # Names only, so the registry can refuse a clash without collecting a pass.
        for spec in self.specs:
            yield spec.family()


def register_snapshot(
    specs: Sequence[GaugeSpec], registry: CollectorRegistry = REGISTRY
) -> Snapshot:
    snapshot = Snapshot(specs)
    registry.register(snapshot)
    return snapshot
