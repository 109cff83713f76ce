"""Runtime handlers end to end: a second runc handler with its own root, base spec and
annotation pass-through, chosen per pod by RunPodSandbox's runtime_handler."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from cri_api.v1 import api_pb2 as pb

from pycrid.oci.defaults import default_spec
from tests.support.daemon import Daemon, running_daemon, serve_command
from tests.support.images import TestImages
from tests.support.pods import Pods, busybox_daemon, container_config, daemon_config, pod_config
from tests.support.registry import LocalRegistry

pytestmark = pytest.mark.e2e

#: Lower than any hard limit the test host has, so runc may set it without
#: CAP_SYS_RESOURCE.
NOFILE = 2048


def _handler_config(base: Path) -> str:
    spec = default_spec()
    spec["process"]["rlimits"] = [{"type": "RLIMIT_NOFILE", "hard": NOFILE, "soft": NOFILE}]
    (base / "base-spec.json").write_text(json.dumps(spec))
    return (
        '[plugins."pycrid.cri.v1.runtime".runtimes.alt]\n'
        f'base_runtime_spec = "{base / "base-spec.json"}"\n'
        'pod_annotations = ["example.com/*"]\n'
        'container_annotations = ["ctr.example.com/*"]\n'
        'privileged_without_host_devices = true\n'
        '[plugins."pycrid.cri.v1.runtime".runtimes.alt.options]\n'
        f'Root = "{base / "alt-root"}"\n'
    )


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("handlers")


@pytest.fixture(scope="module")
def config_text(base: Path, registry: LocalRegistry, test_images: TestImages) -> str:
    return daemon_config(registry, test_images, base) + _handler_config(base)


@pytest.fixture(scope="module")
def daemon(base: Path, config_text: str, registry: LocalRegistry,
           test_images: TestImages) -> Iterator[Daemon]:
    with busybox_daemon(base, registry, test_images, config_text) as d:
        yield d


def _runc_ids(root: str) -> set[str]:
    out = subprocess.run(["runc", f"--root={root}", "list", "--format", "json"],
                         capture_output=True, text=True, check=True).stdout
    return {c["id"] for c in json.loads(out or "null") or []}


def _pod(handler_annotations: bool = True) -> pb.PodSandboxConfig:
    return pod_config(annotations={"example.com/team": "blue", "other.org/x": "no"}
                      if handler_annotations else {})


def _sleeper(image: str) -> pb.ContainerConfig:
    return container_config(image, "sleeper", command=["sleep", "3600"],
                            annotations={"ctr.example.com/role": "worker", "ignored": "1"})


def test_status_lists_handlers_with_features(daemon: Daemon) -> None:
    resp = daemon.client.runtime.Status(pb.StatusRequest(), timeout=10)
    handlers = {h.name: h.features for h in resp.runtime_handlers}
    # runsc (gVisor) is offered too where it is installed: tests/e2e/test_runsc.py.
    handlers.pop("runsc", None)
    assert set(handlers) == {"", "alt", "runc"}
    features = json.loads(subprocess.run(["runc", "features"], capture_output=True,
                                         text=True, check=True).stdout)
    rro = "rro" in features.get("mountOptions", [])
    for feat in handlers.values():
        # runc 1.1 offers rro (the kernel has mount_setattr) but no idmapped mounts.
        assert feat.recursive_read_only_mounts == rro
        assert feat.user_namespaces is False
    assert resp.features.supplemental_groups_policy is True


def test_pod_runs_under_its_handler(daemon: Daemon, base: Path) -> None:
    pods = Pods(daemon.client)
    try:
        alt_pod, plain_pod = _pod(), _pod()
        alt = pods.run(alt_pod, "alt")
        plain = pods.run(plain_pod)
        cid_alt = pods.run_container(alt, _sleeper(daemon.extra["busybox"]), alt_pod)
        cid_plain = pods.run_container(plain, _sleeper(daemon.extra["busybox"]), plain_pod)

        alt_ids = _runc_ids(str(base / "alt-root"))
        default_ids = _runc_ids(os.path.join(daemon.state, "runc"))
        assert {alt, cid_alt} <= alt_ids and not {alt, cid_alt} & default_ids
        assert {plain, cid_plain} <= default_ids and not {plain, cid_plain} & alt_ids
        assert pods.pod_status(alt).status.runtime_handler == "alt"

        # The handler's base spec (its rlimits) reaches the process; the default's does not.
        assert pods.exec(cid_alt, ["sh", "-c", "ulimit -n"]).stdout.strip() == \
            str(NOFILE).encode()
        assert pods.exec(cid_plain, ["sh", "-c", "ulimit -n"]).stdout.strip() != \
            str(NOFILE).encode()
        # Exec and stop go through the right runc root too.
        assert pods.exec(cid_alt, ["echo", "hi"]).stdout == b"hi\n"

        spec = json.loads(pods.status(cid_alt, verbose=True).info["info"])["runtimeSpec"]
        ann = spec["annotations"]
        assert ann["example.com/team"] == "blue" and ann["ctr.example.com/role"] == "worker"
        assert "other.org/x" not in ann and "ignored" not in ann
        plain_spec = json.loads(pods.status(cid_plain, verbose=True).info["info"])
        assert "example.com/team" not in plain_spec["runtimeSpec"]["annotations"]
        pause_spec = json.loads(pods.pod_status(alt, verbose=True).info["info"])["runtimeSpec"]
        assert pause_spec["annotations"]["example.com/team"] == "blue"
        assert pause_spec["process"]["rlimits"][0]["soft"] == NOFILE

        pods.stop(cid_alt)
        assert pods.status(cid_alt).status.state == pb.CONTAINER_EXITED
    finally:
        pods.cleanup()
    assert not _runc_ids(str(base / "alt-root"))


def test_privileged_without_host_devices(daemon: Daemon) -> None:
    """Privileged containers see the host's /dev, except under a handler that says no."""
    pods = Pods(daemon.client)
    try:
        seen = {}
        for handler in ("", "alt"):
            pod = pod_config(linux=pb.LinuxPodSandboxConfig(
                security_context=pb.LinuxSandboxSecurityContext(privileged=True)))
            sid = pods.run(pod, handler)
            cfg = _sleeper(daemon.extra["busybox"])
            cfg.linux.security_context.privileged = True
            cid = pods.run_container(sid, cfg, pod)
            seen[handler] = set(pods.exec(cid, ["ls", "/dev"]).stdout.decode().split())
        assert "kmsg" in seen[""] and "kmsg" not in seen["alt"]
        assert {"null", "zero", "tty"} <= seen["alt"]
    finally:
        pods.cleanup()


