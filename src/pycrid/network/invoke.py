"""Running one CNI plugin binary: the spec's protocol of environment, stdin and stdout.

A plugin gets its command and the attachment in ``CNI_*`` variables and the network
config on stdin; it answers with a result (ADD), nothing (DEL, CHECK, STATUS), its
versions (VERSION) or an error object ``{"code", "msg", "details"}`` and a non-zero
exit. Written here rather than bound from libcni: the protocol is a dozen lines of
process handling, and a Go library cannot be called from Python.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pycrid.network.conf import SPEC_VERSION

log = logging.getLogger(__name__)

#: A plugin that has not answered this long is killed (containerd has no limit; a
#: hung plugin would hold RunPodSandbox for ever, and the kubelet retries anyway).
PLUGIN_TIMEOUT = 120.0
#: How long a VERSION answer is waited for. containerd runs no plugin to load a network
#: (go-cni's loadFromConfDir only reads the files); pycrid asks, to report a plugin that
#: cannot run its config before a pod needs it, but never waits long.
VERSION_TIMEOUT = 2.0
#: How long a killed plugin may take to be reaped.
REAP_WITHIN = 5.0


class PluginError(Exception):
    """A plugin failed; ``str()`` is the plugin's own message, ready for a CRI error."""

    def __init__(self, message: str, *, code: int = 0) -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class Invocation:
    """The ``CNI_*`` environment of one call (the spec's "runtime parameters")."""

    command: str
    container_id: str = ""
    netns: str = ""
    ifname: str = ""
    args: tuple[tuple[str, str], ...] = ()

    def env(self, bin_dirs: Sequence[str]) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("CNI_")}
        env.update(CNI_COMMAND=self.command, CNI_CONTAINERID=self.container_id,
                   CNI_NETNS=self.netns, CNI_IFNAME=self.ifname,
                   CNI_ARGS=";".join(f"{k}={v}" for k, v in self.args),
                   CNI_PATH=os.pathsep.join(bin_dirs))
        return env


def find_plugin(kind: str, bin_dirs: Sequence[str]) -> str:
    for d in bin_dirs:
        path = os.path.join(d, kind)
        if os.path.isfile(path) and os.access(path, os.X_OK):
            return path
    raise PluginError(f"failed to find plugin {kind!r} in path {list(bin_dirs)}")


def _failure(kind: str, command: str, rc: int, out: bytes, err: bytes) -> PluginError:
    what = f"plugin type={kind!r} failed ({command.lower()})"
    try:
        doc = json.loads(out)
    except ValueError:
        doc = None
    if isinstance(doc, dict) and ("msg" in doc or "code" in doc):
        msg = str(doc.get("msg", "")) or f"error code {doc.get('code')}"
        if doc.get("details"):
            msg += f"; {doc['details']}"
        code = doc.get("code", 0)
        return PluginError(f"{what}: {msg}", code=code if isinstance(code, int) else 0)
    text = (err or out).decode(errors="replace").strip() or f"exit status {rc}"
    return PluginError(f"{what}: {text}")


async def run_plugin(kind: str, bin_dirs: Sequence[str], call: Invocation,
                     config: bytes, limit: float = PLUGIN_TIMEOUT) -> bytes:
    """Run plugin ``kind`` once; its stdout, or PluginError with its message.

    The plugin runs in a process group of its own: one that does not answer in time (or
    whose caller is cancelled) is killed with everything it started, since a child still
    holding its output pipes would keep it from ever being reaped."""
    path = find_plugin(kind, bin_dirs)
    proc = await asyncio.create_subprocess_exec(
        path, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE, env=call.env(bin_dirs), cwd="/",
        start_new_session=True)
    try:
        out, err = await asyncio.wait_for(proc.communicate(config), limit)
    except TimeoutError:
        raise PluginError(f"plugin type={kind!r} ({path}) did not answer "
                          f"{call.command} within {limit:g}s") from None
    finally:
        if proc.returncode is None:  # timed out or cancelled: the plugin goes too
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            try:
                await asyncio.wait_for(proc.wait(), REAP_WITHIN)
            except TimeoutError:
                log.warning("CNI plugin %s (pid %d) was killed but its output is still held "
                            "open by a process outside its group", path, proc.pid)
    if proc.returncode != 0:
        raise _failure(kind, call.command, proc.returncode or -1, out, err)
    return out


async def supported_versions(kind: str, bin_dirs: Sequence[str]) -> list[str]:
    """The spec versions plugin ``kind`` speaks (the VERSION command)."""
    probe = json.dumps({"cniVersion": SPEC_VERSION}).encode()
    out = await run_plugin(kind, bin_dirs, Invocation("VERSION"), probe, limit=VERSION_TIMEOUT)
    try:
        doc: Any = json.loads(out)
        versions = doc.get("supportedVersions", [])
    except (ValueError, AttributeError):
        raise PluginError(f"plugin type={kind!r} gave an unreadable VERSION answer") from None
    if not isinstance(versions, list):
        raise PluginError(f"plugin type={kind!r} gave an unreadable VERSION answer")
    return [str(v) for v in versions]
