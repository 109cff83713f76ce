"""Seccomp for CRI containers: which profile a request asks for, and pycrid's own
RuntimeDefault profile (CRI-TO-OCI.md §2.12).

The RuntimeDefault profile is written here from the facts of the Moby-derived
allow-list containerd ships (which syscalls are safe for any workload, which ones a
capability unlocks): deny by default with EPERM, allow the everyday set, widen it
for the capabilities left in the container's *final* bounding set. runc skips
syscall names its libseccomp does not know, so names of newer kernels are harmless.
"""

from __future__ import annotations

import json
import os
import platform
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from cri_api.v1 import api_pb2 as pb

from pycrid.errors import InvalidArgument

Spec = dict[str, Any]
Kind = Literal["RuntimeDefault", "Unconfined", "Localhost"]

LOCALHOST_PREFIX = "localhost/"
EPERM = 1
ENOSYS = 38

# Address families refused to socket(2): AF_ALG (kernel crypto) and AF_VSOCK (host
# sockets). Between them lies AF_NFC (39), which stays allowed.
AF_ALG = 38
AF_VSOCK = 40

# clone(2) flags that create namespaces; without CAP_SYS_ADMIN none may be set.
CLONE_NEWNS = 0x00020000
CLONE_NEWCGROUP = 0x02000000
CLONE_NEWUTS = 0x04000000
CLONE_NEWIPC = 0x08000000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000
NAMESPACE_FLAGS = (CLONE_NEWNS | CLONE_NEWCGROUP | CLONE_NEWUTS | CLONE_NEWIPC
                   | CLONE_NEWUSER | CLONE_NEWPID | CLONE_NEWNET)

# personality(2) values a program may switch to: PER_LINUX, PER_LINUX32 (0x8),
# UNAME26 (0x20000), both (0x20008), and 0xffffffff which only queries.
PERSONALITIES = (0x0, 0x8, 0x20000, 0x20008, 0xFFFFFFFF)

# libseccomp architecture names per host machine: the native ABI plus the compat
# ones a binary of that machine may call through.
ARCHITECTURES: dict[str, tuple[str, ...]] = {
    "x86_64": ("SCMP_ARCH_X86_64", "SCMP_ARCH_X86", "SCMP_ARCH_X32"),
    "aarch64": ("SCMP_ARCH_AARCH64", "SCMP_ARCH_ARM"),
}

# Per-machine extras on top of the common allow-list.
MACHINE_SYSCALLS: dict[str, tuple[str, ...]] = {
    "x86_64": ("arch_prctl", "modify_ldt"),
    "aarch64": ("arm_fadvise64_64", "arm_sync_file_range", "breakpoint", "cacheflush",
                "set_tls", "sync_file_range2"),
}


def _words(text: str) -> frozenset[str]:
    return frozenset(text.split())


