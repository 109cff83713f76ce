"""The real kubelet (v1.36, ../shared/interop) standalone against a test daemon: two static
pods that ping their gateway, one without a pause process (the kubelet's default pod) and
one with (a shared PID namespace), and the kubelet's ``/stats/summary`` and
``/metrics/cadvisor`` about them, in both of the kubelet's stats configurations:

- ``cadvisor`` (the default): CPU, memory and filesystem from CRI, the pod's network and
  process counts from the kubelet's built-in cAdvisor, which names pycrid's cgroups by
  asking containerd's API on the daemon's socket (the kubelet's ``--containerd`` flag);
- ``cri`` (feature gate ``PodAndContainerStatsFromCRI``): everything from pycrid's CRI
  stats and metrics calls.

One kubelet start per configuration; the host is put back as it was after each
(tests/support/kubelet.py). Skipped with the reason when the kubelet is not there.
"""

from __future__ import annotations

import json
import re
import urllib.error
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from cri_api.v1 import api_pb2 as pb

from tests.support import interop, network
from tests.support.daemon import Daemon, containerd_socket, mapped_root_state, running_daemon
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


def manifest(name: str, image: str, gw: str, *, share_pid: bool) -> str:
    """A pod that pings its gateway five times, then sleeps. Sharing the PID namespace
    makes it a pod with a pause container; otherwise it has none (drop_infra_ctr)."""
    return f"""apiVersion: v1
kind: Pod
metadata: {{name: {name}, namespace: default}}
spec:
  terminationGracePeriodSeconds: 1
  shareProcessNamespace: {str(share_pid).lower()}
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


#: The label keys of cAdvisor's series as the kubelet serves them (both configurations).
CPU_KEYS = {"container", "cpu", "id", "image", "name", "namespace", "pod"}
MEMORY_KEYS = CPU_KEYS - {"cpu"}
NET_KEYS = MEMORY_KEYS | {"interface"}


def wait_pod_summary(k: Kubelet, pod: str) -> dict[str, Any]:
    """The pod in /stats/summary once every part is there: the kubelet's caches fill at
    their own pace, so wait for all of them at once."""
    last: list[dict[str, Any] | None] = [None]

    def complete() -> dict[str, Any] | None:
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
        found: dict[str, Any] = wait_for(complete, 120, f"{pod} in /stats/summary")
    except AssertionError:
        raise AssertionError(f"{pod} incomplete in /stats/summary: {last[0]}\n"
                             f"kubelet:\n{k.log()[-3000:]}") from None
    return found


def wait_pod_series(k: Kubelet, pod: str) -> str:
    ours = {"container": "pinger", "pod": pod, "namespace": "default"}

    def complete() -> str | None:
        text = k.metrics_cadvisor()
        if (series(text, "container_cpu_usage_seconds_total", **ours)
                and series(text, "container_memory_working_set_bytes", **ours)
                and any(v >= PING_BYTES for _, v in series(
                    text, "container_network_receive_bytes_total", pod=pod,
                    namespace="default", interface="eth0"))):
            return text
        return None

    found: str = wait_for(complete, 120, f"{pod}'s series in /metrics/cadvisor")
    return found


@pytest.mark.parametrize("stats_from_cri", [False, True], ids=["cadvisor", "cri"])
def test_kubelet_stats_and_cadvisor_metrics_of_pods(
        daemon: Daemon, kubelet_binary: Path, tmp_path: Path, registry: LocalRegistry,
        test_images: TestImages, stats_from_cri: bool) -> None:
    config = "cri" if stats_from_cri else "cadvisor"
    image = test_images.busybox.ref(registry)
    # One pod of each kind: without a pause (the kubelet's default pod, drop_infra_ctr)
    # and with one (a shared PID namespace).
    kinds = {f"{config}-pinned": False, f"{config}-pause": True}
    gates = {"PodAndContainerStatsFromCRI": True} if stats_from_cri else {}
    with running_kubelet(
            str(kubelet_binary), str(tmp_path / "kubelet"), runtime_socket=daemon.address,
            manifests={f"{name}.yaml": manifest(name, image, gateway(daemon), share_pid=share)
                       for name, share in kinds.items()},
            feature_gates=gates, containerd_socket=containerd_socket(daemon.extra["base"]),
            cleanup=remove_pods(daemon)) as k:
        for name, share in kinds.items():
            pod = f"{name}-{NODE}"
            found = wait_pod_summary(k, pod)
            (ctr,) = found["containers"]
            assert ctr["name"] == "pinger"
            assert ctr["rootfs"]["capacityBytes"] > 0 and "usedBytes" in ctr["rootfs"]
            assert found["ephemeral-storage"]["usedBytes"] > 0
            # The pod is of the kind asked for: a pause has a pid, pinned namespaces none.
            (sandbox,) = [s for s in daemon.client.runtime.ListPodSandbox(
                pb.ListPodSandboxRequest(), timeout=30).items if s.metadata.name == pod]
            info = json.loads(daemon.client.runtime.PodSandboxStatus(
                pb.PodSandboxStatusRequest(pod_sandbox_id=sandbox.id, verbose=True),
                timeout=30).info["info"])
            assert (info["pid"] > 0) is share, info

            text = wait_pod_series(k, pod)
            ours = {"container": "pinger", "pod": pod, "namespace": "default"}
            (cpu,) = series(text, "container_cpu_usage_seconds_total", **ours)
            (mem,) = series(text, "container_memory_working_set_bytes", **ours)
            net = series(text, "container_network_receive_bytes_total", pod=pod,
                         interface="eth0")
            assert set(cpu[0]) == CPU_KEYS and set(mem[0]) == MEMORY_KEYS
            assert all(set(labels) == NET_KEYS for labels, _ in net)
            assert cpu[0]["image"] == image and cpu[0]["cpu"] == "total"
            # CRI metric values are whole numbers (UInt64Value): an idle container's CPU
            # seconds read 0 there, a fraction of a second from cAdvisor.
            assert cpu[1] >= 0 if stats_from_cri else cpu[1] > 0
            assert mem[1] > 0
            print(_excerpt(found, text, pod))


USERNS_POD = """apiVersion: v1
kind: Pod
metadata: {{name: {name}, namespace: default}}
spec:
  terminationGracePeriodSeconds: 1
  hostUsers: false
  volumes:
  - name: scratch
    emptyDir: {{}}
  containers:
  - name: writer
    image: {image}
    imagePullPolicy: IfNotPresent
    volumeMounts:
    - {{name: scratch, mountPath: /scratch}}
    command: ["sh", "-c", "id -u > /scratch/written; id -u > /in-rootfs; exec sleep 3600"]
