"""Prometheus metrics of one daemon: the metric objects, the recording calls, the scrape-time
collector of pod, container and NRI plugin counts.

Every daemon (and every core a test builds) owns its own ``CollectorRegistry``: the global
one would mix up the cores of one test process. Recording is always on (a dict lookup and an
observe per event); the HTTP endpoint (``metrics/endpoint.py``) is what ``[metrics] address``
turns on, as in containerd.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from pycrid import release

if TYPE_CHECKING:
    from pycrid.core.cri_service import CRIService

#: CRI calls take from under a millisecond (List*, Version) to minutes (a pull, a stop).
CRI_BUCKETS = (.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60,
               120, 300)
NRI_BUCKETS = (.0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2, 5)
PULL_BUCKETS = (.1, .25, .5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800)


class CoreCollector(Collector):
    """Counts read from the core's memory at scrape time: no disk, no runc."""

    def __init__(self) -> None:
        self.core: CRIService | None = None

    def describe(self) -> Iterable[Metric]:
        return []

    def collect(self) -> Iterable[Metric]:
        core = self.core
        if core is None:
            return []
        pods = GaugeMetricFamily("pycrid_pods", "Pod sandboxes by CRI state.",
                                 labels=["state"])
        for state, n in core.pod_counts().items():
            pods.add_metric([state], n)
        ctrs = GaugeMetricFamily("pycrid_containers", "Containers by CRI state.",
                                 labels=["state"])
        for state, n in core.container_counts().items():
            ctrs.add_metric([state], n)
        adaptation = core.nri.adaptation
        connected = 0 if adaptation is None else sum(
            1 for p in adaptation.plugins if not p.closed)
        out: list[Metric] = [pods, ctrs, GaugeMetricFamily(
            "pycrid_nri_plugins_connected", "NRI plugins registered and synchronised.",
            value=connected)]
        last = GaugeMetricFamily(
            "pycrid_image_last_pull_bytes", "What the last pull of each image present cost, "
            "in bytes: fetched from registries, reused from the node, skipped (partial "
            "pulls).", labels=["image", "kind"])
        for image, report in core.images.pull_reports.items():
            for kind in ("fetched", "reused", "skipped"):
                last.add_metric([image, kind], getattr(report, kind))
        out.append(last)
        if core.recovery_seconds is not None:
            out.append(GaugeMetricFamily(
                "pycrid_recovery_duration_seconds",
                "How long start-up recovery of pods and containers took.",
                value=core.recovery_seconds))
        return out


class Metrics:
    """The daemon's metric objects and the calls the instrumented code makes."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        r = self.registry
        self.cri_requests = Counter("pycrid_cri_requests", "CRI calls by method and gRPC code.",
                                    ["method", "code"], registry=r)
        self.cri_duration = Histogram(
            "pycrid_cri_request_duration_seconds", "CRI call latency by method and gRPC code.",
            ["method", "code"], buckets=CRI_BUCKETS, registry=r)
        self.nri_duration = Histogram(
            "pycrid_nri_plugin_request_duration_seconds",
            "NRI plugin call latency by plugin (NN-name) and event.",
            ["plugin", "event"], buckets=NRI_BUCKETS, registry=r)
        self.nri_registrations = Counter(
            "pycrid_nri_plugin_registrations", "NRI plugins registered and synchronised.",
            ["plugin"], registry=r)
        self.nri_drops = Counter(
            "pycrid_nri_plugin_drops",
            "NRI plugins closed, by why: closed (hung up), timeout, protocol, registration,"
            " sync, error, shutdown.", ["plugin", "reason"], registry=r)
        self.image_pulls = Counter("pycrid_image_pulls", "Image pulls by result.", ["result"],
                                   registry=r)
        self.image_pull_bytes = Counter("pycrid_image_pull_bytes",
                                        "Bytes downloaded from registries by pulls.", registry=r)
        self.image_pull_reused_bytes = Counter(
            "pycrid_image_pull_reused_bytes",
            "File bytes partial pulls took from layers already on the node.", registry=r)
        self.image_pull_skipped_bytes = Counter(
            "pycrid_image_pull_skipped_bytes",
            "Bytes of partially pulled layer blobs that were not downloaded.", registry=r)
        self.image_pull_duration = Histogram(
            "pycrid_image_pull_duration_seconds", "Image pull latency (successful and not).",
            buckets=PULL_BUCKETS, registry=r)
        Gauge("pycrid_build_info", "pycrid build information: the release and the commit "
              "it was built from.", ["version", "commit"],
              registry=r).labels(release.VERSION, release.commit()).set(1)
        self.core_collector = CoreCollector()
        r.register(self.core_collector)
        #: Label children by key: ``labels()`` takes a lock and builds a tuple per call.
        self._cri: dict[tuple[str, str], tuple[Any, Any]] = {}
        self._nri: dict[tuple[str, str], Any] = {}

    def bind(self, core: CRIService) -> None:
        """Report this core's pods, containers, NRI plugins and recovery time."""
        self.core_collector.core = core

    # ---- recording ----------------------------------------------------------------------

    def cri_call(self, method: str, code: str, seconds: float) -> None:
        children = self._cri.get((method, code))
        if children is None:
            children = self._cri[(method, code)] = (
                self.cri_requests.labels(method, code), self.cri_duration.labels(method, code))
        children[0].inc()
        children[1].observe(seconds)

    def nri_call(self, plugin: str, event: str, seconds: float, failed: bool) -> None:
        child = self._nri.get((plugin, event))
        if child is None:
            child = self._nri[(plugin, event)] = self.nri_duration.labels(plugin, event)
        child.observe(seconds)

    def nri_registered(self, plugin: str) -> None:
        self.nri_registrations.labels(plugin).inc()

    def nri_dropped(self, plugin: str, reason: str) -> None:
        self.nri_drops.labels(plugin, reason).inc()

    def pull_done(self, ok: bool, seconds: float) -> None:
        self.image_pulls.labels("success" if ok else "failure").inc()
        self.image_pull_duration.observe(seconds)

    def pull_bytes(self, n: int) -> None:
        self.image_pull_bytes.inc(n)

    def pull_saved(self, reused: int, skipped: int) -> None:
        self.image_pull_reused_bytes.inc(reused)
        self.image_pull_skipped_bytes.inc(skipped)

    def exposition(self) -> bytes:
        """The Prometheus text format of everything."""
        from prometheus_client import generate_latest

        return generate_latest(self.registry)


def samples(text: str) -> Iterator[tuple[str, dict[str, str], float]]:
    """(name, labels, value) of every sample of a scrape (for tests and the CLI)."""
    from prometheus_client.parser import text_string_to_metric_families

    for family in text_string_to_metric_families(text):
        for s in family.samples:
            yield s.name, dict(s.labels), s.value
