"""The scratch directory of one benchmark run and how a run ends when it is cut short.

Every benchmark keeps its daemon, registry and logs under one temporary directory; it goes
at the end of the run however the run ends, unless the user asked to keep it for its logs.
"""

from __future__ import annotations

import contextlib
import functools
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import ParamSpec

P = ParamSpec("P")

INTERRUPTED = 130
"""The status a shell gives a process ended by SIGINT; a run cut by Ctrl-C exits with it."""


@contextlib.contextmanager
def run_dir(prefix: str, keep: bool) -> Iterator[Path]:
    """A fresh directory for one run, removed when the block ends (said, not removed, with
    *keep*)."""
    base = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        yield base
    finally:
        if keep:
            print(f"kept {base}", file=sys.stderr)
        else:
            shutil.rmtree(base, ignore_errors=True)


def interruptible(main: Callable[P, int]) -> Callable[P, int]:
    """Ctrl-C ends *main* with INTERRUPTED once the blocks it was in have cleaned up,
    instead of a traceback."""

    @functools.wraps(main)
    def run(*args: P.args, **kwargs: P.kwargs) -> int:
        try:
            return main(*args, **kwargs)
        except KeyboardInterrupt:
            print("\ninterrupted; cleaned up", file=sys.stderr)
            return INTERRUPTED

    return run


def said_left_behind(left: list[str]) -> bool:
    """Print what a run left on the host; True when it left anything."""
    if left:
        print("left behind:\n  " + "\n  ".join(left), file=sys.stderr)
    return bool(left)