# The common allow-list, grouped by what the calls are for. Time-suffixed and
# 32-suffixed names are the 32-bit ABI variants of the same calls.
ALLOWED: frozenset[str] = frozenset().union(
    # files and directories
    _words("""access chdir chmod chown chown32 close close_range copy_file_range creat
        dup dup2 dup3 faccessat faccessat2 fadvise64 fadvise64_64 fallocate fchdir fchmod
        fchmodat fchmodat2 fchown fchown32 fchownat fcntl fcntl64 fdatasync flock fstat
        fstat64 fstatat64 fstatfs fstatfs64 fsync ftruncate ftruncate64 futimesat getcwd
        getdents getdents64 lchown lchown32 link linkat _llseek lseek lstat lstat64 mkdir
        mkdirat mknod mknodat name_to_handle_at newfstatat open openat openat2 pread64
        preadv preadv2 pwrite64 pwritev pwritev2 read readahead readlink readlinkat readv
        rename renameat renameat2 rmdir sendfile sendfile64 splice stat stat64 statfs
        statfs64 statx symlink symlinkat sync sync_file_range syncfs tee truncate truncate64
        umask unlink unlinkat utime utimensat utimensat_time64 utimes vmsplice write writev
        cachestat listmount statmount"""),
    # extended attributes
    _words("""fgetxattr flistxattr fremovexattr fsetxattr getxattr getxattrat lgetxattr
        listxattr listxattrat llistxattr lremovexattr lsetxattr removexattr removexattrat
        setxattr setxattrat"""),
    # waiting for events
    _words("""epoll_create epoll_create1 epoll_ctl epoll_ctl_old epoll_pwait epoll_pwait2
        epoll_wait epoll_wait_old eventfd eventfd2 fanotify_mark inotify_add_watch
        inotify_init inotify_init1 inotify_rm_watch _newselect poll ppoll ppoll_time64
        pselect6 pselect6_time64 select signalfd signalfd4 timerfd_create timerfd_gettime
        timerfd_gettime64 timerfd_settime timerfd_settime64"""),
    # asynchronous and vectored io
    _words("""io_cancel io_destroy io_getevents io_pgetevents io_pgetevents_time64
        io_setup io_submit ioctl ioprio_get ioprio_set"""),
    # memory
    _words("""brk madvise map_shadow_stack membarrier memfd_create memfd_secret mincore
        mlock mlock2 mlockall mmap mmap2 mprotect mremap mseal msync munlock munlockall
        munmap pkey_alloc pkey_free pkey_mprotect remap_file_pages"""),
    # processes, threads, signals, identity
    _words("""capget capset execve execveat exit exit_group fork getcpu getegid getegid32
        geteuid geteuid32 getgid getgid32 getgroups getgroups32 getpgid getpgrp getpid
        getppid getpriority getresgid getresgid32 getresuid getresuid32 getrlimit
        get_robust_list getrusage getsid gettid getuid getuid32 get_thread_area kill
        pause pidfd_open pidfd_send_signal prctl prlimit64 process_mrelease
        restart_syscall rseq rt_sigaction rt_sigpending rt_sigprocmask rt_sigqueueinfo
        rt_sigreturn rt_sigsuspend rt_sigtimedwait rt_sigtimedwait_time64
        rt_tgsigqueueinfo seccomp setfsgid setfsgid32 setfsuid setfsuid32 setgid setgid32
        setgroups setgroups32 setpgid setpriority setregid setregid32 setresgid
        setresgid32 setresuid setresuid32 setreuid setreuid32 setrlimit set_robust_list
        setsid set_thread_area set_tid_address setuid setuid32 sigaltstack sigprocmask
        sigreturn tgkill tkill ugetrlimit vfork wait4 waitid waitpid uretprobe"""),
    # scheduling
    _words("""sched_getaffinity sched_getattr sched_getparam sched_get_priority_max
        sched_get_priority_min sched_getscheduler sched_rr_get_interval
        sched_rr_get_interval_time64 sched_setaffinity sched_setattr sched_setparam
        sched_setscheduler sched_yield"""),
    # futexes
    _words("futex futex_requeue futex_time64 futex_wait futex_waitv futex_wake"),
    # clocks and timers (reading them; setting them needs CAP_SYS_TIME)
    _words("""adjtimex alarm clock_adjtime clock_adjtime64 clock_getres
        clock_getres_time64 clock_gettime clock_gettime64 clock_nanosleep
        clock_nanosleep_time64 getitimer gettimeofday nanosleep setitimer time
        timer_create timer_delete timer_getoverrun timer_gettime timer_gettime64
        timer_settime timer_settime64 times"""),
    # System V and POSIX ipc (in the pod's ipc namespace)
    _words("""ipc mq_getsetattr mq_notify mq_open mq_timedreceive mq_timedreceive_time64
        mq_timedsend mq_timedsend_time64 mq_unlink msgctl msgget msgrcv msgsnd semctl
        semget semop semtimedop semtimedop_time64 shmat shmctl shmdt shmget"""),
    # sockets (socket(2) itself is filtered by address family below)
    _words("""accept accept4 bind connect getpeername getsockname getsockopt listen recv
        recvfrom recvmmsg recvmmsg_time64 recvmsg send sendmmsg sendmsg sendto setsockopt
        shutdown socketcall socketpair pipe pipe2"""),
    # the rest: system information, randomness, sandboxing a process further
    _words("""getrandom landlock_add_rule landlock_create_ruleset landlock_restrict_self
        lsm_get_self_attr lsm_list_modules lsm_set_self_attr sysinfo uname"""),
)

