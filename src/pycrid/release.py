"""Which pycrid this is: the release (``pycrid.__version__``, the one place it is
written; pyproject.toml reads it from there) and the commit it was built from.

The commit comes from, in order:
- ``COMMIT`` beside this module: ``git archive`` fills it in (``export-subst`` in
  .gitattributes), and a build from a git checkout writes it (setup.py);
- git itself, when this module is a tracked file of a git checkout (an editable install
  or a run from the source tree); a checkout with uncommitted changes adds ``-dirty``;
- nothing: "" (a tarball made another way).

The CRI ``Version`` answers the release with a short commit as semver build metadata
(``0.2.0+43375f6d2a1c``), as containerd's dev builds add ``+unknown``: the kubelet shows
it as the node's container runtime version.
"""

from __future__ import annotations

import functools
import os
import re
import subprocess

from pycrid import __version__

VERSION = __version__
#: The file a build or ``git archive`` writes the commit into.
COMMIT_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "COMMIT")
_HASH = re.compile(r"[0-9a-f]{40}(-dirty)?")


@functools.cache
def commit() -> str:
    """The full commit hash ("" when unknown), ``-dirty`` for a modified checkout."""
    try:
        with open(COMMIT_FILE) as f:
            recorded = f.read().strip()
    except OSError:
        recorded = ""
    if _HASH.fullmatch(recorded):
        return recorded
    return _from_git(os.path.dirname(COMMIT_FILE))


def _git(where: str, *args: str) -> str | None:
    try:
        done = subprocess.run(["git", "-C", where, *args], capture_output=True, text=True,
                              timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def _from_git(package_dir: str) -> str:
    # Only a checkout that tracks this very file: a venv inside another repository's
    # work tree must not report that repository's commit.
    if _git(package_dir, "ls-files", "--error-unmatch", "release.py") is None:
        return ""
    head = _git(package_dir, "rev-parse", "HEAD") or ""
    if not re.fullmatch(r"[0-9a-f]{40}", head):
        return ""
    changes = _git(package_dir, "status", "--porcelain", "--untracked-files=no")
    return head + ("-dirty" if changes else "")


def runtime_version() -> str:
    """The release, with the short commit as build metadata when it is known."""
    c = commit()
    if not c:
        return VERSION
    return f"{VERSION}+{c[:12]}" + (".dirty" if c.endswith("-dirty") else "")


def describe() -> str:
    """One line for people: ``pycrid 0.2.0 (commit 43375f6…)``."""
    c = commit()
    return f"pycrid {VERSION} ({'commit ' + c if c else 'commit unknown'})"
