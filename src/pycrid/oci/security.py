"""The security-context rules around the spec builders: AppArmor, SELinux, seccomp
selection, pod sysctls (CRI-TO-OCI.md §1.7, §2.12).

What the host supports is probed once, with the other host facts, and passed to the pure
spec builders as a :class:`HostSecurity`, so tests can describe any host.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from cri_api.v1 import api_pb2 as pb

from pycrid.errors import InvalidArgument
from pycrid.host.facts import HostSecurity
from pycrid.oci import seccomp

log = logging.getLogger(__name__)

Spec = dict[str, Any]

#: pycrid generates no AppArmor profile; RuntimeDefault uses this one if the
#: operator loaded it, and is refused otherwise.
APPARMOR_DEFAULT_PROFILE = "pycrid-default"


# ---- AppArmor -----------------------------------------------------------------------------

def apparmor_profile(sc: Any) -> seccomp.Profile | None:
    """The AppArmor request: ``apparmor`` field, else deprecated ``apparmor_profile``."""
    if sc.HasField("apparmor"):
        return seccomp.from_cri(sc.apparmor, "apparmor")
    if sc.apparmor_profile:
        return seccomp.parse_profile_string(sc.apparmor_profile, "apparmor")
    return None


def apparmor_name(sc: Any, *, privileged: bool, host: HostSecurity) -> str | None:
    """The ``process.apparmorProfile`` for a container, None for none.

    Without AppArmor on the host only "none" or Unconfined is acceptable (containerd).
    With it: Localhost must name a loaded profile; RuntimeDefault (also for an absent
    request, as containerd) needs :data:`APPARMOR_DEFAULT_PROFILE` loaded, because
    pycrid does not write profiles itself; privileged drops RuntimeDefault.
    """
    profile = apparmor_profile(sc)
    if not host.apparmor:
        if profile is not None and profile.kind != "Unconfined":
            raise InvalidArgument(f"AppArmor profile {profile.kind} requested but "
                                  "AppArmor is not enabled on this host")
        return None
    if profile is None:
        if privileged or not host.apparmor_profile_loaded(APPARMOR_DEFAULT_PROFILE):
            return None  # nothing asked for: run unconfined rather than fail
        return APPARMOR_DEFAULT_PROFILE
    if profile.kind == "Unconfined":
        return None
    if profile.kind == "RuntimeDefault":
        if privileged:
            return None
        if not host.apparmor_profile_loaded(APPARMOR_DEFAULT_PROFILE):
            raise InvalidArgument(
                f"AppArmor RuntimeDefault needs the profile {APPARMOR_DEFAULT_PROFILE!r} "
                "loaded on the host (pycrid does not generate one)")
        return APPARMOR_DEFAULT_PROFILE
    name = profile.ref[len(seccomp.LOCALHOST_PREFIX):] \
        if profile.ref.startswith(seccomp.LOCALHOST_PREFIX) else profile.ref
    if not name:
        raise InvalidArgument("AppArmor profile type Localhost needs a localhost_ref")
    if not host.apparmor_profile_loaded(name):
        raise InvalidArgument(f"AppArmor profile {name!r} is not loaded on this host")
    return name


def selinux_ignored(sc: Any, host: HostSecurity, what: str) -> None:
    """SELinux options are accepted and not applied (pycrid does not label): on a host
    without SELinux containerd ignores them the same way."""
    if sc.HasField("selinux_options"):
        o = sc.selinux_options
        log.debug("%s: SELinux options %s:%s:%s:%s ignored (host SELinux: %s)", what,
                  o.user, o.role, o.type, o.level, "yes" if host.selinux else "no")


# ---- pod sysctls ----------------------------------------------------------------------------

#: System V IPC sysctls (the kubelet's namespaced list); ``fs.mqueue.*`` also is IPC.
IPC_SYSCTLS = frozenset({
    "kernel.shm_rmid_forced", "kernel.msgmax", "kernel.msgmnb", "kernel.msgmni",
    "kernel.sem", "kernel.shmall", "kernel.shmmax", "kernel.shmmni",
})


def normalize_sysctl(name: str) -> str:
    """The kubelet's rule: a name whose first separator is "/" uses "/" between parts
    (and may hold "." inside one, like an interface ``eth0.100``), so swap the two."""
    for ch in name:
        if ch == ".":
            return name
        if ch == "/":
            return name.translate(str.maketrans("./", "/."))
    return name


def sysctl_namespace(name: str) -> str | None:
    """"ipc", "net", or None when the sysctl is not namespaced (kubelet's table)."""
    if name in IPC_SYSCTLS or name.startswith("fs.mqueue."):
        return "ipc"
    if name.startswith("net."):
        return "net"
    return None


def validate_sysctls(sysctls: Mapping[str, str], opts: pb.NamespaceOption) -> dict[str, str]:
    """Pod sysctls, names normalised; refuses what would change the node itself."""
    out: dict[str, str] = {}
    for raw, value in sysctls.items():
        name = normalize_sysctl(raw)
        kind = sysctl_namespace(name)
        if kind is None:
            raise InvalidArgument(f"sysctl {raw!r} is not namespaced: a pod cannot set it")
        if kind == "ipc" and opts.ipc == pb.NODE:
            raise InvalidArgument(f"sysctl {raw!r} is in the IPC namespace: "
                                  "not allowed with host IPC")
        if kind == "net" and opts.network == pb.NODE:
            raise InvalidArgument(f"sysctl {raw!r} is in the network namespace: "
                                  "not allowed with host network")
        out[name] = value
    return out


# ---- validation up front and application to a spec ----------------------------------------

def validate_pod(config: pb.PodSandboxConfig) -> None:
    """Everything RunPodSandbox can refuse about security before any side effect."""
    psc = config.linux.security_context
    validate_sysctls(config.linux.sysctls, psc.namespace_options)
    profile = seccomp.requested(psc)
    if profile is not None and profile.kind == "Localhost" and not psc.privileged:
        seccomp.load_localhost(profile.ref)


def apply_seccomp(spec: Spec, sc: Any, *, privileged: bool, host: HostSecurity,
                  unset_profile: str) -> None:
    """Set ``linux.seccomp`` from the request, after capabilities are final: the
    RuntimeDefault allow-list depends on the final bounding set."""
    profile = seccomp.requested(sc, unset_profile)
    bounding = spec["process"].get("capabilities", {}).get("bounding") or []
    policy = seccomp.linux_seccomp(profile, privileged=privileged, bounding=bounding,
                                   supported=host.seccomp)
    linux = spec.setdefault("linux", {})
    if policy is not None:
        linux["seccomp"] = policy
    elif privileged:
        linux.pop("seccomp", None)
    # else: no filter asked for; a runtime handler's base spec keeps its own (containerd)


def apply_container_security(spec: Spec, sc: Any, *, privileged: bool, host: HostSecurity,
                             unset_profile: str) -> None:
    """AppArmor, SELinux and seccomp of an app container (§2.1's order)."""
    name = apparmor_name(sc, privileged=privileged, host=host)
    if name:
        spec["process"]["apparmorProfile"] = name
    selinux_ignored(sc, host, "container")
    apply_seccomp(spec, sc, privileged=privileged, host=host, unset_profile=unset_profile)
