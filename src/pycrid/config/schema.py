"""Every config key pycrid knows, with its default and the comment ``config default`` prints.

Key names follow containerd's where the concept is the same (``root``,
``state``, ``[grpc] address``, ``disable_tcp_service``, ``sandbox_image``,
``snapshotter``, ``max_concurrent_downloads``, ``[registry] config_path``),
so an operator's containerd knowledge carries over.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from pycrid.config.decode import Duration, abs_or_empty, at_least, cfg, one_of

#: The config layout this pycrid writes and reads natively.
CURRENT_VERSION = 2
DEFAULT_CONFIG_PATH = "/etc/pycrid/config.toml"


def _abs_path(v: Any) -> str | None:
    return None if os.path.isabs(v) else "must be an absolute path"


def _grpc_address(v: Any) -> str | None:
    path = v[len("unix://"):] if v.startswith("unix://") else v
    return None if os.path.isabs(path) else "must be an absolute unix socket path"


@dataclass
class GrpcConfig:
    address: str = cfg("/run/pycrid/pycrid.sock", "The CRI socket (unix).", _grpc_address)
    tcp_address: str = cfg(
        "", "TCP address (host:port) of the optional CRI TCP listener; used only when the CRI\n"
        "plugin's disable_tcp_service is false.")
    tcp_tls_cert: str = cfg("", "TLS certificate for the TCP listener (empty: plain TCP).",
                            abs_or_empty)
    tcp_tls_key: str = cfg("", "TLS key for the TCP listener.", abs_or_empty)
    tcp_tls_ca: str = cfg("", "CA that client certificates must chain to (empty: no client auth).",
                          abs_or_empty)
    uid: int = cfg(0, "Owner uid of the CRI socket.", at_least(0))
    gid: int = cfg(0, "Owner gid of the CRI socket.", at_least(0))
    max_recv_message_size: int = cfg(16 * 1024 * 1024, "Largest gRPC request, in bytes.",
                                     at_least(4096))
    max_send_message_size: int = cfg(16 * 1024 * 1024, "Largest gRPC response, in bytes.",
                                     at_least(4096))


@dataclass
class DebugConfig:
    level: str = cfg("info", "Log level.", one_of("debug", "info", "warning", "error"))
    format: str = cfg("text", "Log format on stderr: text, json, or journald (priority prefix,\n"
                      "no timestamp); text turns into journald when stderr is the journal.",
                      one_of("text", "json", "journald"))


def _host_port_or_empty(v: Any) -> str | None:
    host, sep, port = v.rpartition(":")
    ok = v == "" or (sep and port.isdigit() and int(port) <= 65535 and " " not in host)
    return None if ok else "must be host:port (e.g. 127.0.0.1:1338) or empty"


@dataclass
class MetricsConfig:
    """containerd's ``[metrics]``: Prometheus text on /v1/metrics (and /metrics)."""

    address: str = cfg("", "host:port of the metrics HTTP endpoint (empty: not served).",
                       _host_port_or_empty)


def _http_url_or_empty(v: Any) -> str | None:
    ok = v == "" or v.startswith(("http://", "https://"))
    return None if ok else "must be an http(s):// URL or empty"


def _ratio(v: Any) -> str | None:
    return None if 0.0 <= v <= 1.0 else "must be between 0 and 1"


@dataclass
class TracingConfig:
    """containerd's OTLP tracing keys (http/protobuf only): one span per CRI call."""

    endpoint: str = cfg(
        "", "OTLP/HTTP traces URL, e.g. http://127.0.0.1:4318/v1/traces (empty: tracing off;\n"
        "the OpenTelemetry packages are then never imported).", _http_url_or_empty)
    sampling_ratio: float = cfg(1.0, "Fraction of root spans kept (0..1).", _ratio)
    service_name: str = cfg("pycrid", "service.name of the spans.")


@dataclass
class Config:
    """The top level of config.toml (plugin sections are decoded per plugin)."""

    version: int = cfg(CURRENT_VERSION, "Config layout version.")
    root: str = cfg("/var/lib/pycrid", "Persistent data: metadata, content, snapshots.", _abs_path)
    state: str = cfg("/run/pycrid", "Runtime state: sockets and mounts; gone after a reboot.",
                     _abs_path)
    disabled_plugins: list[str] = cfg([], "Plugins (type.id) not to load.")
    grpc: GrpcConfig = cfg(GrpcConfig(), "The CRI gRPC server.")
    debug: DebugConfig = cfg(DebugConfig(), "Logging.")
    metrics: MetricsConfig = cfg(MetricsConfig(), "Prometheus metrics endpoint.")
    tracing: TracingConfig = cfg(TracingConfig(), "OpenTelemetry tracing (OTLP/HTTP).")
    plugins: dict[str, Any] = field(default_factory=dict)


