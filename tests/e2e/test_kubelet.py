"""The real kubelet (v1.36, ../shared/interop) standalone against a test daemon: a static
pod that pings its gateway, and the kubelet's ``/stats/summary`` and ``/metrics/cadvisor``
about it, in both of the kubelet's stats configurations:

- ``cadvisor`` (the default): CPU, memory and filesystem from CRI, the pod's network and
  process counts from the kubelet's built-in cAdvisor, which names pycrid's cgroups by
  asking containerd's API on the daemon's socket (the kubelet's ``--containerd`` flag);
- ``cri`` (feature gate ``PodAndContainerStatsFromCRI``): everything from pycrid's CRI
  stats and metrics calls.

One kubelet start per configuration; the host is put back as it was after each
(tests/support/kubelet.py). Skipped with the reason when the kubelet is not there.
"""

from __future__ import annotations

import re
import urllib.error
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from cri_api.v1 import api_pb2 as pb

from tests.support import interop, network
from tests.support.daemon import Daemon, containerd_socket, running_daemon
from tests.support.images import TestImages
from tests.support.kubelet import Kubelet, running_kubelet
from tests.support.pods import Pods, daemon_config, wait_for
from tests.support.registry import LocalRegistry

pytestmark = pytest.mark.e2e

NODE = "pycrid-test-node"
#: Five echo requests and replies on the wire: 84-byte IP packets in 14-byte frames.
PING_BYTES = 5 * 98


@pytest.fixture(scope="module")
def kubelet_binary() -> Path:
    return interop.require("kubelet")


@pytest.fixture(scope="module")
def daemon(kubelet_binary: Path, tmp_path_factory: pytest.TempPathFactory,
           registry: LocalRegistry, test_images: TestImages) -> Iterator[Daemon]:
    base = tmp_path_factory.mktemp("kubelet-node")
    # Samples every 2 s, so the CRI stats path sees the ping within a kubelet scrape or two.
    config = (daemon_config(registry, test_images, base)
              + '[plugins."pycrid.cri.v1.runtime"]\nstats_collect_period = "2s"\n')
    with running_daemon(str(base), config) as d:
        d.extra["base"] = str(base)
        yield d


def gateway(d: Daemon) -> str:
    return network.subnet_of(d.extra["base"]).rsplit(".", 1)[0] + ".1"


def manifest(name: str, image: str, gw: str) -> str:
    return f"""apiVersion: v1
kind: Pod
metadata: {{name: {name}, namespace: default}}
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - name: pinger
    image: {image}
    imagePullPolicy: IfNotPresent
    command: ["sh", "-c", "ping -c 5 {gw} && echo pinged; exec sleep 3600"]
"""


def remove_pods(d: Daemon) -> Callable[[], None]:
    """What the kubelet leaves in the runtime when it stops: removed over CRI."""
    def run() -> None:
        pods = Pods(d.client)
        for s in d.client.runtime.ListPodSandbox(pb.ListPodSandboxRequest(), timeout=30).items:
            pods.stop_pod(s.id)
            pods.remove_pod(s.id)
    return run


def pod_summary(k: Kubelet, pod: str) -> dict[str, Any] | None:
    try:
        summary = k.summary()
    except urllib.error.HTTPError:  # 500 while its stats providers start up
        return None
    for p in summary.get("pods", []):
        if p["podRef"]["name"] == pod and p["podRef"]["namespace"] == "default":
            found: dict[str, Any] = p
            return found
    return None


_SERIES = re.compile(r'^(?P<name>[a-z_]+)\{(?P<labels>[^}]*)\} (?P<value>\S+)', re.M)
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def series(text: str, name: str, **want: str) -> list[tuple[dict[str, str], float]]:
    """Samples of metric ``name`` whose labels include ``want``."""
    out = []
    for m in _SERIES.finditer(text):
        if m.group("name") != name:
            continue
        labels = dict(_LABEL.findall(m.group("labels")))
        if all(labels.get(k) == v for k, v in want.items()):
            out.append((labels, float(m.group("value"))))
    return out


