"""A CRI pod's CNI arguments and capability arguments, as containerd derives them.

CNI_ARGS carry the kubelet's pod identity (``K8S_POD_*`` and ``IgnoreUnknown``);
capability arguments reach only plugins that declare them: ``portMappings`` (host
ports > 0, protocol in lower case), ``bandwidth`` (the kubernetes.io/ingress- and
egress-bandwidth annotations, in bits per second), ``dns`` (the pod's DNS
config), ``cgroupPath`` (the pod's cgroup parent), the pod annotations, and
``ipRanges`` from the pod CIDRs the kubelet set with UpdateRuntimeConfig
(dockershim's kubenet passed them the same way). Reference: containerd's
internal/cri/server/sandbox_run.go (cniNamespaceOpts).
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from decimal import Decimal, InvalidOperation
from typing import Any

from cri_api.v1 import api_pb2 as pb

from pycrid.errors import InvalidArgument
from pycrid.network.cni import Attachment

INGRESS_ANNOTATION = "kubernetes.io/ingress-bandwidth"
EGRESS_ANNOTATION = "kubernetes.io/egress-bandwidth"
POD_ANNOTATIONS_CAPABILITY = "io.kubernetes.cri.pod-annotations"
_MIN_RATE = 1000  # 1 kbit/s and 1 Pbit/s: the kubelet's bounds of a sensible limit
_MAX_RATE = 10**15
_MAX_BURST = 2**32 - 1
_QUANTITY = re.compile(r"^([+-]?[0-9.]+(?:[eE][+-]?[0-9]+)?)(Ki|Mi|Gi|Ti|Pi|Ei|m|k|M|G|T|P|E)?$")
_SUFFIX = {None: Decimal(1), "m": Decimal("0.001"), "k": Decimal(10) ** 3,
           "M": Decimal(10) ** 6, "G": Decimal(10) ** 9, "T": Decimal(10) ** 12,
           "P": Decimal(10) ** 15, "E": Decimal(10) ** 18, "Ki": Decimal(2) ** 10,
           "Mi": Decimal(2) ** 20, "Gi": Decimal(2) ** 30, "Ti": Decimal(2) ** 40,
           "Pi": Decimal(2) ** 50, "Ei": Decimal(2) ** 60}


def quantity(text: str) -> int:
    """A Kubernetes resource quantity ("10M", "1Gi", "1e6") as an integer, rounded up."""
    m = _QUANTITY.match(text.strip())
    if m is None:
        raise ValueError(f"{text!r} is not a quantity (like 10M or 1Gi)")
    try:
        number = Decimal(m[1])
    except InvalidOperation:
        raise ValueError(f"{text!r} is not a quantity (like 10M or 1Gi)") from None
    if not number.is_finite() or abs(number.adjusted()) > 30:
        # Checked before any arithmetic: "1e999999" must not become a million-digit int.
        raise ValueError(f"{text!r} is out of range")
    return math.ceil(number * _SUFFIX[m[2]])


def _rate(annotations: Any, key: str) -> int | None:
    if key not in annotations:
        return None
    try:
        rate = quantity(annotations[key])
    except ValueError as e:
        raise InvalidArgument(f"pod annotation {key}: {e}") from None
    if rate < _MIN_RATE:
        raise InvalidArgument(f"pod annotation {key}: {annotations[key]} is unreasonably "
                              "small (< 1kbit)")
    if rate > _MAX_RATE:
        raise InvalidArgument(f"pod annotation {key}: {annotations[key]} is unreasonably "
                              "large (> 1Pbit)")
    return rate


def bandwidth(annotations: Any) -> dict[str, int] | None:
    ingress, egress = _rate(annotations, INGRESS_ANNOTATION), _rate(annotations, EGRESS_ANNOTATION)
    if ingress is None and egress is None:
        return None
    out: dict[str, int] = {}
    if ingress is not None:
        out.update(ingressRate=ingress, ingressBurst=_MAX_BURST)
    if egress is not None:
        out.update(egressRate=egress, egressBurst=_MAX_BURST)
    return out


def port_mappings(config: pb.PodSandboxConfig) -> list[dict[str, Any]]:
    return [{"hostPort": pm.host_port, "containerPort": pm.container_port,
             "protocol": pb.Protocol.Name(pm.protocol).lower(), "hostIP": pm.host_ip}
            for pm in config.port_mappings if pm.host_port > 0]


def attachment(sandbox_id: str, netns: str, config: pb.PodSandboxConfig,
               pod_cidrs: Sequence[str] = ()) -> Attachment:
    md = config.metadata
    args = (("K8S_POD_NAMESPACE", md.namespace), ("K8S_POD_NAME", md.name),
            ("K8S_POD_INFRA_CONTAINER_ID", sandbox_id), ("K8S_POD_UID", md.uid),
            ("IgnoreUnknown", "1"))
    caps: dict[str, Any] = {POD_ANNOTATIONS_CAPABILITY: dict(config.annotations)}
    if ports := port_mappings(config):
        caps["portMappings"] = ports
    if (bw := bandwidth(config.annotations)) is not None:
        caps["bandwidth"] = bw
    if config.HasField("dns_config"):
        dns = config.dns_config
        caps["dns"] = {"servers": list(dns.servers), "searches": list(dns.searches),
                       "options": list(dns.options)}
    if config.linux.cgroup_parent:
        caps["cgroupPath"] = config.linux.cgroup_parent
    if pod_cidrs:
        caps["ipRanges"] = [[{"subnet": cidr}] for cidr in pod_cidrs]
    return Attachment(sandbox_id, netns, args, caps)