# --- plugin sections -------------------------------------------------------------------------


def _abs_paths(v: Any) -> str | None:
    bad = [p for p in v if not os.path.isabs(p)]
    return f"must be absolute paths ({', '.join(map(repr, bad))} is not)" if bad else None


@dataclass
class CNIConfig:
    """``[plugins."pycrid.cri.v1.runtime".cni]``: containerd's CNI keys."""

    bin_dirs: list[str] = cfg(["/opt/cni/bin", "/usr/lib/cni"],
                              "Directories searched for CNI plugin binaries, in order.",
                              _abs_paths)
    conf_dir: str = cfg("/etc/cni/net.d",
                        "CNI network configs (.conflist, .conf, .json), used in name order\n"
                        "and watched: changes apply without a restart.", _abs_path)
    max_conf_num: int = cfg(1, "How many config files become networks (eth0, eth1, ...);\n"
                            "0: all of them.", at_least(0))
    conf_template: str = cfg(
        "", "A Go-template conflist written to conf_dir as 10-pycrid-net.conflist when the\n"
        "kubelet sends a pod CIDR (UpdateRuntimeConfig) and no valid config exists.\n"
        "Fields: .PodCIDR, .PodCIDRRanges, .Routes.", abs_or_empty)
    ip_pref: str = cfg("ipv4", "Which pod IP is primary: the first IPv4 (\"ipv4\"), the first\n"
                       "IPv6 (\"ipv6\") or the first the plugin returned (\"cni\").",
                       one_of("ipv4", "ipv6", "cni"))


#: runtime_type of a runc handler (runc watched by conmon, containerd's runc shim's name).
RUNC_TYPE = "io.containerd.runc.v2"
#: runtime_type of a gVisor handler (runsc watched by conmon; the name of gVisor's own
#: containerd shim, whose options, TypeUrl and ConfigPath, it takes too).
RUNSC_TYPE = "io.containerd.runsc.v1"


@dataclass
class RuntimeHandlerOptions:
    """``[...runtimes.NAME.options]``: the options of containerd's runc shim (BinaryName,
    Root) and of gVisor's runsc shim (TypeUrl, ConfigPath) that pycrid honours."""

    BinaryName: str = cfg("", "This handler's runc (or runsc) binary (empty: the section's\n"
                          "runtime_path for runc; for runsc the config file's binary_name,\n"
                          "else runsc on the search path).", abs_or_empty)
    Root: str = cfg("", "This handler's runc (or runsc) state root (empty: <state>/runc for\n"
                    "the default handler, <state>/runc-NAME for the others, <state>/runsc-NAME\n"
                    "for runsc; for runsc the config file's root wins).", abs_or_empty)
    TypeUrl: str = cfg("", "runsc only, as containerd's gVisor config writes it:\n"
                       "\"io.containerd.runsc.v1.options\" (or empty).",
                       one_of("", "io.containerd.runsc.v1.options"))
    ConfigPath: str = cfg(
        "", "runsc only: gVisor's runsc.toml (binary_name, root, and a [runsc_config] table\n"
        "of runsc flags, e.g. platform = \"kvm\", debug = \"true\", debug-log =\n"
        "\"/var/log/runsc/%ID%/\"; %ID% is the pod's id). Read at start.", abs_or_empty)


@dataclass
class RuntimeHandlerConfig:
    """One runtime handler (RuntimeClass): ``[plugins."pycrid.cri.v1.runtime".runtimes.NAME]``."""

    runtime_type: str = cfg(
        RUNC_TYPE, f"{RUNC_TYPE}: runc watched by conmon. {RUNSC_TYPE}: gVisor's runsc, one\n"
        "sandbox (application kernel) per pod, its containers inside it.",
        one_of(RUNC_TYPE, RUNSC_TYPE))
    options: RuntimeHandlerOptions = cfg(RuntimeHandlerOptions(), "Binary, root, runsc config.")
    snapshotter: str = cfg("", "Snapshotter of this handler's containers (empty: the images\n"
                           "section's; only overlayfs exists).", one_of("", "overlayfs"))
    base_runtime_spec: str = cfg(
        "", "An OCI spec (JSON) that replaces the built-in default spec of this handler's\n"
        "pods and containers; read at start.", abs_or_empty)
    privileged_without_host_devices: bool = cfg(
        False, "Privileged containers of this handler get no host devices.")
    pod_annotations: list[str] = cfg(
        [], "Pod annotations (glob patterns) copied into the OCI spec of the pause and\n"
        "app containers.")
    container_annotations: list[str] = cfg(
        [], "Container annotations (glob patterns) copied into the container's OCI spec.")
    cni_conf_dir: str = cfg("", "This handler's own CNI config dir (empty: the [cni] one).",
                            abs_or_empty)
    cni_max_conf_num: int = cfg(1, "max_conf_num for cni_conf_dir (0: all).", at_least(0))
    sandboxer: str = cfg(
        "", "How this handler's pods are held (containerd's key): \"podsandbox\" always runs\n"
        "a pause container (for a runtime that needs a sandbox process); \"\" follows\n"
        "drop_infra_ctr. runsc pods always run a pause container (the sandbox).",
        one_of("", "podsandbox"))


