"""Where pycrid looks for the programs it runs (runc, conmon, runsc, CRIU) when the
config names none, and the PATH it gives runc and conmon: the daemon's own PATH first,
as containerd and CRI-O do (Go's ``exec.LookPath``), then the usual system directories
that PATH lacks (a daemon started by systemd or from cron may have a short PATH without
the sbin directories where Debian puts runc). Empty and relative PATH entries are
skipped: a daemon never runs a program from its working directory (Go's LookPath
refuses those results too)."""

from __future__ import annotations

import os
import shutil

#: Searched after the daemon's PATH.
SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def search_path() -> str:
    """The daemon's PATH (absolute entries), then :data:`SYSTEM_PATH`'s that it lacks."""
    own = [d for d in os.environ.get("PATH", "").split(os.pathsep) if os.path.isabs(d)]
    return os.pathsep.join(dict.fromkeys(own + SYSTEM_PATH.split(os.pathsep)))


def which(name: str) -> str:
    """``name`` on :func:`search_path`, "" when it is not there."""
    return shutil.which(name, path=search_path()) or ""