"""


def test_kubelet_runs_a_user_namespace_pod(kubelet_binary: Path, tmp_path: Path,
                                           registry: LocalRegistry,
                                           test_images: TestImages) -> None:
    """A static pod with ``hostUsers: false`` under the real kubelet, with a runc that
    makes idmapped mounts: its uid_map is not the identity; what its root writes to its
    rootfs belongs on the node to the first uid of the pod's range; the kubelet sends
    the pod's mappings with the emptyDir mount (KEP-127's idmapped volumes), so what its
    root writes there belongs to the node's root, as it would without a user namespace."""
    runc = interop.idmap_runc()
    base = tmp_path / "node"
    config = (daemon_config(registry, test_images, base)
              + f'[plugins."pycrid.cri.v1.runtime"]\nruntime_path = "{runc}"\n')
    name = "userns"
    pod = f"{name}-{NODE}"
    image = test_images.busybox.ref(registry)
    with mapped_root_state() as state, running_daemon(str(base), config,
                                                      state_dir=state) as d, \
            running_kubelet(str(kubelet_binary), str(tmp_path / "kubelet"),
                            runtime_socket=d.address,
                            manifests={f"{name}.yaml": USERNS_POD.format(name=name, image=image)},
                            cleanup=remove_pods(d)) as k:
        def running() -> Any:
            ctrs = [c for c in d.client.runtime.ListContainers(
                pb.ListContainersRequest(), timeout=30).containers
                if c.metadata.name == "writer" and c.state == pb.CONTAINER_RUNNING]
            return ctrs[0] if ctrs else None

        try:
            ctr = wait_for(running, 120, f"{pod}'s container to run")
        except AssertionError:
            raise AssertionError(f"kubelet:\n{k.log()[-6000:]}\ndaemon:\n"
                                 f"{d.log()[-3000:]}") from None
        (sandbox,) = [s for s in d.client.runtime.ListPodSandbox(
            pb.ListPodSandboxRequest(), timeout=30).items if s.metadata.name == pod]
        status = d.client.runtime.PodSandboxStatus(
            pb.PodSandboxStatusRequest(pod_sandbox_id=sandbox.id), timeout=30).status
        userns = status.linux.namespaces.options.userns_options
        assert userns.mode == pb.POD, status
        (uids,) = userns.uids
        assert uids.host_id != 0 and uids.container_id == 0
        out = Pods(d.client).exec(ctr.id, ["cat", "/proc/self/uid_map"])
        assert out.stdout.decode().split() == ["0", str(uids.host_id), str(uids.length)], out
        # The writable layer: the pod's root is the first uid of its range on the node.
        spec = json.loads(d.client.runtime.ContainerStatus(
            pb.ContainerStatusRequest(container_id=ctr.id, verbose=True),
            timeout=30).info["info"])["runtimeSpec"]
        rootfs = Path(state, "containers", ctr.id, spec["root"]["path"])
        written = wait_for(lambda: next(Path(tmp_path / "kubelet" / "root" / "pods").glob(
            "*/volumes/kubernetes.io~empty-dir/scratch/written"), None), 30,
            "the file in the emptyDir")
        in_rootfs = rootfs / "in-rootfs"
        assert in_rootfs.read_text().strip() == written.read_text().strip() == "0"
        assert in_rootfs.stat().st_uid == uids.host_id
        # The emptyDir: idmapped with the pod's own mappings, as the kubelet asked.
        (scratch,) = [m for m in spec["mounts"] if m["destination"] == "/scratch"]
        assert scratch["uidMappings"] == [{"containerID": 0, "hostID": uids.host_id,
                                           "size": uids.length}], scratch
        assert written.stat().st_uid == 0
        # So is every file the kubelet binds in: its hosts file, the termination log.
        for dest in ("/etc/hosts", "/dev/termination-log"):
            (m,) = [m for m in spec["mounts"] if m["destination"] == dest]
            assert m.get("uidMappings") == scratch["uidMappings"], m
        print(f"{pod}: uid_map 0 {uids.host_id} {uids.length}; rootfs file owned by "
              f"{in_rootfs.stat().st_uid}, emptyDir file by {written.stat().st_uid}")