def _seccomp_profile(v: Any) -> str | None:
    ok = v in ("", "runtime/default", "docker/default", "unconfined") or (
        isinstance(v, str) and v.startswith("localhost/") and len(v) > len("localhost/"))
    return None if ok else "must be runtime/default, docker/default, unconfined or localhost/<path>"


@dataclass
class RuntimeConfig:
    """``[plugins."pycrid.cri.v1.runtime"]``."""

    cgroup_driver: str = cfg("cgroupfs", "cgroup driver reported to the kubelet (RuntimeConfig)\n"
                             "and used for pod and container cgroups.",
                             one_of("cgroupfs", "systemd"))
    runtime_path: str = cfg("", "The runc binary (empty: runc on the search path: the daemon's\n"
                            "PATH, then /usr/local/sbin, /usr/local/bin, /usr/sbin, /usr/bin,\n"
                            "/sbin and /bin, the PATH conmon gets too).")
    conmon_path: str = cfg("", "The conmon binary that watches each container\n"
                           "(empty: conmon on the search path, as for runtime_path).")
    criu_path: str = cfg(
        "", "The CRIU binary runc checkpoints and restores containers with (empty: criu\n"
        "on the search path). Checked once at start with `criu check`; Status says\n"
        "whether checkpointing works. Kernels newer than a distribution's CRIU need a\n"
        "newer CRIU (Debian 12's 3.17 fails its check on kernel 6.x).", abs_or_empty)
    default_runtime_name: str = cfg("runc", "The handler of pods that name none (one of runtimes).")
    runtimes: dict[str, RuntimeHandlerConfig] = cfg(
        {"runc": RuntimeHandlerConfig()}, "Runtime handlers by name (RunPodSandbox's\n"
        "runtime_handler).")
    discover_runsc: bool = cfg(
        True, "Offer a runtime handler named \"runsc\" (gVisor, runtime_type\n"
        "io.containerd.runsc.v1 with no options) when no handler has that name and a runsc\n"
        "binary is on the search path, so a RuntimeClass with handler: runsc works without\n"
        "any config. A handler configured under that name replaces it; false offers none.")
    cni: CNIConfig = cfg(CNIConfig(), "Pod networking with CNI plugins.")
    unset_seccomp_profile: str = cfg(
        "", "Seccomp profile of pods and containers whose request names none: \"\" (no\n"
        "filter), runtime/default, docker/default, unconfined or localhost/<path>.",
        _seccomp_profile)
    stats_collect_period: Duration = cfg(
        Duration(10), "How often one background pass samples the cgroups, writable layers and\n"
        "pod networks that the stats and metrics calls answer from.", at_least(0.1))
    disable_hugetlb_controller: bool = cfg(
        True, "Ignore CRI hugepage_limits (containerd's key; the kubelet's own cgroups\n"
        "hold the pod's hugetlb limits).")
    tolerate_missing_hugetlb_controller: bool = cfg(
        True, "With the hugetlb controller enabled here but absent on the host, drop\n"
        "hugepage_limits instead of refusing the container.")
    pids_limit: int = cfg(0, "pids.max of every container (CRI-O's key; 0: no limit).",
                          at_least(0))
    drop_infra_ctr: bool = cfg(
        True, "Run pods that do not share a PID namespace among their containers without a\n"
        "pause process (CRI-O's key and default): their network, IPC and UTS namespaces\n"
        "are pinned with bind mounts and containers join them by path. Pods with\n"
        "namespace_options.pid = POD, and pods of a handler with sandboxer =\n"
        "\"podsandbox\", keep the pause container.")


def _port(v: Any) -> str | None:
    return None if v.isdigit() and int(v) <= 65535 else "must be a port number (0: any free port)"


def _host(v: Any) -> str | None:
    return None if v and not any(c in v for c in "/ ") else "must be an IP address or host name"


@dataclass
class X509KeyPairConfig:
    tls_cert_file: str = cfg("", "Certificate (PEM) of the streaming server.", abs_or_empty)
    tls_key_file: str = cfg("", "Its private key (PEM).", abs_or_empty)


