"""Build the spec builders' typed inputs from flat keyword arguments, so a spec test
names only the one fact it varies (``cgroup_v2=False``, ``host_security=...``)."""

from __future__ import annotations

from typing import Any

from pycrid.oci.spec_inputs import HandlerOptions, HostInput, ImageInput, SpecPolicy

#: A flat keyword -> (group, field of that group).
_ROUTES = {
    "etc_passwd": ("image", "etc_passwd"),
    "etc_group": ("image", "etc_group"),
    "min_oom_score_adj": ("host", "min_oom_score_adj"),
    "host_security": ("host", "security"),
    "host_capabilities": ("host", "capabilities"),
    "host_cgroup_options": ("host", "cgroup_options"),
    "cgroup_v2": ("host", "cgroup_v2"),
    "daemon_in_userns": ("host", "in_userns"),
    "node_hostname": ("host", "hostname"),
    "cgroup_driver": ("policy", "cgroup_driver"),
    "unset_seccomp_profile": ("policy", "unset_seccomp_profile"),
    "resource_policy": ("policy", "resources"),
    "cgroup_writable": ("policy", "cgroup_writable"),
    "disable_proc_mount": ("policy", "disable_proc_mount"),
    "ignore_image_defined_volumes": ("policy", "ignore_image_defined_volumes"),
    "unprivileged_ports": ("policy", "unprivileged_ports"),
    "unprivileged_icmp": ("policy", "unprivileged_icmp"),
    "base_spec": ("handler", "base_spec"),
    "pod_annotation_globs": ("handler", "pod_annotations"),
    "container_annotation_globs": ("handler", "container_annotations"),
    "privileged_without_host_devices": ("handler", "privileged_without_host_devices"),
    "rro_supported": ("handler", "rro_supported"),
    "sandboxed": ("handler", "sandboxed"),
    "handler_capabilities": ("handler", "capabilities"),
}


def spec_inputs(image_config: dict[str, Any], kw: dict[str, Any]) -> tuple[
        ImageInput, dict[str, Any]]:
    """The ImageInput and the host/policy/handler keywords the builders take; the
    keywords of ``kw`` that belong to none of them are left in ``kw``."""
    groups: dict[str, dict[str, Any]] = {"image": {}, "host": {}, "policy": {},
                                         "handler": {}}
    for key in [k for k in kw if k in _ROUTES]:
        group, name = _ROUTES[key]
        groups[group][name] = kw.pop(key)
    return ImageInput(image_config, **groups["image"]), {
        "host": HostInput(**groups["host"]), "policy": SpecPolicy(**groups["policy"]),
        "handler": HandlerOptions(**groups["handler"])}
