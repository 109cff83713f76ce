"""Earlier pycrid releases, built from this repository's own history for the upgrade and
rollback tests (tests/e2e/test_upgrade.py).

A release is its commit: ``git archive`` of it (as a release tarball is made), a virtualenv
of its own, and ``pip install`` of the tree. The dependencies are the ones this checkout's
environment already has (a ``.pth`` line puts its site-packages after the new
environment's own), so pip downloads only what the earlier release needs and this
environment lacks, and the build takes seconds. Skips, saying why, where the history is
not there (a source tarball, a shallow clone).
"""

from __future__ import annotations

import io
import os
import re
import shutil
import site
import subprocess
import sys
import sysconfig
import tarfile
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Release:
    #: As CHANGELOG.md names it.
    version: str
    commit: str


@dataclass(frozen=True)
class Built:
    release: Release
    #: The python of its virtualenv: ``python -m pycrid`` is that release.
    python: str
    #: What ``pycrid version`` printed.
    version_line: str
    #: Seconds the build took.
    seconds: float


def _git(*args: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(["git", "-C", str(REPO), *args], capture_output=True, timeout=120,
                          check=False)


def build(release: Release, dest: Path) -> Built:
    """``release`` installed in a virtualenv under ``dest`` (or a skip saying why not)."""
    started = time.monotonic()
    if shutil.which("git") is None:
        pytest.skip("git is not installed: the earlier release is built from the repository's "
                    "history")
    where = _git("rev-parse", "--git-dir")
    if where.returncode != 0:
        pytest.skip(f"{REPO} is not a git checkout git can read (a source tarball?): the "
                    f"earlier release ({release.version}, {release.commit[:12]}) is built "
                    f"from its history; git said: {where.stderr.decode().strip()[:300]}")
    if _git("cat-file", "-e", f"{release.commit}^{{commit}}").returncode != 0:
        pytest.skip(f"commit {release.commit} (pycrid {release.version}) is not in this "
                    "clone's history (a shallow clone? git fetch --unshallow)")
    tree = dest / "src"
    archive = _git("archive", "--format=tar", release.commit)
    if archive.returncode != 0:
        raise AssertionError(f"git archive {release.commit}: {archive.stderr.decode()}")
    with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
        tar.extractall(tree, filter="data")
    venv = dest / "venv"
    # No pip or setuptools of its own (ensurepip's are older than this environment's):
    # this environment's pip installs into it (--python) with this environment's
    # setuptools as the build backend.
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True,
                   timeout=300)
    python = str(venv / "bin" / "python")
    purelib = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_path("
                              "'purelib'))"], capture_output=True, text=True, check=True,
                             timeout=60).stdout.strip()
    # This environment's packages, after the new one's own: plain paths, so that this
    # checkout's editable install of pycrid (a .pth of its own there) is not picked up.
    ours = [p for p in [*site.getsitepackages(), sysconfig.get_path("purelib")]
            if os.path.isdir(p)]
    Path(purelib, "_this_checkouts_packages.pth").write_text("\n".join(dict.fromkeys(ours))
                                                             + "\n")
    done = subprocess.run([sys.executable, "-m", "pip", "--python", python, "install",
                           "--quiet", "--no-build-isolation", "--disable-pip-version-check",
                           str(tree)],
                          capture_output=True, text=True, timeout=900)
    if done.returncode != 0:
        raise AssertionError(f"pip install of pycrid {release.version} failed:\n"
                             f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    shown = subprocess.run([python, "-m", "pycrid", "version"], capture_output=True,
                           text=True, timeout=60)
    line = shown.stdout.strip()
    if not re.match(rf"pycrid {re.escape(release.version)}\b", line):
        raise AssertionError(f"the build of {release.commit} says {line!r} "
                             f"({shown.stderr[-2000:]}), not pycrid {release.version}")
    # Its own code, not this checkout's (from where the tests run its daemon).
    where = subprocess.run([python, "-c", "import pycrid; print(pycrid.__file__)"],
                           capture_output=True, text=True, check=True,
                           timeout=60).stdout.strip()
    assert where.startswith(str(venv)), where
    return Built(release=release, python=python, version_line=line,
                 seconds=time.monotonic() - started)