def _excerpt(pod: dict[str, Any], metrics: str, name: str) -> str:
    keep = ("podRef", "network", "process_stats", "cpu", "memory", "swap",
            "ephemeral-storage")
    lines = [f"--- /stats/summary, pod {name}:",
             repr({k: pod.get(k) for k in keep}),
             repr([{k: c.get(k) for k in ("name", "cpu", "memory", "rootfs", "logs", "swap")}
                   for c in pod.get("containers", [])])]
    lines.append(f"--- /metrics/cadvisor, pod {name}:")
    lines += [line for line in metrics.splitlines() if f'pod="{name}"' in line]
    return "\n".join(lines)


@pytest.mark.parametrize("stats_from_cri", [False, True], ids=["cadvisor", "cri"])
def test_kubelet_stats_and_cadvisor_metrics_of_a_pod(
        daemon: Daemon, kubelet_binary: Path, tmp_path: Path, registry: LocalRegistry,
        test_images: TestImages, stats_from_cri: bool) -> None:
    name = "traffic-cri" if stats_from_cri else "traffic-cadvisor"
    pod = f"{name}-{NODE}"
    gates = {"PodAndContainerStatsFromCRI": True} if stats_from_cri else {}
    with running_kubelet(
            str(kubelet_binary), str(tmp_path / "kubelet"), runtime_socket=daemon.address,
            manifests={f"{name}.yaml": manifest(name, test_images.busybox.ref(registry),
                                                gateway(daemon))},
            feature_gates=gates, containerd_socket=containerd_socket(daemon.extra["base"]),
            cleanup=remove_pods(daemon)) as k:

        last: list[dict[str, Any] | None] = [None]

        def traffic_seen() -> dict[str, Any] | None:
            # The kubelet's caches fill at their own pace: wait for every part at once.
            p = last[0] = pod_summary(k, pod)
            if not p or len(p.get("containers") or []) != 1:
                return None
            ctr = p["containers"][0]
            eth0 = [i for i in (p.get("network") or {}).get("interfaces") or []
                    if i["name"] == "eth0"]
            ready = (eth0 and eth0[0].get("rxBytes", 0) >= PING_BYTES
                     and eth0[0].get("txBytes", 0) >= PING_BYTES
                     and (p.get("process_stats") or {}).get("process_count", 0) >= 1
                     and (p.get("cpu") or {}).get("usageCoreNanoSeconds", 0) > 0
                     and (p.get("memory") or {}).get("workingSetBytes", 0) > 0
                     and (ctr.get("cpu") or {}).get("usageCoreNanoSeconds", 0) > 0
                     and (ctr.get("memory") or {}).get("workingSetBytes", 0) > 0
                     and (ctr.get("logs") or {}).get("usedBytes", 0) > 0)
            return p if ready else None

        try:
            found = wait_for(traffic_seen, 120, f"{pod} in /stats/summary")
        except AssertionError:
            raise AssertionError(f"{pod} incomplete in /stats/summary: {last[0]}\n"
                                 f"kubelet:\n{k.log()[-3000:]}") from None
        (ctr,) = found["containers"]
        assert ctr["name"] == "pinger"
        assert ctr["rootfs"]["capacityBytes"] > 0 and "usedBytes" in ctr["rootfs"]
        assert found["ephemeral-storage"]["usedBytes"] > 0

        ours = {"container": "pinger", "pod": pod, "namespace": "default"}

        def metrics_seen() -> str | None:
            text = k.metrics_cadvisor()
            if (series(text, "container_cpu_usage_seconds_total", **ours)
                    and series(text, "container_memory_working_set_bytes", **ours)
                    and any(v >= PING_BYTES for _, v in series(
                        text, "container_network_receive_bytes_total", pod=pod,
                        namespace="default", interface="eth0"))):
                return text
            return None

        text = wait_for(metrics_seen, 120, f"{pod}'s series in /metrics/cadvisor")
        (cpu,) = series(text, "container_cpu_usage_seconds_total", **ours)
        # CRI metric values are whole numbers (UInt64Value): an idle container's CPU
        # seconds read 0 there, a fraction of a second from cAdvisor.
        assert cpu[1] >= 0 if stats_from_cri else cpu[1] > 0
        (mem,) = series(text, "container_memory_working_set_bytes", **ours)
        assert mem[1] > 0
        assert cpu[0]["image"] == test_images.busybox.ref(registry)
        print(_excerpt(found, text, pod))
