"""What the daemon says about itself (``pycrid status``, the verbose CRI ``Status``): plain
data from the core. How it is shown (JSON strings in the CRI info map) is the edge's
business, in cri/status_json.py."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from pycrid.config.schema import Config
from pycrid.host.facts import HostSecurity


@dataclass(frozen=True)
class DaemonInfo:
    """Who and where: release and commit, pid, start time, uptime, config file,
    directories, sockets."""

    #: The release (pycrid/__init__.py) and the commit it was built from ("" unknown).
    version: str
    commit: str
    pid: int
    #: UTC, ISO 8601 to the second.
    started_at: str
    uptime_seconds: float
    #: Empty: the embedded defaults.
    config_file: str
    root: str
    state: str
    #: By name: cri, nri ("" when it serves none), metrics, and those of other plugins.
    sockets: Mapping[str, str]


@dataclass(frozen=True)
class ImageInfo:
    count: int
    bytes: int
    sandbox_image: str
    #: The signature policy in force: its file and state, the namespaces with their own,
    #: registries.d (empty: no policy part).
    signature_policy: Mapping[str, object] = field(default_factory=dict)


@dataclass(frozen=True)
class NRIInfo:
    enabled: bool
    #: "" when NRI is off or takes no external plugins.
    socket: str
    #: Each connected plugin's own description (name, index, events, call counts).
    plugins: tuple[Mapping[str, object], ...]


@dataclass(frozen=True)
class CheckpointInfo:
    """Whether CheckpointContainer (and restore) works here, and why not."""

    #: The CRIU checked at start, its version, and why it does not work ("": it does).
    criu: str
    criu_version: str
    criu_error: str
    #: By runtime handler: "" when its containers can be checkpointed, else why not.
    handlers: Mapping[str, str]


@dataclass(frozen=True)
class HandlerInfo:
    """One runtime handler (RuntimeClass) and what it can do."""

    name: str
    runtime_type: str
    #: Its runc (or runsc) and state root.
    binary: str
    root: str
    default: bool
    #: Pods run in an application kernel (gVisor): one sandbox per pod.
    sandboxed: bool
    #: "pause" (always a pause container) or "drop_infra_ctr" (only when needed).
    pod_sandbox: str
    recursive_read_only_mounts: bool
    user_namespaces: bool
    #: UpdateContainerResources can change a running container's limits.
    update_resources: bool
    #: runsc's version and flags (%ID% is the pod's id), and the runsc.toml read.
    version: str = ""
    flags: tuple[str, ...] = ()
    config_path: str = ""


@dataclass(frozen=True)
class StatusInfo:
    #: The effective config.
    config: Config
    #: The CNI networks in use, in containerd's ``cniconfig`` shape.
    cni: Mapping[str, object]
    #: Start-up warnings.
    warnings: tuple[str, ...]
    #: What security-context fields can be honoured here.
    host_security: HostSecurity
    #: Visible pods and containers by CRI state name, every state (0 included).
    pods: Mapping[str, int]
    containers: Mapping[str, int]
    nri: NRIInfo
    daemon: DaemonInfo
    images: ImageInfo
    checkpoint: CheckpointInfo
    handlers: tuple[HandlerInfo, ...] = ()
