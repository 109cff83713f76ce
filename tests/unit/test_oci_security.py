"""Security context rules (CRI-TO-OCI.md §1.7, §2.9-§2.12): seccomp profile choice and
the RuntimeDefault profile, AppArmor, SELinux, pod sysctls, host probing."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from cri_api.v1 import api_pb2 as pb

from pycrid.core.nri_objects import _set_seccomp_profile
from pycrid.errors import InvalidArgument
from pycrid.host.facts import HostSecurity, own_capabilities, read_facts
from pycrid.nri import api
from pycrid.oci import seccomp
from pycrid.oci.container_spec import ContainerSpecRequest, container_spec
from pycrid.oci.defaults import ALL_CAPABILITIES, DEFAULT_CAPABILITIES
from pycrid.oci.sandbox_spec import SandboxSpecRequest, sandbox_spec
from pycrid.oci.security import (
    APPARMOR_DEFAULT_PROFILE,
    apparmor_name,
    normalize_sysctl,
    validate_pod,
    validate_sysctls,
)
from pycrid.oci.spec import Namespaces
from pycrid.oci.spec_mounts import SandboxFiles
from tests.support.spec_args import spec_inputs

RD = pb.SecurityProfile.RuntimeDefault
UNCONFINED = pb.SecurityProfile.Unconfined
LOCALHOST = pb.SecurityProfile.Localhost
FILES = SandboxFiles(hostname="/h/hostname", hosts="/h/hosts", resolv_conf="/h/resolv.conf",
                     shm="/s/shm")
PASSWD = "root:x:0:0:root:/root:/bin/sh\n"
GROUP = "root:x:0:\n"
X86 = {"machine": "x86_64", "kernel": (6, 1)}

#: The namespaces of a pod whose pause process is pid 42.
PAUSE_42 = Namespaces(*(f"/proc/42/ns/{k}" for k in ("net", "ipc", "uts", "pid", "user")))


def pod(privileged: bool = False, **kw: Any) -> pb.PodSandboxConfig:
    cfg = pb.PodSandboxConfig(metadata=pb.PodSandboxMetadata(name="p", namespace="n", uid="u"))
    cfg.linux.security_context.privileged = privileged
    for k, v in kw.items():
        if k == "sysctls":
            cfg.linux.sysctls.update(v)
        elif k == "seccomp":
            cfg.linux.security_context.seccomp.CopyFrom(v)
        else:
            setattr(cfg.linux.security_context.namespace_options, k, v)
    return cfg


def ctr(sc: pb.LinuxContainerSecurityContext | None = None, sandbox: pb.PodSandboxConfig | None
        = None, **kw: Any) -> dict[str, Any]:
    cfg = pb.ContainerConfig(metadata=pb.ContainerMetadata(name="c"))
    if sc is not None:
        cfg.linux.security_context.CopyFrom(sc)
    kw.setdefault("etc_passwd", PASSWD)
    kw.setdefault("etc_group", GROUP)
    inputs, groups = spec_inputs({"config": {"Cmd": ["sh"]}}, kw)
    return container_spec(ContainerSpecRequest(
        cfg, sandbox or pod(privileged=bool(sc and sc.privileged)),
        container_id="c" * 64, sandbox_id="s" * 64, namespaces=PAUSE_42, image_name="busybox",
        files=FILES, volumes_dir="/v", **kw), inputs, **groups)


def pause_spec(cfg: pb.PodSandboxConfig, **kw: Any) -> dict[str, Any]:
    inputs, groups = spec_inputs({"config": {"Entrypoint": ["/pause"]}}, kw)
    return sandbox_spec(SandboxSpecRequest(cfg, "s" * 64, pause_image="pause", files=FILES,
                                           netns_path="/n", **kw), inputs, **groups)


def sc(**kw: Any) -> pb.LinuxContainerSecurityContext:
    return pb.LinuxContainerSecurityContext(**kw)


def names(profile: dict[str, Any]) -> set[str]:
    """Syscalls allowed without conditions."""
    return {n for r in profile["syscalls"] if r["action"] == "SCMP_ACT_ALLOW" and "args" not in r
            for n in r["names"]}


def rules_for(profile: dict[str, Any], name: str) -> list[dict[str, Any]]:
    return [r for r in profile["syscalls"] if name in r["names"]]


@pytest.fixture
def local_profile(tmp_path: Path) -> Path:
    p = tmp_path / "profile.json"
    p.write_text(json.dumps({"defaultAction": "SCMP_ACT_LOG", "syscalls": []}))
    return p


# ---- profile selection (§2.12) --------------------------------------------------------------

@pytest.mark.parametrize(("field", "path", "unset", "want"), [
    (None, "", "", None),
    (pb.SecurityProfile(profile_type=RD), "", "", seccomp.Profile("RuntimeDefault")),
    (pb.SecurityProfile(profile_type=UNCONFINED), "", "", seccomp.Profile("Unconfined")),
    (pb.SecurityProfile(profile_type=LOCALHOST, localhost_ref="/p.json"), "", "",
     seccomp.Profile("Localhost", "/p.json")),
    # the field wins over the deprecated string and the config default
    (pb.SecurityProfile(profile_type=UNCONFINED), "runtime/default", "runtime/default",
     seccomp.Profile("Unconfined")),
    (None, "runtime/default", "", seccomp.Profile("RuntimeDefault")),
    (None, "docker/default", "", seccomp.Profile("RuntimeDefault")),
    (None, "unconfined", "runtime/default", seccomp.Profile("Unconfined")),
    (None, "localhost//etc/p.json", "", seccomp.Profile("Localhost", "/etc/p.json")),
    (None, "", "runtime/default", seccomp.Profile("RuntimeDefault")),
    (None, "", "unconfined", seccomp.Profile("Unconfined")),
    (None, "", "localhost//x.json", seccomp.Profile("Localhost", "/x.json")),
])
def test_profile_selection(field: pb.SecurityProfile | None, path: str, unset: str,
                           want: seccomp.Profile | None) -> None:
    s = sc(seccomp_profile_path=path)
    if field is not None:
        s.seccomp.CopyFrom(field)
    assert seccomp.requested(s, unset) == want


def test_invalid_profile_string() -> None:
    with pytest.raises(InvalidArgument, match="invalid seccomp profile 'bogus'"):
        seccomp.requested(sc(seccomp_profile_path="bogus"))


def test_localhost_ref_only_with_localhost() -> None:
    s = sc(seccomp=pb.SecurityProfile(profile_type=RD, localhost_ref="/x"))
    with pytest.raises(InvalidArgument, match="only valid with type Localhost"):
        seccomp.requested(s)


def test_spec_without_request_has_no_seccomp() -> None:
    assert "seccomp" not in ctr()["linux"]
    assert "seccomp" not in ctr(sc(seccomp=pb.SecurityProfile(profile_type=UNCONFINED)))["linux"]


def test_spec_unset_profile_applies_when_request_is_silent() -> None:
    spec = ctr(unset_seccomp_profile="runtime/default")
    assert spec["linux"]["seccomp"]["defaultAction"] == "SCMP_ACT_ERRNO"
    spec = ctr(sc(seccomp=pb.SecurityProfile(profile_type=UNCONFINED)),
               unset_seccomp_profile="runtime/default")
    assert "seccomp" not in spec["linux"]


def test_privileged_has_no_seccomp() -> None:
    s = sc(privileged=True, seccomp=pb.SecurityProfile(profile_type=RD))
    assert "seccomp" not in ctr(s)["linux"]


def test_seccomp_unsupported_host() -> None:
    host = HostSecurity(seccomp=False, apparmor=False, selinux=False)
    with pytest.raises(InvalidArgument, match="seccomp is not supported"):
        ctr(sc(seccomp=pb.SecurityProfile(profile_type=RD)), host_security=host)
    ctr(sc(seccomp=pb.SecurityProfile(profile_type=UNCONFINED)), host_security=host)
    assert "seccomp" not in ctr(host_security=host)["linux"]


def test_localhost_loaded_verbatim(local_profile: Path) -> None:
    spec = ctr(sc(seccomp=pb.SecurityProfile(profile_type=LOCALHOST,
                                              localhost_ref=str(local_profile))))
    assert spec["linux"]["seccomp"] == {"defaultAction": "SCMP_ACT_LOG", "syscalls": []}
    spec = ctr(sc(seccomp_profile_path=f"localhost/{local_profile}"))
    assert spec["linux"]["seccomp"]["defaultAction"] == "SCMP_ACT_LOG"


@pytest.mark.parametrize(("content", "match"), [
    (None, "cannot read seccomp profile"),
    ("{not json", "is not valid JSON"),
    ("[1, 2]", "is not a JSON object"),
])
def test_localhost_errors_name_the_path(tmp_path: Path, content: str | None, match: str) -> None:
    p = tmp_path / "bad.json"
    if content is not None:
        p.write_text(content)
    s = sc(seccomp=pb.SecurityProfile(profile_type=LOCALHOST, localhost_ref=str(p)))
    with pytest.raises(InvalidArgument, match=match) as e:
        ctr(s)
    assert str(p) in str(e.value)


def test_localhost_needs_a_ref() -> None:
    with pytest.raises(InvalidArgument, match="needs a localhost_ref"):
        ctr(sc(seccomp=pb.SecurityProfile(profile_type=LOCALHOST)))


# ---- the RuntimeDefault profile -------------------------------------------------------------

def test_runtime_default_shape() -> None:
    p = seccomp.runtime_default(DEFAULT_CAPABILITIES, **X86)
    assert p["defaultAction"] == "SCMP_ACT_ERRNO"
    assert p["defaultErrnoRet"] == 1
    assert p["architectures"] == ["SCMP_ARCH_X86_64", "SCMP_ARCH_X86", "SCMP_ARCH_X32"]
    arm = seccomp.runtime_default(DEFAULT_CAPABILITIES, machine="aarch64", kernel=(6, 1))
    assert arm["architectures"] == ["SCMP_ARCH_AARCH64", "SCMP_ARCH_ARM"]
    assert {"set_tls", "cacheflush"} <= names(arm) and "arch_prctl" not in names(arm)
    assert {"arch_prctl", "modify_ldt"} <= names(p)
    allowed = names(p)
    for ordinary in ("read", "write", "openat", "execve", "exit_group", "futex", "epoll_wait",
                     "accept4", "clock_gettime", "rt_sigaction", "getpid"):
        assert ordinary in allowed
    for denied in ("mount", "umount2", "unshare", "setns", "sethostname", "reboot",
                   "init_module", "settimeofday", "kexec_load", "open_by_handle_at", "bpf",
                   "add_key", "keyctl", "userfaultfd", "socket", "personality", "clone"):
        assert denied not in allowed, denied


def test_ptrace_only_on_kernel_4_8() -> None:
    assert "ptrace" in names(seccomp.runtime_default([], machine="x86_64", kernel=(4, 8)))
    assert "ptrace" not in names(seccomp.runtime_default([], machine="x86_64", kernel=(4, 4)))


@pytest.mark.parametrize(("cap", "unlocked"), [
    ("CAP_SYS_ADMIN", {"mount", "umount2", "unshare", "setns", "sethostname", "clone",
                       "clone3", "fsopen", "quotactl"}),
    ("CAP_SYS_PTRACE", {"kcmp", "pidfd_getfd", "process_madvise"}),
    ("CAP_SYS_TIME", {"settimeofday", "clock_settime", "stime"}),
    ("CAP_SYS_MODULE", {"init_module", "finit_module", "delete_module"}),
    ("CAP_SYS_BOOT", {"reboot"}),
    ("CAP_SYS_NICE", {"mbind", "set_mempolicy", "get_mempolicy"}),
    ("CAP_SYS_RAWIO", {"iopl", "ioperm"}),
    ("CAP_SYS_CHROOT", {"chroot"}),
    ("CAP_DAC_READ_SEARCH", {"open_by_handle_at"}),
    ("CAP_SYS_PACCT", {"acct"}),
    ("CAP_SYSLOG", {"syslog"}),
    ("CAP_BPF", {"bpf"}),
    ("CAP_PERFMON", {"perf_event_open"}),
    ("CAP_SYS_TTY_CONFIG", {"vhangup"}),
])
def test_capability_unlocks(cap: str, unlocked: set[str]) -> None:
    without = names(seccomp.runtime_default([], **X86))
    with_cap = names(seccomp.runtime_default([cap], **X86))
    assert not unlocked & without
    assert unlocked <= with_cap


def test_clone_rules_without_sys_admin() -> None:
    p = seccomp.runtime_default(DEFAULT_CAPABILITIES, **X86)
    (clone,) = rules_for(p, "clone")
    assert clone["action"] == "SCMP_ACT_ALLOW"
    assert clone["args"] == [{"index": 0, "op": "SCMP_CMP_MASKED_EQ", "value": 0x7E020000,
                              "valueTwo": 0}]
    (clone3,) = rules_for(p, "clone3")
    assert clone3 == {"names": ["clone3"], "action": "SCMP_ACT_ERRNO", "errnoRet": 38}


def test_clone_unrestricted_with_sys_admin() -> None:
    p = seccomp.runtime_default([*DEFAULT_CAPABILITIES, "CAP_SYS_ADMIN"], **X86)
    assert [r.get("args") for r in rules_for(p, "clone")] == [None]
    assert [r["action"] for r in rules_for(p, "clone3")] == ["SCMP_ACT_ALLOW"]


def test_socket_families_and_personality() -> None:
    p = seccomp.runtime_default([], **X86)
    conds = [(a["op"], a["value"]) for r in rules_for(p, "socket") for a in r["args"]]
    assert conds == [("SCMP_CMP_LT", 38), ("SCMP_CMP_EQ", 39), ("SCMP_CMP_GT", 40)]

    def allowed(family: int) -> bool:
        return any((op == "SCMP_CMP_LT" and family < v) or (op == "SCMP_CMP_EQ" and family == v)
                   or (op == "SCMP_CMP_GT" and family > v) for op, v in conds)
    assert allowed(1) and allowed(2) and allowed(10) and allowed(16) and allowed(44)
    assert not allowed(38) and not allowed(40)  # AF_ALG, AF_VSOCK
    values = sorted(r["args"][0]["value"] for r in rules_for(p, "personality"))
    assert values == [0, 8, 0x20000, 0x20008, 0xFFFFFFFF]


def test_final_bounding_set_decides() -> None:
    """add SYS_ADMIN unlocks mount; drop ALL leaves even chroot out; add ALL unlocks all."""
    admin = ctr(sc(seccomp=pb.SecurityProfile(profile_type=RD),
                   capabilities=pb.Capability(add_capabilities=["SYS_ADMIN"])))
    assert "mount" in names(admin["linux"]["seccomp"])
    none = ctr(sc(seccomp=pb.SecurityProfile(profile_type=RD),
                  capabilities=pb.Capability(drop_capabilities=["ALL"])))
    assert not {"mount", "chroot"} & names(none["linux"]["seccomp"])
    default = ctr(sc(seccomp=pb.SecurityProfile(profile_type=RD)))
    assert "chroot" in names(default["linux"]["seccomp"])  # SYS_CHROOT is a default cap
    everything = ctr(sc(seccomp=pb.SecurityProfile(profile_type=RD),
                        capabilities=pb.Capability(add_capabilities=["ALL"])),
                     host_capabilities=("CAP_SYS_ADMIN", "CAP_SYS_TIME"))
    assert {"mount", "settimeofday"} <= names(everything["linux"]["seccomp"])


def test_pause_gets_pod_profile(local_profile: Path) -> None:
    spec = pause_spec
    assert "seccomp" not in spec(pod())["linux"]
    assert spec(pod(seccomp=pb.SecurityProfile(profile_type=RD)))["linux"]["seccomp"][
        "defaultAction"] == "SCMP_ACT_ERRNO"
    assert "seccomp" in spec(pod(), unset_seccomp_profile="runtime/default")["linux"]
    cfg = pod(privileged=True, seccomp=pb.SecurityProfile(profile_type=RD))
    assert "seccomp" not in spec(cfg)["linux"]
    loc = pod(seccomp=pb.SecurityProfile(profile_type=LOCALHOST, localhost_ref=str(local_profile)))
    assert spec(loc)["linux"]["seccomp"]["defaultAction"] == "SCMP_ACT_LOG"


def test_pod_validation_checks_localhost_file(tmp_path: Path) -> None:
    cfg = pod(seccomp=pb.SecurityProfile(profile_type=LOCALHOST,
                                         localhost_ref=str(tmp_path / "nope.json")))
    with pytest.raises(InvalidArgument, match=r"nope\.json"):
        validate_pod(cfg)


def test_base_spec_seccomp_kept_without_request() -> None:
    base = ctr()
    base["linux"]["seccomp"] = {"defaultAction": "SCMP_ACT_LOG"}
    assert ctr(base_spec=base)["linux"]["seccomp"] == {"defaultAction": "SCMP_ACT_LOG"}


# ---- NRI sees the profile ---------------------------------------------------------------------

@pytest.mark.parametrize(("s", "want"), [
    (sc(), None),
    (sc(seccomp=pb.SecurityProfile(profile_type=RD)), api.SecurityProfile.RUNTIME_DEFAULT),
    (sc(seccomp=pb.SecurityProfile(profile_type=UNCONFINED)), api.SecurityProfile.UNCONFINED),
    (sc(seccomp=pb.SecurityProfile(profile_type=LOCALHOST, localhost_ref="/p")),
     api.SecurityProfile.LOCALHOST),
    (sc(seccomp_profile_path="runtime/default"), api.SecurityProfile.RUNTIME_DEFAULT),
    (sc(seccomp_profile_path="localhost//p"), api.SecurityProfile.LOCALHOST),
    (sc(privileged=True, seccomp=pb.SecurityProfile(profile_type=RD)),
     api.SecurityProfile.UNCONFINED),
])
def test_nri_profile_type(s: pb.LinuxContainerSecurityContext, want: int | None) -> None:
    linux = api.LinuxContainer()
    _set_seccomp_profile(linux, s)
    if want is None:
        assert not linux.HasField("seccomp_profile")
    else:
        assert linux.seccomp_profile.profile_type == want


# ---- AppArmor and SELinux -----------------------------------------------------------------

NO_LSM = HostSecurity(seccomp=True, apparmor=False, selinux=False)


@pytest.mark.parametrize("s", [
    sc(apparmor=pb.SecurityProfile(profile_type=RD)),
    sc(apparmor=pb.SecurityProfile(profile_type=LOCALHOST, localhost_ref="mine")),
    sc(apparmor_profile="runtime/default"),
    sc(apparmor_profile="localhost/mine"),
])
def test_apparmor_refused_without_apparmor(s: pb.LinuxContainerSecurityContext) -> None:
    with pytest.raises(InvalidArgument, match="AppArmor is not enabled on this host"):
        ctr(s, host_security=NO_LSM)


@pytest.mark.parametrize("s", [sc(), sc(apparmor=pb.SecurityProfile(profile_type=UNCONFINED)),
                               sc(apparmor_profile="unconfined")])
def test_apparmor_absent_or_unconfined_fine(s: pb.LinuxContainerSecurityContext) -> None:
    assert "apparmorProfile" not in ctr(s, host_security=NO_LSM)["process"]


def test_apparmor_on_a_host_with_it(tmp_path: Path) -> None:
    listing = tmp_path / "profiles"
    listing.write_text("mine (enforce)\nother (complain)\n")
    host = HostSecurity(seccomp=True, apparmor=True, selinux=False,
                        apparmor_profiles=str(listing))
    loc = sc(apparmor=pb.SecurityProfile(profile_type=LOCALHOST, localhost_ref="localhost/mine"))
    assert apparmor_name(loc, privileged=False, host=host) == "mine"
    assert ctr(loc, host_security=host)["process"]["apparmorProfile"] == "mine"
    missing = sc(apparmor=pb.SecurityProfile(profile_type=LOCALHOST, localhost_ref="gone"))
    with pytest.raises(InvalidArgument, match="'gone' is not loaded"):
        apparmor_name(missing, privileged=False, host=host)
    rd = sc(apparmor=pb.SecurityProfile(profile_type=RD))
    with pytest.raises(InvalidArgument, match=APPARMOR_DEFAULT_PROFILE):
        apparmor_name(rd, privileged=False, host=host)
    assert apparmor_name(rd, privileged=True, host=host) is None
    assert apparmor_name(sc(), privileged=False, host=host) is None
    listing.write_text(f"{APPARMOR_DEFAULT_PROFILE} (enforce)\n")
    assert apparmor_name(rd, privileged=False, host=host) == APPARMOR_DEFAULT_PROFILE
    assert apparmor_name(sc(), privileged=False, host=host) == APPARMOR_DEFAULT_PROFILE


def test_selinux_options_accepted_and_ignored() -> None:
    s = sc(selinux_options=pb.SELinuxOption(user="u", role="r", type="t", level="s0"))
    spec = ctr(s, host_security=NO_LSM)
    assert "selinuxLabel" not in spec["process"] and "mountLabel" not in spec["linux"]


def test_this_host() -> None:
    """The test machine: seccomp yes, no AppArmor, no SELinux; root without SYS_RESOURCE."""
    facts = read_facts((1, 1, 5), ALL_CAPABILITIES)
    h = facts.security
    assert h.seccomp is True
    assert h.apparmor is Path("/sys/kernel/security/apparmor/profiles").exists()
    assert h.selinux is Path("/sys/fs/selinux/enforce").exists()
    caps = facts.capabilities
    assert "CAP_SYS_ADMIN" in caps and "CAP_CHOWN" in caps


def test_own_capabilities_from_mask() -> None:
    status = "Name:\tx\nCapEff:\t0000000000200001\n"
    assert own_capabilities(status, ALL_CAPABILITIES) == ("CAP_CHOWN", "CAP_SYS_ADMIN")


# ---- sysctls (§1.7, kubelet's namespaced list) ------------------------------------------------

@pytest.mark.parametrize(("raw", "norm"), [
    ("net.ipv4.ip_forward", "net.ipv4.ip_forward"),
    ("net/ipv4/ip_forward", "net.ipv4.ip_forward"),
    ("net/ipv4/conf/eth0.100/rp_filter", "net.ipv4.conf.eth0/100.rp_filter"),
    ("net.ipv4.conf.eth0/100.rp_filter", "net.ipv4.conf.eth0/100.rp_filter"),
    ("kernel.shmmax", "kernel.shmmax"),
])
def test_normalize_sysctl(raw: str, norm: str) -> None:
    assert normalize_sysctl(raw) == norm


def test_sysctls_accepted_and_normalised() -> None:
    got = validate_sysctls({"net/ipv4/ip_local_port_range": "1024 65000", "kernel.shmmax": "1",
                            "fs.mqueue.msg_max": "20", "kernel.sem": "1 2 3 4"},
                           pb.NamespaceOption())
    assert got == {"net.ipv4.ip_local_port_range": "1024 65000", "kernel.shmmax": "1",
                   "fs.mqueue.msg_max": "20", "kernel.sem": "1 2 3 4"}


@pytest.mark.parametrize(("sysctl", "opts", "match"), [
    ("kernel.shmmax", {"ipc": pb.NODE}, "IPC namespace: not allowed with host IPC"),
    ("fs.mqueue.msg_max", {"ipc": pb.NODE}, "host IPC"),
    ("net.core.somaxconn", {"network": pb.NODE}, "not allowed with host network"),
    ("kernel.panic", {}, "'kernel.panic' is not namespaced"),
    ("vm.swappiness", {}, "is not namespaced"),
    ("kernel.hostname", {}, "is not namespaced"),
    ("fs.file-max", {}, "is not namespaced"),
])
def test_sysctls_refused(sysctl: str, opts: dict[str, int], match: str) -> None:
    with pytest.raises(InvalidArgument, match=match):
        validate_sysctls({sysctl: "1"}, pb.NamespaceOption(**opts))
    with pytest.raises(InvalidArgument, match=match):
        validate_pod(pod(sysctls={sysctl: "1"}, **opts))


def test_ipc_sysctl_fine_with_host_network() -> None:
    validate_pod(pod(sysctls={"kernel.shmmax": "1"}, network=pb.NODE))
    validate_pod(pod(sysctls={"net.core.somaxconn": "1"}, ipc=pb.NODE))


def test_sandbox_spec_carries_normalised_sysctls() -> None:
    cfg = pod(sysctls={"net/ipv4/ip_unprivileged_port_start": "1024", "kernel.shmmax": "4096"})
    spec = pause_spec(cfg)
    assert spec["linux"]["sysctl"]["net.ipv4.ip_unprivileged_port_start"] == "1024"
    assert spec["linux"]["sysctl"]["kernel.shmmax"] == "4096"
    assert "net/ipv4/ip_unprivileged_port_start" not in spec["linux"]["sysctl"]
    # containerd does not copy pod sysctls into app containers: they share the namespaces
    assert "sysctl" not in ctr(sandbox=cfg)["linux"]
