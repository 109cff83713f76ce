"""Where pycrid looks for the programs it runs (runc, conmon, runsc, CRIU) when the
config names none: the usual system directories, whatever the daemon's own PATH is
(a daemon started by systemd may have a short one)."""

from __future__ import annotations

import shutil

SEARCH_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def which(name: str) -> str:
    """``name`` on :data:`SEARCH_PATH`, "" when it is not there."""
    return shutil.which(name, path=SEARCH_PATH) or ""
