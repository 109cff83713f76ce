"""Run ``pycrid serve`` as a real subprocess on a temporary root and talk CRI to it."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import grpc
from cri_api.v1 import api_pb2 as pb
from cri_api.v1 import api_pb2_grpc as pb_grpc

from tests.support.network import with_private_cni


class CRIClient:
    """A synchronous CRI client over the daemon's real socket."""

    def __init__(self, address: str) -> None:
        self.channel = grpc.insecure_channel(f"unix://{address}")
        self.runtime = pb_grpc.RuntimeServiceStub(self.channel)
        self.images = pb_grpc.ImageServiceStub(self.channel)

    def close(self) -> None:
        self.channel.close()

    def pull(self, image: str, auth: Any = None, timeout: float = 120) -> str:
        req = pb.PullImageRequest(image=pb.ImageSpec(image=image))
        if auth is not None:
            req.auth.CopyFrom(auth)
        return str(self.images.PullImage(req, timeout=timeout).image_ref)

    def status(self, image: str, verbose: bool = False) -> Any:
        return self.images.ImageStatus(
            pb.ImageStatusRequest(image=pb.ImageSpec(image=image), verbose=verbose), timeout=30)

    def list(self, filter_image: str = "") -> list[Any]:
        req = pb.ListImagesRequest()
        if filter_image:
            req.filter.image.image = filter_image
        return list(self.images.ListImages(req, timeout=30).images)

    def remove(self, image: str) -> None:
        self.images.RemoveImage(pb.RemoveImageRequest(image=pb.ImageSpec(image=image)), timeout=60)


@dataclass
class Daemon:
    root: str
    state: str
    address: str
    log_path: str
    proc: subprocess.Popen[bytes]
    client: CRIClient
    extra: dict[str, str] = field(default_factory=dict)

    def log(self) -> str:
        with open(self.log_path, errors="replace") as f:
            return f.read()

    def stop(self, timeout: float = 30) -> int:
        """SIGTERM and wait; returns the exit code."""
        self.client.close()
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                raise AssertionError(
                    f"pycrid did not stop on SIGTERM:\n{self.log()[-4000:]}") from None
        return self.proc.returncode


NRI_SECTION = '[plugins."pycrid.nri.v1.nri"]'


def nri_paths(base: str) -> dict[str, str]:
    """Where a test daemon under ``base`` keeps its NRI socket, plugins and their configs."""
    nri = os.path.join(base, "nri")
    return {"socket_path": os.path.join(nri, "nri.sock"),
            "plugin_path": os.path.join(nri, "plugins"),
            "plugin_config_path": os.path.join(nri, "conf.d")}


def with_private_nri(config_text: str, base: str) -> str:
    """Give a test daemon its own NRI socket and plugin dirs (never the host's defaults),
    unless the config already has an NRI section."""
    if NRI_SECTION in config_text:
        return config_text
    keys = "".join(f'{k} = "{v}"\n' for k, v in nri_paths(base).items())
    return f"{config_text.rstrip()}\n{NRI_SECTION}\n{keys}"


CADVISOR_SECTION = '[plugins."pycrid.cadvisor.v1.containerd"]'


def containerd_socket(base: str) -> str:
    """Where a test daemon under ``base`` serves containerd's API for cAdvisor."""
    return os.path.join(base, "containerd.sock")


def with_private_cadvisor(config_text: str, base: str) -> str:
    """Give a test daemon its own containerd API socket (never the host's
    /run/containerd/containerd.sock), unless the config already has that section."""
    if CADVISOR_SECTION in config_text:
        return config_text
    path = containerd_socket(base)
    return f'{config_text.rstrip()}\n{CADVISOR_SECTION}\nsocket_path = "{path}"\n'


def with_private_sockets(config_text: str, base: str) -> str:
    """Private NRI and containerd API sockets for a test daemon (see the two above)."""
    return with_private_cadvisor(with_private_nri(config_text, base), base)


def serve_command(config: str | None, root: str, state: str, address: str,
                  *extra: str, python: str = sys.executable) -> list[str]:
    """``pycrid serve`` of this checkout, or of the pycrid installed for ``python`` (an
    earlier release: tests/support/releases.py)."""
    cmd = [python, "-m", "pycrid", "serve", "--root", root, "--state", state,
           "--address", address, "--log-level", "debug"]
    if config:
        cmd += ["--config", config]
    return cmd + list(extra)


