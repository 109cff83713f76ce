"""Plain ``runc create`` + ``runc start``: the floor of a container start.

The bundle needs no image: its root is an empty directory of the run's own, read-only,
into which runc bind-mounts the host's ``/usr`` (and ``/bin``, ``/sbin``, ``/lib*`` where
they are directories rather than merged-/usr symlinks, which are copied as symlinks)
read-only, inside the container's mount namespace; it runs the host's ``sleep``. The spec
is pycrid's own base spec (the same namespaces, mounts, masked paths and capabilities as a
CRI container), with a private ``--root`` and cgroup ``/<parent>/<id>``. Nothing is mounted
on the host and nothing is written outside the run's directory.

Why not the host's ``/`` as the root: runc would bind every mount of the node recursively
(on a busy node, every other container's rootfs, shm and netns) before pivoting, a cost a
CRI container does not pay, and it creates missing mount points in its root before making
it read-only, which would be the host's ``/``. Why not the image: CRI has no call that
hands its unpacked rootfs to a client, and unpacking it ourselves would mean pulling
around the runtime (its registry config, its credentials)."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pycrid.oci.defaults import DEFAULT_PATH, default_spec

CGROUP_ROOT = Path("/sys/fs/cgroup")
#: Host directories a dynamically linked ``sleep`` may need; /usr first.
HOST_DIRS = ("usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32")


def runc_binary() -> str | None:
    return shutil.which("runc") or next(
        (p for p in ("/usr/sbin/runc", "/usr/bin/runc", "/usr/local/sbin/runc")
         if os.path.exists(p)), None)


def host_rootfs(rootfs: Path, host: Path = Path("/")) -> list[dict[str, Any]]:
    """Lay out ``rootfs`` (symlinks as on the host, empty mount points) and return the
    read-only bind mounts of the host's directories into it."""
    rootfs.mkdir(parents=True, exist_ok=True)
    mounts: list[dict[str, Any]] = []
    for name in HOST_DIRS:
        src = host / name
        if src.is_symlink():
            os.symlink(os.readlink(src), rootfs / name)
        elif src.is_dir():
            (rootfs / name).mkdir()
            mounts.append({"destination": f"/{name}", "type": "bind", "source": str(src),
                           "options": ["rbind", "ro", "nosuid", "nodev"]})
    for name in ("proc", "dev", "sys", "tmp"):
        (rootfs / name).mkdir(exist_ok=True)
    return mounts


def floor_spec(rootfs: Path, args: list[str], host: Path = Path("/")) -> dict[str, Any]:
    """pycrid's base spec running ``args`` on :func:`host_rootfs` (read-only)."""
    spec = default_spec()
    spec["root"] = {"path": str(rootfs), "readonly": True}
    spec["mounts"] = [*spec["mounts"], *host_rootfs(rootfs, host)]
    proc = spec["process"]
    proc["args"] = list(args)
    proc["env"] = [DEFAULT_PATH]
    proc["terminal"] = False
    linux = spec["linux"]
    linux["namespaces"] = [{"type": ns["type"]} for ns in linux.get("namespaces", [])]
    spec["hostname"] = "bench"
    return spec


@dataclass
class Runc:
    """``runc`` on a private root under ``dir``, its containers in cgroups under a parent of
    this run's; remembers what it created so cleanup can delete it."""

    dir: Path
    runc: str
    cgroup_parent: str
    made: list[str] = field(default_factory=list)

    @classmethod
    def of_run(cls, base: Path, runc: str) -> Runc:
        """The floor of the run whose directory is ``base`` (a ``mkdtemp`` name, unique):
        under ``base/floor``, cgroups under ``/<base's name>``."""
        return cls(base / "floor", runc, base.name)

    @property
    def root(self) -> Path:
        return self.dir / "runc"

    @property
    def bundle(self) -> Path:
        return self.dir / "bundle"

    def prepare(self, args: list[str]) -> None:
        self.root.mkdir(parents=True)
        self.bundle.mkdir(parents=True)
        self._spec = floor_spec(self.bundle / "rootfs", args)

    def _run(self, *args: str) -> None:
        # No pipes: a detached non-terminal container inherits runc's stdio, so a pipe would
        # stay open as long as the container lives. Errors go to runc's --log instead.
        log = self.dir / "runc.log"
        r = subprocess.run([self.runc, "--root", str(self.root), "--log", str(log), *args],
                           stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL, check=False)
        if r.returncode != 0:
            tail = log.read_text(errors="replace").strip().splitlines()[-3:]
            raise RuntimeError(f"runc {args[0]} failed ({r.returncode}): {' | '.join(tail)}")

    def config_for(self, cid: str) -> None:
        """Write the bundle's config.json for ``cid`` (untimed, as writing a bundle is
        outside runc's clock)."""
        self._spec["linux"]["cgroupsPath"] = f"/{self.cgroup_parent}/{cid}"
        (self.bundle / "config.json").write_text(json.dumps(self._spec, indent=1))

    def create(self, cid: str) -> None:
        self.made.append(cid)
        self._run("create", "--bundle", str(self.bundle), "--pid-file",
                  str(self.bundle / "pid"), cid)

    def start(self, cid: str) -> None:
        self._run("start", cid)

    def delete(self, cid: str) -> None:
        self._run("delete", "--force", cid)
        self.made.remove(cid)

    def cleanup(self) -> None:
        for cid in list(self.made):
            with contextlib.suppress(Exception):
                self.delete(cid)
        # Anything else under our private root (e.g. a create interrupted half-way).
        if self.root.is_dir():
            for entry in self.root.iterdir():
                with contextlib.suppress(Exception):
                    self._run("delete", "--force", entry.name)
        for top in self.cgroups():
            for child in sorted(top.iterdir(), reverse=True):
                if child.is_dir():
                    with contextlib.suppress(OSError):
                        child.rmdir()
            with contextlib.suppress(OSError):
                top.rmdir()

    def cgroups(self) -> list[Path]:
        """This run's cgroup parent in every hierarchy (cgroup v2: the one)."""
        found = [CGROUP_ROOT / self.cgroup_parent] if (
            CGROUP_ROOT / self.cgroup_parent).is_dir() else []
        if CGROUP_ROOT.is_dir():
            found += [p / self.cgroup_parent for p in CGROUP_ROOT.iterdir()
                      if (p / self.cgroup_parent).is_dir()]
        return found

    def leftovers(self) -> list[str]:
        """runc containers and cgroups of this floor still there (after ``cleanup``)."""
        left = [f"runc container {e.name} (root {self.root})" for e in
                self.root.iterdir()] if self.root.is_dir() else []
        return left + [f"cgroup {c}" for c in self.cgroups()]
