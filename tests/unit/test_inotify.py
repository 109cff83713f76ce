"""The inotify wrapper's errors: a full watch table is not a full disk."""

from __future__ import annotations

import ctypes
import errno
from pathlib import Path
from typing import Any

import pytest

from pycrid import inotify
from pycrid.errors import ResourceExhausted
from pycrid.network import pod_networks


class _FullWatchTable:
    """libc whose inotify_add_watch fails as it does at fs.inotify.max_user_watches."""

    def __init__(self, real: Any) -> None:
        self._real = real

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)

    def inotify_add_watch(self, *_: Any) -> int:
        ctypes.set_errno(errno.ENOSPC)
        return -1


def test_a_full_watch_table_is_named_and_the_cni_watch_retries(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(inotify, "_libc", _FullWatchTable(inotify._libc))
    ino = inotify.Inotify()
    try:
        with pytest.raises(ResourceExhausted, match="inotify watch limit"):
            ino.add_watch(str(tmp_path), inotify.CREATE)
    finally:
        ino.close()
    # The CNI config watch treats it as "not yet" and tries again later.
    assert pod_networks._try_watch(str(tmp_path)) is None
