"""A gVisor handler's settings: its runsc binary, state root and runsc flags.

The keys are those of gVisor's containerd shim (pkg/shim/options.go): the handler's
``options.ConfigPath`` names a ``runsc.toml`` whose ``binary_name`` and ``root`` choose
the binary and root, and whose ``[runsc_config]`` table holds runsc flags (``platform``,
``network``, ``debug``, ``debug-log``, ...), passed to every runsc command as
``--name=value``. ``%ID%`` in a path-like flag is the pod's sandbox id, as the shim
replaces it (pkg/shim/runsc/utils.go). The shim's own keys (log_path, log_level,
shim_cgroup, io_uid, io_gid) mean nothing here: pycrid runs runsc under conmon, as CRI-O
runs an OCI runtime, and warns that it ignores them.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pycrid.config.decode import ConfigError
from pycrid.host import binaries
from pycrid.oci.defaults import ALL_CAPABILITIES

log = logging.getLogger(__name__)

#: Flags pycrid sets unless the runsc.toml says otherwise. The pod's sandbox uses the
#: network namespace it is given (the pod's, wired by CNI) through the host kernel's
#: stack: runsc's own stack ("sandbox", its default) refuses to start on kernels that
#: show net.core.rmem_default in every namespace (6.x) in the runsc releases Debian
#: ships, which take that file as the sign of the host's namespace.
#: And seccomp profiles (RuntimeDefault, Localhost) apply to the processes inside the
#: sandbox (runsc's --oci-seccomp) instead of being dropped, as pycrid honours or
#: refuses every field.
DEFAULT_FLAGS: Mapping[str, str] = {"network": "host", "oci-seccomp": "true"}
#: runsc flags that name files (gVisor's shim fills in %ID% and makes their directories).
PATH_FLAGS = ("log", "panic-log", "debug-log", "coverage-report", "profile-block",
              "profile-cpu", "profile-heap", "profile-mutex", "trace", "pcap-log")
#: Flags pycrid sets itself: a config that sets them is refused, naming the key to use.
_OWN_FLAGS = {"root": "root (or the handler's options.Root)",
              "systemd-cgroup": "cgroup_driver = \"systemd\" in the runtime section"}
#: gVisor shim options that only the shim reads.
_SHIM_ONLY = ("log_path", "log_level", "shim_cgroup", "io_uid", "io_gid")

#: Capabilities runsc learnt on 2023-02-17 (release-20230227): older ones refuse a spec
#: naming them ("unknown capability").
_NEWER_CAPS = frozenset({"CAP_PERFMON", "CAP_BPF", "CAP_CHECKPOINT_RESTORE"})
_FIRST_WITH_NEWER_CAPS = 20230227

_INSTALL_HINT = "install it (Debian/Ubuntu: apt-get install runsc)"


@dataclass(frozen=True)
class RunscSettings:
    binary: str
    root: str
    #: runsc's global flags, in order, %ID% not yet filled in.
    flags: tuple[tuple[str, str], ...] = ()
    #: The runsc.toml read ("" when none).
    config_path: str = ""

    def flag(self, name: str) -> str | None:
        return next((v for k, v in self.flags if k == name), None)

    @property
    def oci_seccomp(self) -> bool:
        """runsc applies the spec's seccomp profile in the sandbox (``--oci-seccomp``, read
        as Go's strconv.ParseBool reads it)."""
        return (self.flag("oci-seccomp") or "") in ("1", "t", "T", "true", "TRUE", "True")

    def args(self, pod_id: str) -> list[str]:
        """The flags for one pod's commands (``--name=value``, %ID% filled in)."""
        return [f"--{k}={v.replace('%ID%', pod_id) if k in PATH_FLAGS else v}"
                for k, v in self.flags]

    def make_log_dirs(self, pod_id: str) -> None:
        """The directories the pod's path-like flags write into (the shim makes them)."""
        for name in PATH_FLAGS:
            value = self.flag(name)
            if value:
                path = value.replace("%ID%", pod_id)
                os.makedirs(path if path.endswith("/") else os.path.dirname(path) or "/",
                            exist_ok=True)