def wait_ready(daemon: Daemon, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    last: Exception | None = None
    while time.monotonic() < deadline:
        if daemon.proc.poll() is not None:
            raise AssertionError(
                f"pycrid exited with {daemon.proc.returncode}:\n{daemon.log()[-4000:]}")
        if os.path.exists(daemon.address):
            try:
                daemon.client.runtime.Version(pb.VersionRequest(), timeout=2)
                return
            except grpc.RpcError as e:
                last = e
        time.sleep(0.05)
    raise AssertionError(f"pycrid not ready after {timeout}s ({last}):\n{daemon.log()[-4000:]}")


@contextlib.contextmanager
def running_daemon(base: str, config_text: str | None = None, *extra: str,
                   env: dict[str, str] | None = None, state_dir: str | None = None,
                   python: str = sys.executable) -> Iterator[Daemon]:
    """Start pycrid under ``base`` (root, state, socket, log inside it, or the state in
    ``state_dir``); stop it after. ``python`` runs another pycrid (an earlier release)."""
    os.makedirs(base, exist_ok=True)
    root, state = os.path.join(base, "root"), state_dir or os.path.join(base, "state")
    address = os.path.join(state, "pycrid.sock")
    config = os.path.join(base, "config.toml")
    with open(config, "w") as f:
        f.write(with_private_cni(with_private_sockets(config_text or "version = 2\n", base),
                                 base))
    log_path = os.path.join(base, "pycrid.log")
    with open(log_path, "ab") as logf:
        proc = subprocess.Popen(serve_command(config, root, state, address, *extra,
                                              python=python),
                                stdout=logf, stderr=logf, stdin=subprocess.DEVNULL,
                                env={**os.environ, **(env or {})})
    d = Daemon(root=root, state=state, address=address, log_path=log_path, proc=proc,
               client=CRIClient(address))
    try:
        wait_ready(d)
        yield d
    finally:
        d.stop()


@contextlib.contextmanager
def mapped_root_state() -> Iterator[str]:
    """A state directory the root of a pod in a user namespace can pass through: runc
    sets the rootfs up from inside the pod's user namespace, and pytest's temporary tree
    is 0700 (and pytest puts that mode back when a session starts). A fresh directory
    under /run (0755), searchable but not listable by others, removed afterwards."""
    state = tempfile.mkdtemp(prefix="pycrid-test-userns-", dir="/run")
    os.chmod(state, 0o711)
    try:
        yield state
    finally:
        for mp in mounts_under(state)[::-1]:
            subprocess.run(["umount", "-l", mp], check=False)
        shutil.rmtree(state, ignore_errors=True)


def mounts_under(path: str) -> list[str]:
    """Mount points at or below ``path`` (for leak checks)."""
    out = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            mp = line.split()[4].replace("\\040", " ")
            if mp == path or mp.startswith(path.rstrip("/") + "/"):
                out.append(mp)
    return out


_OBJECT_ID = re.compile(rb"\b[0-9a-f]{64}\b")


def ids_logged_under(base: str) -> set[str]:
    """Every pod and container id a daemon under ``base`` logged (pycrid logs each id as it
    records the intent: "running pod sandbox <id>", "creating container <id>").

    Leak checks use it to look only at what this suite created, so they pass on a node
    that also runs containerd or another pycrid."""
    found: set[str] = set()
    for dirpath, _dirs, files in os.walk(base):
        for name in files:
            if name.endswith(".log"):
                with contextlib.suppress(OSError), open(os.path.join(dirpath, name), "rb") as f:
                    found.update(m.decode() for m in _OBJECT_ID.findall(f.read()))
    return found


def daemon_ids(root: str) -> set[str]:
    """The ids logged by the daemon whose root is ``root`` (``running_daemon``'s layout:
    its log beside the root); an error when there is no such log, so a leak check never
    passes for want of knowing what to look for."""
    base = os.path.dirname(root.rstrip("/"))
    if not os.path.exists(os.path.join(base, "pycrid.log")):
        raise AssertionError(f"no pycrid.log beside {root}: cannot tell this daemon's objects")
    return ids_logged_under(base)
