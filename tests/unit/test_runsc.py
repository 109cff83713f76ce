"""gVisor (runsc) as a handler, without running it: its config, the specs of its
containers, the NRI fields it refuses, its stats, and the monitor conmon runs for a
sub-container (driven with a stand-in runsc)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import stat
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cri_api.v1 import api_pb2 as pb

from pycrid.config.decode import ConfigError
from pycrid.config.schema import (
    RUNSC_TYPE,
    RuntimeConfig,
    RuntimeHandlerConfig,
    RuntimeHandlerOptions,
)
from pycrid.errors import FailedPrecondition, InvalidArgument
from pycrid.nri import api
from pycrid.oci.defaults import ALL_CAPABILITIES
from pycrid.oci.nri_sandboxed import refuse_unhonoured
from pycrid.runtime import runsc_monitor
from pycrid.runtime.handlers import load_handlers
from pycrid.runtime.monitors import read_pid_file
from pycrid.runtime.runsc_config import known_capabilities, load, release_date
from pycrid.stats.cgroup_stats import CgroupStats
from pycrid.stats.sampler import _overlay
from tests.unit.test_oci_spec import cc, ctr, mount, pod, sc

RUNSC = "/usr/bin/runsc"
needs_runsc = pytest.mark.skipif(not os.access(RUNSC, os.X_OK),
                                 reason="runsc (gVisor) is not installed: apt-get install runsc")


# ---- config ----------------------------------------------------------------------------------

def _toml(tmp_path: Path, text: str) -> str:
    path = tmp_path / "runsc.toml"
    path.write_text(text)
    return str(path)


@needs_runsc
def test_runsc_toml_flags_binary_and_root(tmp_path: Path) -> None:
    path = _toml(tmp_path, f'binary_name = "{RUNSC}"\nroot = "/run/g"\nlog_level = "debug"\n'
                           '[runsc_config]\nplatform = "ptrace"\ndebug = true\n'
                           'debug-log = "/var/log/runsc/%ID%/"\nnetwork = "sandbox"\n')
    got = load("rt", binary="", root="", config_path=path, default_root="/run/p/runsc")
    assert (got.binary, got.root) == (RUNSC, "/run/g")
    # The file's network wins over pycrid's default; oci-seccomp stays on; %ID% is the pod.
    assert got.args("pod1") == ["--debug=true", "--debug-log=/var/log/runsc/pod1/",
                                "--network=sandbox", "--oci-seccomp=true",
                                "--platform=ptrace"]
    # The handler's own options win over the file's.
    got = load("rt", binary=RUNSC, root="/run/h", config_path=path, default_root="/x")
    assert got.root == "/run/h"


@needs_runsc
def test_defaults_without_a_config_file() -> None:
    got = load("rt", binary="", root="", config_path="", default_root="/run/p/runsc")
    assert got.root == "/run/p/runsc" and os.path.basename(got.binary) == "runsc"
    assert got.args("x") == ["--network=host", "--oci-seccomp=true"]


@pytest.mark.parametrize(("text", "key"), [
    ('[runsc_config]\n"--platform" = "kvm"\n', "runsc_config.--platform"),
    ('[runsc_config]\nroot = "/x"\n', "runsc_config.root"),
    ('[runsc_config]\nsystemd-cgroup = "true"\n', "runsc_config.systemd-cgroup"),
    ('[runsc_config]\nplatform = ["kvm"]\n', "runsc_config.platform"),
    ('runsc_config = "platform=kvm"\n', "runsc_config"),
    ('root = "relative"\n', "root"),
    ('binary_name = "/nonexistent/runsc"\n', "binary_name"),
    ('[runsc_config\n', "ConfigPath"),
])
def test_bad_runsc_toml_names_the_key(tmp_path: Path, text: str, key: str) -> None:
    path = _toml(tmp_path, text)
    with pytest.raises(ConfigError) as e:
        load("rt", binary="", root="", config_path=path, default_root="/x")
    assert e.value.key.endswith(key), e.value.key


def test_missing_config_file_names_the_option() -> None:
    with pytest.raises(ConfigError) as e:
        load("rt", binary="", root="", config_path="/nonexistent.toml", default_root="/x")
    assert e.value.key == "rt.options.ConfigPath"


@needs_runsc
def test_runsc_handler_has_its_own_root_and_pause() -> None:
    config = RuntimeConfig(runtimes={
        "runc": RuntimeHandlerConfig(), "runsc": RuntimeHandlerConfig(runtime_type=RUNSC_TYPE),
        "gvisor": RuntimeHandlerConfig(runtime_type=RUNSC_TYPE, options=RuntimeHandlerOptions(
            Root="/run/other"))})
    got = load_handlers(config, "/run/p")
    assert got["runsc"].sandboxed and got["gvisor"].sandboxed and not got["runc"].sandboxed
    assert got["runsc"].runc_root == "/run/p/runsc"
    assert got["gvisor"].runc_root == "/run/other"
    assert got["runsc"].runc_binary == got["runsc"].runsc.binary  # type: ignore[union-attr]


def test_runsc_options_on_a_runc_handler_are_refused() -> None:
    config = RuntimeConfig(runtimes={"runc": RuntimeHandlerConfig(
        options=RuntimeHandlerOptions(ConfigPath="/etc/runsc.toml"))})
    with pytest.raises(ConfigError) as e:
        load_handlers(config, "/run/p")
    assert e.value.key.endswith("runtimes.runc.options.ConfigPath")


def test_release_dates_and_capabilities() -> None:
    assert release_date("0.0~20221219.0") == 20221219
    assert release_date("release-20240729.0") == 20240729
    assert release_date("runsc version unknown") is None
    old = known_capabilities("0.0~20221219.0")
    assert old is not None and "CAP_PERFMON" not in old and "CAP_AUDIT_READ" in old
    assert known_capabilities("release-20240729.0") is None
    assert known_capabilities("") is None


# ---- the specs of its containers ---------------------------------------------------------

OLD_CAPS = frozenset(ALL_CAPABILITIES) - {"CAP_PERFMON", "CAP_BPF", "CAP_CHECKPOINT_RESTORE"}


def _pids(spec: dict[str, object]) -> list[dict[str, str]]:
    return [n for n in spec["linux"]["namespaces"] if n["type"] == "pid"]  # type: ignore[index]


def test_pod_pid_namespace_is_the_sandbox_root_one() -> None:
    shared = cc(sc=sc(namespace_options=pb.NamespaceOption(pid=pb.POD)))
    assert _pids(ctr(shared, sandboxed=True)) == []
    assert _pids(ctr(shared)) == [{"type": "pid", "path": "/proc/42/ns/pid"}]
    own = cc(sc=sc(namespace_options=pb.NamespaceOption(pid=pb.CONTAINER)))
    assert _pids(ctr(own, sandboxed=True)) == [{"type": "pid"}]
    target = cc(sc=sc(namespace_options=pb.NamespaceOption(pid=pb.TARGET, target_id="t")))
    with pytest.raises(InvalidArgument, match="TARGET"):
        ctr(target, sandboxed=True, target_pid=7)


def test_capabilities_stop_at_what_runsc_knows() -> None:
    privileged = pod(privileged=True)
    spec = ctr(cc(sc=sc(privileged=True)), privileged, sandboxed=True,
               handler_capabilities=OLD_CAPS)
    assert "CAP_PERFMON" not in spec["process"]["capabilities"]["bounding"]
    assert "CAP_SYS_ADMIN" in spec["process"]["capabilities"]["bounding"]
    every = ctr(cc(sc=sc(capabilities=pb.Capability(add_capabilities=["ALL"]))),
                handler_capabilities=OLD_CAPS)
    assert set(every["process"]["capabilities"]["effective"]) <= OLD_CAPS
    with pytest.raises(InvalidArgument, match="CAP_PERFMON"):
        ctr(cc(sc=sc(capabilities=pb.Capability(add_capabilities=["PERFMON"]))),
            handler_capabilities=OLD_CAPS)


def test_mounts_under_gvisor() -> None:
    rro = pb.Mount(container_path="/m", host_path="/h", readonly=True,
                   recursive_read_only=True)
    assert mount(ctr(cc(mounts=[rro]), rro_supported=True, sandboxed=True), "/m")[
        "options"] == ["rbind", "rprivate", "ro"]
    shared = pb.Mount(container_path="/s", host_path="/s",
                      propagation=pb.PROPAGATION_BIDIRECTIONAL)
    with pytest.raises(InvalidArgument, match="Bidirectional"):
        ctr(cc(mounts=[shared]), sandboxed=True)


# ---- NRI adjustments it cannot have ----------------------------------------------------------

def _adjust(**linux: Any) -> api.ContainerAdjustment:
    return api.ContainerAdjustment(linux=api.LinuxContainerAdjustment(**linux))


@pytest.mark.parametrize(("adjust", "field"), [
    (_adjust(devices=[api.LinuxDevice(path="/dev/x", type="c", major=1, minor=3)]),
     "linux.devices"),
    (api.ContainerAdjustment(CDI_devices=[api.CDIDevice(name="vendor.com/gpu=0")]),
     "CDI_devices"),
    (_adjust(resources=api.LinuxResources(memory=api.LinuxMemory(
        limit=api.OptionalInt64(value=1 << 20)))), "linux.resources.memory.limit"),
    (_adjust(resources=api.LinuxResources(cpu=api.LinuxCPU(cpus="0"))),
     "linux.resources.cpu.cpus"),
    (_adjust(cgroups_path="/x"), "linux.cgroups_path"),
    (_adjust(namespaces=[api.LinuxNamespace(type="network", path="/x")]), "linux.namespaces"),
    (_adjust(sysctl={"net.core.somaxconn": "1024"}), "linux.sysctl"),
    (_adjust(scheduler=api.LinuxScheduler(policy=api.SCHED_OTHER)), "linux.scheduler"),
    (api.ContainerAdjustment(hooks=api.Hooks(create_container=[api.Hook(path="/bin/true")])),
     "hooks.create_container"),
])
def test_nri_fields_gvisor_would_drop_are_refused(adjust: api.ContainerAdjustment,
                                                  field: str) -> None:
    with pytest.raises(FailedPrecondition, match=re.escape(f"NRI adjustment {field}:")):
        refuse_unhonoured(adjust, seccomp=True)


def test_nri_fields_gvisor_honours_pass() -> None:
    ok = api.ContainerAdjustment(
        annotations={"a": "b"}, env=[api.KeyValue(key="K", value="V")], args=["x"],
        mounts=[api.Mount(destination="/m", source="/h", type="bind", options=["ro"])],
        rlimits=[api.POSIXRlimit(type="RLIMIT_NOFILE", hard=10, soft=10)],
        hooks=api.Hooks(prestart=[api.Hook(path="/bin/true")]),
        linux=api.LinuxContainerAdjustment(
            oom_score_adj=api.OptionalInt(value=5),
            devices=[api.LinuxDevice(path=api.mark_for_removal("/dev/x"))],
            seccomp_policy=api.LinuxSeccomp(default_action="SCMP_ACT_ALLOW")))
    refuse_unhonoured(ok, seccomp=True)
    with pytest.raises(FailedPrecondition, match=r"linux\.seccomp_policy"):
        refuse_unhonoured(ok, seccomp=False)


# ---- stats ----------------------------------------------------------------------------------

def test_runtime_figures_over_the_sandbox_cgroup() -> None:
    sandbox = CgroupStats(cpu_ns=1000, cpu_user_ns=600, cpu_system_ns=400,
                          memory_usage=50 << 20, inactive_file=10 << 20, cache=12 << 20,
                          cfs_periods=7, processes=9, threads=40, fds=30)
    own = CgroupStats(cpu_ns=250, memory_usage=3 << 20, processes=2)
    got = _overlay(sandbox, own)
    assert got is not None
    assert (got.cpu_ns, got.cpu_user_ns, got.cpu_system_ns) == (250, 150, 100)
    assert (got.memory_usage, got.working_set, got.cache) == (3 << 20, 3 << 20, 0)
    assert (got.processes, got.threads, got.cfs_periods, got.fds) == (2, 40, 7, 30)
    assert _overlay(sandbox, None) is None
    assert _overlay(None, own) == own


# ---- the monitor conmon runs for a sub-container ---------------------------------------------

FAKE_RUNSC = """#!/bin/sh
# A stand-in runsc: logs its arguments; create writes a pid; wait prints a status.
echo "$*" >> "$LOG"
for a do last=$a; done
case " $* " in
  *" create "*) prev=; for a do [ "$prev" = --pid-file ] && echo 4242 > "$a"; prev=$a; done ;;
  *" wait "*) printf '{"id":"%s","exitStatus":%s}\\n' "$last" "$STATUS" ;;
