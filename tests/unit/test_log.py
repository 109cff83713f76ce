"""Log formats: journald's priority prefix and the JOURNAL_STREAM detection."""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path

import pytest

from pycrid.log import JournaldFormatter, TextFormatter, choose_format, stderr_is_journal


def _record(level: int, msg: str, exc: bool = False, **extra: object) -> logging.LogRecord:
    info = None
    if exc:
        try:
            raise ValueError("boom")
        except ValueError:
            info = sys.exc_info()
    rec = logging.LogRecord("pycrid.core", level, __file__, 1, msg, (), info)
    for k, v in extra.items():
        setattr(rec, k, v)
    return rec


@pytest.mark.parametrize(("level", "prio"), [
    (logging.CRITICAL, 3), (logging.ERROR, 3), (logging.WARNING, 4), (logging.INFO, 6),
    (logging.DEBUG, 7), (5, 7),
])
def test_priority_prefix(level: int, prio: int) -> None:
    assert JournaldFormatter().format(_record(level, "hi")) == f"<{prio}>pycrid.core: hi"


def test_extras_kept_and_no_timestamp() -> None:
    line = JournaldFormatter().format(_record(logging.INFO, "call", rpc="/x/Y", request_id="7"))
    assert line == "<6>pycrid.core: call [rpc=/x/Y request_id=7]"
    text = TextFormatter().format(_record(logging.INFO, "call"))
    assert text[:4].isdigit()  # the text format starts with the time; journald's does not


def test_traceback_lines_keep_the_priority() -> None:
    lines = JournaldFormatter().format(_record(logging.ERROR, "failed", exc=True)).splitlines()
    assert lines[0] == "<3>pycrid.core: failed"
    assert len(lines) > 2 and all(line.startswith("<3>") for line in lines)
    assert lines[-1] == "<3>ValueError: boom"


def test_journal_stream_must_match_the_fd(tmp_path: Path) -> None:
    f = tmp_path / "stream"
    f.write_text("")
    fd = os.open(f, os.O_WRONLY)
    try:
        st = os.fstat(fd)
        env = {"JOURNAL_STREAM": f"{st.st_dev}:{st.st_ino}"}
        assert stderr_is_journal(env, fd)
        assert choose_format("text", env, fd) == "journald"
        assert choose_format("json", env, fd) == "json"  # an explicit choice stays
        # Inherited from a parent but the fd was redirected elsewhere: not the journal.
        other = {"JOURNAL_STREAM": f"{st.st_dev}:{st.st_ino + 1}"}
        assert not stderr_is_journal(other, fd)
        assert choose_format("text", other, fd) == "text"
        for bad in ("", "x:y", "12", f"{st.st_dev}:"):
            assert not stderr_is_journal({"JOURNAL_STREAM": bad}, fd)
        assert not stderr_is_journal({}, fd)
    finally:
        os.close(fd)