@dataclass
class CRIServerConfig:
    """``[plugins."pycrid.grpc.v1.cri"]``: containerd's server keys, streaming included."""

    disable_tcp_service: bool = cfg(True, "Do not serve CRI on [grpc] tcp_address.")
    stream_server_address: str = cfg(
        "127.0.0.1", "Address of the streaming server (exec, attach, port-forward URLs).", _host)
    stream_server_port: str = cfg("0", "Its port; \"0\" picks a free one at start.", _port)
    stream_idle_timeout: Duration = cfg(
        Duration(4 * 3600), "A stream connection with no traffic for this long is closed.")
    enable_tls_streaming: bool = cfg(
        False, "Serve streams over HTTPS (with x509_key_pair_streaming, else a self-signed\n"
        "certificate made at start).")
    x509_key_pair_streaming: X509KeyPairConfig = cfg(X509KeyPairConfig(),
                                                     "Certificate of the HTTPS streaming server.")


@dataclass
class DefaultValidatorConfig:
    """``[plugins."pycrid.nri.v1.nri".default_validator]``: upstream's builtin validator."""

    enable: bool = cfg(False, "Run the built-in validator (as plugin 00-default-validator).")
    reject_oci_hook_adjustment: bool = cfg(False, "Reject adjustments that add OCI hooks.")
    reject_runtime_default_seccomp_adjustment: bool = cfg(
        False, "Reject seccomp adjustments of containers whose profile is RuntimeDefault.")
    reject_unconfined_seccomp_adjustment: bool = cfg(
        False, "Reject seccomp adjustments of containers that run Unconfined.")
    reject_custom_seccomp_adjustment: bool = cfg(
        False, "Reject seccomp adjustments of containers with a Localhost profile.")
    reject_namespace_adjustment: bool = cfg(False, "Reject adjustments of Linux namespaces.")
    reject_sysctl_adjustment: bool = cfg(False, "Reject sysctl adjustments.")
    required_plugins: list[str] = cfg(
        [], "Plugins (by name, without the index) every container needs: a create is\n"
        "rejected while one of them has not adjusted it (is not connected).")
    tolerate_missing_plugins_annotation: str = cfg(
        "", "A pod annotation that, set to \"true\", lets the pod's containers be created\n"
        "without the required plugins.")


@dataclass
class NRIConfig:
    """``[plugins."pycrid.nri.v1.nri"]``: containerd's NRI keys and defaults."""

    disable: bool = cfg(False, "Turn NRI off (it is on by default, as in containerd 2).")
    socket_path: str = cfg("/var/run/nri/nri.sock",
                           "Socket external plugins connect to (its directory is made 0700).",
                           _abs_path)
    plugin_path: str = cfg("/opt/nri/plugins",
                           "Pre-installed plugins (executables named NN-name), launched at start.",
                           _abs_path)
    plugin_config_path: str = cfg(
        "/etc/nri/conf.d", "Configuration of pre-installed plugins: NN-name.conf, else name.conf.",
        _abs_path)
    plugin_registration_timeout: Duration = cfg(
        Duration(5), "A plugin that has not registered this long after connecting is closed.\n"
        "Also the deadline of each Synchronize call (the node's pods and containers sent to a\n"
        "plugin as it registers), which containerd bounds by plugin_request_timeout.")
    plugin_request_timeout: Duration = cfg(
        Duration(2), "Deadline of each event call to a plugin (Synchronize has\n"
        "plugin_registration_timeout); a plugin that misses it is closed.")
    plugin_request_timeouts: dict[str, Duration] = cfg(
        {}, "Per-plugin request timeouts overriding plugin_request_timeout, keyed by\n"
        "plugin name (\"logger\") or index-name (\"10-logger\"). pycrid's addition.")
    disable_connections: bool = cfg(False, "Accept no external plugins (no socket is created).")
    default_validator: DefaultValidatorConfig = cfg(DefaultValidatorConfig(),
                                                    "The built-in default validator.")


@dataclass
class CAdvisorConfig:
    """``[plugins."pycrid.cadvisor.v1.containerd"]``: containerd's API, read-only, for the
    kubelet's built-in cAdvisor (pycrid's addition; see docs/kubelet.md)."""

    disable: bool = cfg(
        False, "Do not serve it. The kubelet's built-in cAdvisor then cannot tell which pod\n"
        "a pycrid cgroup belongs to: no pod network or process stats in /stats/summary and\n"
        "no per-container series in /metrics/cadvisor, unless the kubelet takes its stats\n"
        "from CRI (feature gate PodAndContainerStatsFromCRI).")
    socket_path: str = cfg(
        "/run/containerd/containerd.sock",
        "Where the kubelet's cAdvisor dials containerd (the kubelet's --containerd flag,\n"
        "this path by default). Read-only: the container records and task pids of\n"
        "pycrid's pods and containers in namespace k8s.io, and Version. A socket that\n"
        "another live process listens on (a real containerd) is never taken over: pycrid\n"
        "warns and does not serve it. The kubelet dials once, at its start: start pycrid\n"
        "first.", _abs_path)