esac
"""


def _fake(tmp_path: Path) -> Path:
    fake = tmp_path / "runsc"
    fake.write_text(FAKE_RUNSC)
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    return fake


def _run_monitor(tmp_path: Path, status: str) -> tuple[Path, int]:
    bundle = tmp_path / "bundle dir"  # a space: arguments survive the shell intact
    bundle.mkdir()
    env = {"PATH": "/usr/bin:/bin", "LOG": str(tmp_path / "log"), "STATUS": status}
    # Files, not pipes, for its output: the child it leaves holds them (conmon's pipes).
    with open(tmp_path / "out", "wb") as out:
        done = subprocess.run(
            ["/bin/sh", "-c", runsc_monitor.MONITOR, runsc_monitor.NAME, str(_fake(tmp_path)),
             "--root=/r", "--network=host", "create", "--bundle", str(bundle), "--pid-file",
             str(bundle / "pidfile"), "cid1"], env=env, stdin=subprocess.DEVNULL,
            stdout=out, stderr=out, timeout=30, check=False)
    assert done.returncode == 0, (tmp_path / "out").read_text()
    return bundle, runsc_monitor.monitor_pid(str(bundle))


def _wait_exit(pid: int) -> None:
    # The monitor's child is not ours to wait for: poll /proc until it is gone.
    for _ in range(500):
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                    return
        except FileNotFoundError:
            return
        time.sleep(0.01)
    os.kill(pid, 9)
    raise AssertionError(f"monitor {pid} did not end")


@pytest.fixture
def monitors() -> Iterator[list[int]]:
    """Monitor children a test started: killed afterwards if a failure left them waiting."""
    pids: list[int] = []
    yield pids
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, 9)


def test_monitor_creates_then_waits_for_the_word(tmp_path: Path, monitors: list[int]) -> None:
    bundle, monitor = _run_monitor(tmp_path, "7")
    monitors.append(monitor)
    log = (tmp_path / "log").read_text().splitlines()
    # runsc create got conmon's arguments, its pid file beside conmon's.
    assert log == [f"--root=/r --network=host create --bundle {bundle} --pid-file "
                   f"{bundle}/pidfile.sandbox cid1"]
    assert read_pid_file(runsc_monitor.sandbox_pid_file(str(bundle))) == 4242
    assert monitor > 0 and monitor != 4242 and os.path.exists(f"/proc/{monitor}")
    assert asyncio.run(runsc_monitor.say(str(bundle), "start"))
    _wait_exit(monitor)
    assert (tmp_path / "log").read_text().splitlines()[1] == "--root=/r --network=host wait cid1"
    assert not (bundle / runsc_monitor.GO_FIFO).exists()


def test_monitor_exit_status_is_the_containers(tmp_path: Path) -> None:
    # Run as its parent would (conmon reaps it): the status it exits with.
    bundle = tmp_path / "b"
    bundle.mkdir()
    env = {"PATH": "/usr/bin:/bin", "LOG": str(tmp_path / "log"), "STATUS": "42"}
    script = runsc_monitor.MONITOR.replace('echo "$!" >"$pidfile"',
                                           'echo "$!" >"$pidfile"; wait "$!"')
    proc = subprocess.Popen(
        ["/bin/sh", "-c", script, runsc_monitor.NAME, str(_fake(tmp_path)), "create",
         "--bundle", str(bundle), "--pid-file", str(bundle / "pidfile"), "cid2"],
        env=env, stdin=subprocess.DEVNULL)
    try:
        for _ in range(500):
            if runsc_monitor.monitor_pid(str(bundle)):
                break
            time.sleep(0.01)
        assert asyncio.run(runsc_monitor.say(str(bundle), "start"))
        assert proc.wait(timeout=30) == 42
    finally:
        if proc.poll() is None:
            proc.kill()


def test_say_to_a_gone_monitor_is_false(tmp_path: Path) -> None:
    assert asyncio.run(runsc_monitor.say(str(tmp_path), "start")) is False