def test_unknown_handler_is_refused(daemon: Daemon) -> None:
    with pytest.raises(grpc.RpcError) as err:
        daemon.client.runtime.RunPodSandbox(
            pb.RunPodSandboxRequest(config=_pod(), runtime_handler="kata"), timeout=30)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "kata" in str(err.value.details()) and "alt" in str(err.value.details())
    assert not daemon.client.runtime.ListPodSandbox(pb.ListPodSandboxRequest(),
                                                    timeout=10).items


def test_idmapped_mount_is_refused_without_runc_support(daemon: Daemon, tmp_path: Path) -> None:
    """runc 1.1 would silently ignore a mount's id mapping; the create is refused instead."""
    pods = Pods(daemon.client)
    try:
        pod = _pod()
        sid = pods.run(pod)
        cfg = _sleeper(daemon.extra["busybox"])
        cfg.mounts.append(pb.Mount(container_path="/data", host_path=str(tmp_path),
                                   uidMappings=[pb.IDMapping(host_id=1000, container_id=0,
                                                             length=1)]))
        with pytest.raises(grpc.RpcError) as err:
            pods.create(sid, cfg, pod)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "idmapped mount" in str(err.value.details())
        assert not daemon.client.runtime.ListContainers(pb.ListContainersRequest(),
                                                        timeout=10).containers
    finally:
        pods.cleanup()


def test_recursive_read_only_mount(daemon: Daemon, tmp_path: Path) -> None:
    """With the handler's rro feature a submount of a read-only bind is read-only too;
    a plain read-only bind leaves it writable."""
    sub = tmp_path / "sub"
    sub.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(sub)], check=True)
    pods = Pods(daemon.client)
    try:
        pod = _pod()
        sid = pods.run(pod)
        cfg = _sleeper(daemon.extra["busybox"])
        cfg.mounts.extend([
            pb.Mount(container_path="/rro", host_path=str(tmp_path), readonly=True,
                     recursive_read_only=True, propagation=pb.PROPAGATION_PRIVATE),
            pb.Mount(container_path="/ro", host_path=str(tmp_path), readonly=True)])
        cid = pods.run_container(sid, cfg, pod)
        assert pods.exec(cid, ["touch", "/ro/sub/x"]).exit_code == 0
        denied = pods.exec(cid, ["touch", "/rro/sub/y"])
        assert denied.exit_code != 0 and b"Read-only file system" in denied.stderr
        assert pods.exec(cid, ["touch", "/rro/z"]).exit_code != 0
    finally:
        pods.cleanup()
        subprocess.run(["umount", str(sub)], check=True)


@pytest.mark.parametrize(("spec_text", "why"), [
    (None, "cannot read"), ("{not json", "not valid JSON"), ('{"ociVersion": "1"}', "OCI")])
def test_bad_base_spec_stops_startup_naming_the_key(tmp_path: Path, spec_text: str | None,
                                                    why: str) -> None:
    spec = tmp_path / "spec.json"
    if spec_text is not None:
        spec.write_text(spec_text)
    config = tmp_path / "config.toml"
    config.write_text('version = 2\n[plugins."pycrid.cri.v1.runtime".runtimes.alt]\n'
                      f'base_runtime_spec = "{spec}"\n')
    proc = subprocess.run(
        serve_command(str(config), str(tmp_path / "r"), str(tmp_path / "s"),
                      str(tmp_path / "s" / "x.sock")),
        capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert 'plugins."pycrid.cri.v1.runtime".runtimes.alt.base_runtime_spec' in proc.stderr
    assert why in proc.stderr


def test_handler_pods_survive_a_restart(base: Path, config_text: str, daemon: Daemon,
                                        registry: LocalRegistry,
                                        test_images: TestImages) -> None:
    """Last in the file: it stops the module's daemon. After a restart the router
    learns from the alt root's ``runc list`` which runc owns the pod, so stop and
    removal reach it."""
    pods = Pods(daemon.client)
    pod = _pod()
    sid = pods.run(pod, "alt")
    cid = pods.run_container(sid, _sleeper(daemon.extra["busybox"]), pod)
    daemon.stop()
    with running_daemon(str(base), config_text) as again:
        pods = Pods(again.client)
        assert pods.status(cid).status.state == pb.CONTAINER_RUNNING
        assert pods.exec(cid, ["echo", "back"]).stdout == b"back\n"
        pods.remove_pod(sid)
        assert not _runc_ids(str(base / "alt-root"))