# Syscalls a capability in the final bounding set unlocks.
BY_CAPABILITY: dict[str, tuple[str, ...]] = {
    "CAP_DAC_READ_SEARCH": ("open_by_handle_at",),
    "CAP_SYS_ADMIN": ("bpf", "clone", "clone3", "fanotify_init", "fsconfig", "fsmount",
                      "fsopen", "fspick", "lookup_dcookie", "mount", "mount_setattr",
                      "move_mount", "open_tree", "perf_event_open", "quotactl",
                      "quotactl_fd", "setdomainname", "sethostname", "setns", "syslog",
                      "umount", "umount2", "unshare"),
    "CAP_SYS_BOOT": ("reboot",),
    "CAP_SYS_CHROOT": ("chroot",),
    "CAP_SYS_MODULE": ("delete_module", "finit_module", "init_module"),
    "CAP_SYS_PACCT": ("acct",),
    "CAP_SYS_PTRACE": ("kcmp", "pidfd_getfd", "process_madvise", "process_vm_readv",
                       "process_vm_writev", "ptrace"),
    "CAP_SYS_RAWIO": ("ioperm", "iopl"),
    "CAP_SYS_TIME": ("clock_settime", "clock_settime64", "settimeofday", "stime"),
    "CAP_SYS_TTY_CONFIG": ("vhangup",),
    "CAP_SYS_NICE": ("get_mempolicy", "mbind", "set_mempolicy", "set_mempolicy_home_node"),
    "CAP_SYSLOG": ("syslog",),
    "CAP_BPF": ("bpf",),
    "CAP_PERFMON": ("perf_event_open",),
}

# Allowed to everyone on kernels >= 4.8, where ptrace can no longer be used to
# step around a seccomp filter.
PTRACE_SYSCALLS = ("process_vm_readv", "process_vm_writev", "ptrace")


# ---- which profile ----------------------------------------------------------------------

@dataclass(frozen=True)
class Profile:
    """A seccomp (or AppArmor) profile choice: its kind and, for Localhost, the ref."""

    kind: Kind
    ref: str = ""


_KINDS: dict[int, Kind] = {
    pb.SecurityProfile.RuntimeDefault: "RuntimeDefault",
    pb.SecurityProfile.Unconfined: "Unconfined",
    pb.SecurityProfile.Localhost: "Localhost",
}


def from_cri(sp: pb.SecurityProfile, what: str = "seccomp") -> Profile:
    """A CRI SecurityProfile; a localhost_ref on another kind is an error (containerd)."""
    kind = _KINDS.get(sp.profile_type)
    if kind is None:
        raise InvalidArgument(f"{what} profile type {sp.profile_type} is unknown")
    if kind != "Localhost" and sp.localhost_ref:
        raise InvalidArgument(f"{what} profile: localhost_ref {sp.localhost_ref!r} "
                              f"is only valid with type Localhost")
    return Profile(kind, sp.localhost_ref)


def parse_profile_string(value: str, what: str = "seccomp") -> Profile:
    """The deprecated string forms (and ``unset_seccomp_profile``)."""
    if value in ("", "runtime/default", "docker/default"):
        return Profile("RuntimeDefault")
    if value == "unconfined":
        return Profile("Unconfined")
    if value.startswith(LOCALHOST_PREFIX):
        return Profile("Localhost", value[len(LOCALHOST_PREFIX):])
    raise InvalidArgument(f"invalid {what} profile {value!r}: want runtime/default, "
                          f"docker/default, unconfined or localhost/<path>")


def requested(sc: Any, unset_profile: str = "") -> Profile | None:
    """§2.12's order: ``seccomp`` field, else ``seccomp_profile_path``, else the
    config's ``unset_seccomp_profile``, else None (no filter)."""
    if sc.HasField("seccomp"):
        return from_cri(sc.seccomp)
    if sc.seccomp_profile_path:
        return parse_profile_string(sc.seccomp_profile_path)
    if unset_profile:
        return parse_profile_string(unset_profile)
    return None


