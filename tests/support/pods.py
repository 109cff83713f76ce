"""Helpers for driving pods and containers over CRI in tests."""

from __future__ import annotations

import os
import secrets
import time
from collections.abc import Callable
from typing import Any

from cri_api.v1 import api_pb2 as pb

from tests.support.daemon import CRIClient


def pod_config(name: str = "", namespace: str = "default", *, log_dir: str = "",
               **kw: Any) -> Any:
    name = name or "pod-" + secrets.token_hex(4)
    cfg = pb.PodSandboxConfig(
        metadata=pb.PodSandboxMetadata(name=name, namespace=namespace,
                                       uid="uid-" + name, attempt=0),
        log_directory=log_dir, **kw)
    return cfg


def container_config(image: str, name: str = "c", *, command: list[str] | None = None,
                     args: list[str] | None = None, log_path: str = "", **kw: Any) -> Any:
    return pb.ContainerConfig(metadata=pb.ContainerMetadata(name=name),
                              image=pb.ImageSpec(image=image), command=command or [],
                              args=args or [], log_path=log_path, **kw)


class Pods:
    """Thin wrappers that remember what they made, so a test can clean up in one call."""

    def __init__(self, client: CRIClient) -> None:
        self.rt = client.runtime
        self.pods: list[str] = []

    def run(self, config: Any, handler: str = "") -> str:
        sid = self.rt.RunPodSandbox(pb.RunPodSandboxRequest(config=config,
                                                            runtime_handler=handler),
                                    timeout=60).pod_sandbox_id
        self.pods.append(sid)
        return str(sid)

    def create(self, sid: str, config: Any, pod: Any) -> str:
        return str(self.rt.CreateContainer(pb.CreateContainerRequest(
            pod_sandbox_id=sid, config=config, sandbox_config=pod), timeout=60).container_id)

    def start(self, cid: str) -> None:
        self.rt.StartContainer(pb.StartContainerRequest(container_id=cid), timeout=60)

    def run_container(self, sid: str, config: Any, pod: Any) -> str:
        cid = self.create(sid, config, pod)
        self.start(cid)
        return cid

    def status(self, cid: str, verbose: bool = False) -> Any:
        return self.rt.ContainerStatus(pb.ContainerStatusRequest(container_id=cid,
                                                                 verbose=verbose), timeout=30)

    def pod_status(self, sid: str, verbose: bool = False) -> Any:
        return self.rt.PodSandboxStatus(pb.PodSandboxStatusRequest(pod_sandbox_id=sid,
                                                                   verbose=verbose), timeout=30)

    def stop(self, cid: str, timeout: int = 0) -> None:
        self.rt.StopContainer(pb.StopContainerRequest(container_id=cid, timeout=timeout),
                              timeout=timeout + 60)

    def remove(self, cid: str) -> None:
        self.rt.RemoveContainer(pb.RemoveContainerRequest(container_id=cid), timeout=60)

    def exec(self, cid: str, cmd: list[str], timeout: int = 0) -> Any:
        return self.rt.ExecSync(pb.ExecSyncRequest(container_id=cid, cmd=cmd, timeout=timeout),
                                timeout=timeout + 60)

    def stop_pod(self, sid: str) -> None:
        self.rt.StopPodSandbox(pb.StopPodSandboxRequest(pod_sandbox_id=sid), timeout=120)

    def remove_pod(self, sid: str) -> None:
        self.rt.RemovePodSandbox(pb.RemovePodSandboxRequest(pod_sandbox_id=sid), timeout=120)
        if sid in self.pods:
            self.pods.remove(sid)

    def cleanup(self) -> None:
        for sid in list(self.pods):
            self.remove_pod(sid)

    def wait_state(self, cid: str, state: int, timeout: float = 30) -> Any:
        return wait_for(lambda: (s := self.status(cid).status).state == state and s,
                        timeout, f"container {cid} to reach {pb.ContainerState.Name(state)}")


def wait_for(cond: Callable[[], Any], timeout: float = 30, what: str = "condition") -> Any:
    deadline = time.monotonic() + timeout
    while True:
        got = cond()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def read_cri_log(path: str) -> list[tuple[str, str, str]]:
    """(stream, tag, text) of each CRI log line; partial lines are kept as they are."""
    out = []
    if not os.path.exists(path):
        return out
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            _ts, stream, tag, text = line.rstrip("\n").split(" ", 3) + [""] * (
                4 - len(line.rstrip("\n").split(" ", 3)))
            out.append((stream, tag, text))
    return out


def log_text(path: str, stream: str | None = None) -> str:
    """The log's content as the container wrote it (partial lines joined)."""
    parts = []
    for s, tag, text in read_cri_log(path):
        if stream is None or s == stream:
            parts.append(text + ("\n" if tag == "F" else ""))
    return "".join(parts)