def find_runsc(configured: str, key: str) -> str:
    if configured:
        if os.path.isfile(configured) and os.access(configured, os.X_OK):
            return configured
        raise ConfigError(key, f"runsc binary {configured!r} does not exist or is not "
                          f"executable; {_INSTALL_HINT} or fix {key}")
    found = binaries.which("runsc")
    if not found:
        raise ConfigError(key, f"runsc binary not found in {binaries.search_path()}; "
                          f"{_INSTALL_HINT} or set it")
    return found


def available() -> str:
    """runsc on the search path ("" when there is none)."""
    return binaries.which("runsc")


def load(section: str, *, binary: str, root: str, config_path: str,
         default_root: str) -> RunscSettings:
    """A handler's settings: options.BinaryName/Root, else the runsc.toml's
    binary_name/root, else runsc on the search path and ``default_root``.
    ``section`` is the handler's config table, for error messages."""
    doc: dict[str, Any] = _read(f"{section}.options.ConfigPath", config_path) \
        if config_path else {}
    file_key = f"{config_path} key"
    for key in sorted(doc):
        if key in _SHIM_ONLY:
            log.warning("%s %s is an option of gVisor's containerd shim; pycrid runs runsc "
                        "under conmon and ignores it", file_key, key)
        elif key not in ("binary_name", "root", "runsc_config"):
            log.warning("%s %s is not known (ignored)", file_key, key)
    flags = dict(DEFAULT_FLAGS)
    table = doc.get("runsc_config", {})
    if not isinstance(table, dict):
        raise ConfigError(f"{file_key} runsc_config", "must be a table of runsc flags")
    for name, value in table.items():
        where = f"{file_key} runsc_config.{name}"
        if name.startswith("-") or not name or "=" in name:
            raise ConfigError(where, "flag names have no leading dashes (platform, not "
                              "--platform)")
        if name in _OWN_FLAGS:
            raise ConfigError(where, f"set by pycrid; use {_OWN_FLAGS[name]}")
        if isinstance(value, bool):
            value = "true" if value else "false"
        elif isinstance(value, int):
            value = str(value)
        elif not isinstance(value, str):
            raise ConfigError(where, "must be a string (runsc flag value)")
        flags[name] = value
    for key in ("binary_name", "root"):
        if key in doc and (not isinstance(doc[key], str) or not os.path.isabs(doc[key])):
            raise ConfigError(f"{file_key} {key}", "must be an absolute path")
    exe = binary or doc.get("binary_name", "")
    return RunscSettings(
        binary=find_runsc(exe, f"{section}.options.BinaryName" if binary
                          else f"{file_key} binary_name" if exe
                          else f"{section}.options.BinaryName"),
        root=root or doc.get("root") or default_root,
        flags=tuple(sorted(flags.items())), config_path=config_path)


def _read(key: str, path: str) -> dict[str, Any]:
    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except OSError as e:
        raise ConfigError(key, f"cannot read {path}: {e.strerror}") from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(key, f"{path} is not valid TOML: {e}") from None


def release_date(version: str) -> int | None:
    """The YYYYMMDD a runsc version names (Debian: ``0.0~20221219.0``, upstream:
    ``release-20240729.0``), or None."""
    found = re.search(r"(?<!\d)(20\d{6})(?!\d)", version)
    return int(found.group(1)) if found else None


def known_capabilities(version: str) -> frozenset[str] | None:
    """The capabilities a runsc release knows; None when it knows them all (or its
    version says no date)."""
    date = release_date(version)
    if date is None or date >= _FIRST_WITH_NEWER_CAPS:
        return None
    return frozenset(ALL_CAPABILITIES) - _NEWER_CAPS


@dataclass(frozen=True)
class RunscProbe:
    """What a runsc binary says of itself."""

    version: str = ""
    #: It has an ``update`` command (runc's ``update --resources``).
    can_update: bool = False


async def probe_runsc(runsc: str) -> RunscProbe:
    async def run(*args: str) -> tuple[int, str]:
        proc = await asyncio.create_subprocess_exec(
            runsc, *args, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT)
        out, _ = await proc.communicate()
        return proc.returncode or 0, out.decode(errors="replace")

    _, text = await run("--version")
    first = text.splitlines()[0] if text else ""
    version = first.split("version", 1)[1].strip() if "version" in first else first
    rc, _ = await run("help", "update")
    return RunscProbe(version=version, can_update=rc == 0)
