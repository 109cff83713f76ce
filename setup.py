"""Only to record the commit a build is made from: pycrid/COMMIT in the built package
(src/pycrid/release.py reads it). Everything else is in pyproject.toml."""

from __future__ import annotations

import os
import subprocess

from setuptools import setup
from setuptools.command.build_py import build_py


def _commit() -> str:
    here = os.path.dirname(os.path.abspath(__file__))
    try:
        head = subprocess.run(["git", "-C", here, "rev-parse", "HEAD"], capture_output=True,
                              text=True, timeout=10, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", here, "status", "--porcelain",
                                "--untracked-files=no"], capture_output=True, text=True,
                               timeout=10, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""  # not a git checkout (a tarball: git archive filled COMMIT in)
    return head + ("-dirty" if dirty else "")


class BuildPyWithCommit(build_py):
    def run(self) -> None:
        super().run()
        commit = _commit()
        if commit:
            with open(os.path.join(self.build_lib, "pycrid", "COMMIT"), "w") as f:
                f.write(commit + "\n")


setup(cmdclass={"build_py": BuildPyWithCommit})
