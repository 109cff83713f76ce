"""This node's CRIU (checkpoint/restore in user space), checked once at start.

runc checkpoints and restores containers by running ``criu``, which it finds on its
PATH; whether that works depends on the kernel as much as on CRIU's version (Debian
12's CRIU 3.17 stops on kernel 6.x with ``vdso: Unexpected rt vDSO area bounds``).
So the daemon asks once, as CRI-O and containerd do before their first checkpoint
(go-criu's version check against ``PodCriuVersion``), and adds ``criu check``, CRIU's
own test of this kernel: Status and every refusal can then say why not.
"""

from __future__ import annotations

import asyncio
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass

from pycrid.host import binaries

#: go-criu's PodCriuVersion (3.16): what containerd and CRI-O require for pods.
MIN_VERSION = (3, 16)
#: How long ``criu check`` may take before it counts as failed.
CHECK_TIMEOUT = 30.0


@dataclass(frozen=True)
class CriuSupport:
    """What the start-up check found; ``error`` is empty when checkpointing works."""

    #: The binary that was checked ("" when none was found).
    path: str = ""
    #: Its version as it prints it ("4.2"), "" when unknown.
    version: str = ""
    error: str = "CRIU was not checked"

    @property
    def works(self) -> bool:
        return not self.error


def parse_version(text: str) -> tuple[int, ...] | None:
    """``criu --version`` says ``Version: 4.2`` (and ``GitID: ...`` for git builds)."""
    m = re.search(r"Version:\s*(\d+)\.(\d+)(?:\.(\d+))?", text)
    if m is None:
        return None
    return tuple(int(g) for g in m.groups() if g is not None)


_ERROR = re.compile(r"Error \([^)]*\):\s*(.*)")


def error_lines(lines: Iterable[str]) -> list[str]:
    """What CRIU's ``Error (file:line):`` lines say, without the source locations."""
    return [text for line in lines
            if (m := _ERROR.search(line)) and (text := m.group(1).strip())]


def check_error(output: str) -> str:
    """The reason ``criu check`` gives for failing: its ``Error (...)`` lines without the
    source locations, joined (the last line alone is only "could not initialize")."""
    reasons = error_lines(output.splitlines())
    if reasons:
        return "; ".join(reasons[:3])
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    return lines[-1] if lines else "no output"


def resolve(configured: str) -> str:
    """The configured binary, else ``criu`` on the search path; "" when there is none."""
    if configured:
        return configured if os.path.isfile(configured) and os.access(configured, os.X_OK) else ""
    return binaries.which("criu")


async def _run(*argv: str) -> tuple[int, str]:
    proc = await asyncio.create_subprocess_exec(
        *argv, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT)
    try:
        out, _ = await asyncio.wait_for(proc.communicate(), CHECK_TIMEOUT)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        return -1, f"{argv[0]} {argv[1]} did not finish within {CHECK_TIMEOUT:.0f}s"
    return (proc.returncode if proc.returncode is not None else -1,
            out.decode(errors="replace"))


async def probe(configured: str, key: str = "criu_path") -> CriuSupport:
    """``criu --version`` and ``criu check``, without blocking the loop (about 50 ms).
    ``key`` is the config key that names the binary, for the messages."""
    path = resolve(configured)
    if not path:
        where = (f"{configured!r} (config {key}) does not exist or is not executable"
                 if configured else f"no criu binary in {binaries.search_path()} (config {key})")
        return CriuSupport(error=f"CRIU is not installed: {where}")
    try:
        rc, out = await _run(path, "--version")
    except OSError as e:
        return CriuSupport(path=path, error=f"cannot run {path}: {e.strerror or e}")
    version = parse_version(out)
    text = ".".join(str(v) for v in version) if version else ""
    if rc != 0 or version is None:
        return CriuSupport(path=path, error=f"{path} --version failed: {check_error(out)}")
    if version[:2] < MIN_VERSION:
        need = ".".join(map(str, MIN_VERSION))
        return CriuSupport(path=path, version=text,
                           error=f"CRIU {text} at {path} is too old: checkpointing pods "
                                 f"needs CRIU {need} or newer")
    rc, out = await _run(path, "check")
    if rc != 0:
        return CriuSupport(path=path, version=text,
                           error=f"`{path} check` fails on this kernel ({check_error(out)}): "
                                 "a newer CRIU is needed (set criu_path to it)")
    return CriuSupport(path=path, version=text, error="")