def linux_seccomp(profile: Profile | None, *, privileged: bool, bounding: Sequence[str],
                  supported: bool = True, machine: str | None = None,
                  kernel: tuple[int, int] | None = None) -> Spec | None:
    """The ``linux.seccomp`` object for ``profile``, or None for no filter."""
    if privileged:
        return None
    if not supported:
        if profile is not None and profile.kind != "Unconfined":
            raise InvalidArgument("seccomp is not supported by this host's kernel")
        return None
    if profile is None or profile.kind == "Unconfined":
        return None
    if profile.kind == "Localhost":
        return load_localhost(profile.ref)
    return runtime_default(bounding, machine=machine, kernel=kernel)


def load_localhost(ref: str) -> Spec:
    """A Localhost profile: the JSON file at ``ref`` (``localhost/`` stripped), verbatim."""
    path = ref[len(LOCALHOST_PREFIX):] if ref.startswith(LOCALHOST_PREFIX) else ref
    if not path:
        raise InvalidArgument("seccomp profile type Localhost needs a localhost_ref path")
    try:
        with open(path, "rb") as f:
            data = json.loads(f.read())
    except OSError as e:
        raise InvalidArgument(f"cannot read seccomp profile {path!r}: "
                              f"{e.strerror or e}") from None
    except ValueError as e:
        raise InvalidArgument(f"seccomp profile {path!r} is not valid JSON: {e}") from None
    if not isinstance(data, dict):
        raise InvalidArgument(f"seccomp profile {path!r} is not a JSON object")
    return data


# ---- the RuntimeDefault profile ---------------------------------------------------------

def _kernel() -> tuple[int, int]:
    parts = os.uname().release.split(".")
    try:
        return int(parts[0]), int("".join(c for c in parts[1] if c.isdigit()) or 0)
    except (IndexError, ValueError):
        return (0, 0)


def _allow(names: Iterable[str], *args: Spec) -> Spec:
    rule: Spec = {"names": sorted(set(names)), "action": "SCMP_ACT_ALLOW"}
    if args:
        rule["args"] = list(args)
    return rule


def _arg(index: int, op: str, value: int, value_two: int = 0) -> Spec:
    out: Spec = {"index": index, "value": value, "op": op}
    if op == "SCMP_CMP_MASKED_EQ":
        out["valueTwo"] = value_two
    return out


def runtime_default(bounding: Sequence[str], *, machine: str | None = None,
                    kernel: tuple[int, int] | None = None) -> Spec:
    """pycrid's RuntimeDefault profile for a container whose final bounding set is
    ``bounding``; ``machine``/``kernel`` default to this host's."""
    machine = machine or platform.machine()
    kernel = kernel or _kernel()
    caps = set(bounding)
    names = set(ALLOWED) | set(MACHINE_SYSCALLS.get(machine, ()))
    if kernel >= (4, 8):
        names.update(PTRACE_SYSCALLS)
    for cap in sorted(caps):
        names.update(BY_CAPABILITY.get(cap, ()))
    rules = [_allow(names)]
    # socket(2): every family but AF_ALG and AF_VSOCK. Three one-condition rules
    # (below, between, above) because runc ORs several conditions on one argument.
    rules += [
        _allow(["socket"], _arg(0, "SCMP_CMP_LT", AF_ALG)),
        _allow(["socket"], _arg(0, "SCMP_CMP_EQ", AF_ALG + 1)),
        _allow(["socket"], _arg(0, "SCMP_CMP_GT", AF_VSOCK)),
    ]
    rules += [_allow(["personality"], _arg(0, "SCMP_CMP_EQ", v)) for v in PERSONALITIES]
    if "CAP_SYS_ADMIN" not in caps:
        # Plain clone (threads, fork) without namespace flags; clone3 hides its flags
        # in memory seccomp cannot read, so it answers ENOSYS and libc falls back.
        rules.append(_allow(["clone"], _arg(0, "SCMP_CMP_MASKED_EQ", NAMESPACE_FLAGS, 0)))
        rules.append({"names": ["clone3"], "action": "SCMP_ACT_ERRNO", "errnoRet": ENOSYS})
    return {
        "defaultAction": "SCMP_ACT_ERRNO",
        "defaultErrnoRet": EPERM,
        "architectures": list(ARCHITECTURES.get(machine, ())),
        "syscalls": rules,
    }
