"""Pre-installed plugins: find them in ``plugin_path`` and start them on fd 3.

The rules are containerd/nri's (plugin.go, adaptation.go): regular executable
files named ``NN-name``; the config is ``<conf>/NN-name.conf``, else
``<conf>/name.conf``; the process gets one end of a socketpair as fd 3 and an
environment of exactly NRI_PLUGIN_NAME, NRI_PLUGIN_IDX and NRI_PLUGIN_SOCKET.
One difference: upstream fails start-up on a badly named file; we skip it with a warning.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import stat
from dataclasses import dataclass

from pycrid.nri import api
from pycrid.nri.adaptation.plugin import Launched

log = logging.getLogger(__name__)

#: The fd a launched plugin finds its socket on.
PLUGIN_FD = 3


@dataclass(frozen=True)
class Found:
    path: str
    idx: str
    base: str


def discover(plugin_path: str) -> tuple[list[Found], list[str]]:
    """The launchable plugins in ``plugin_path`` (sorted by name) and warnings about the rest."""
    found: list[Found] = []
    warnings: list[str] = []
    try:
        names = sorted(os.listdir(plugin_path))
    except FileNotFoundError:
        return [], []
    except OSError as e:
        return [], [f"cannot read NRI plugin directory {plugin_path}: {e.strerror}"]
    for name in names:
        path = os.path.join(plugin_path, name)
        try:
            st = os.stat(path)
        except OSError as e:
            warnings.append(f"NRI plugin {path} skipped: {e.strerror}")
            continue
        if not stat.S_ISREG(st.st_mode) or not st.st_mode & 0o111:
            continue
        try:
            idx, base = api.parse_plugin_name(name)
            api.check_plugin_name(base)
        except ValueError as e:
            warnings.append(f"NRI plugin {path} skipped: {e}")
            continue
        found.append(Found(path, idx, base))
    return found, warnings


def plugin_config(config_dir: str, idx: str, base: str) -> str:
    """``NN-name.conf``, else ``name.conf``, else empty."""
    for name in (f"{idx}-{base}.conf", f"{base}.conf"):
        try:
            with open(os.path.join(config_dir, name)) as f:
                return f.read()
        except FileNotFoundError:
            continue
    return ""


async def launch(plugin: Found) -> tuple[Launched, socket.socket]:
    """Start the plugin with its socket on fd 3; returns it and our end of the socket."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    fd = theirs.fileno()

    def to_fd3() -> None:  # in the child, before exec
        os.dup2(fd, PLUGIN_FD)

    try:
        proc = await asyncio.create_subprocess_exec(
            plugin.path, cwd="/", stdin=asyncio.subprocess.DEVNULL,
            env={api.PLUGIN_NAME_ENV: plugin.base, api.PLUGIN_IDX_ENV: plugin.idx,
                 api.PLUGIN_SOCKET_ENV: str(PLUGIN_FD)},
            # 3 must be listed too, or the child's fd cleanup (after preexec_fn) closes it.
            pass_fds=(fd, PLUGIN_FD), preexec_fn=to_fd3)
    except OSError:
        ours.close()
        raise
    finally:
        theirs.close()
    return Launched(path=plugin.path, idx=plugin.idx, base=plugin.base, process=proc), ours
