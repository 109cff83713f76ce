"""Parsers for the text formats of cgroup files, and forgiving file reads.

Pure functions: a reader hands them a file's text (or a path to read); a file that
is missing or unreadable gives None or an empty result, because a cgroup can
vanish between two reads and a kernel may lack a file the next one has.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

#: Above this a limit means "none": the kernel rounds its "unlimited" down to a page
#: multiple, so it is never exactly 2^63-1 (containerd and cAdvisor use the same bound).
UNLIMITED = 1 << 62


@dataclass(frozen=True)
class IoEntry:
    """One block I/O counter of one device, as runc names them: ``op`` is "Read",
    "Write", ... (the cgroup v1 names; v2's rbytes/wbytes/rios/wios map onto them)."""

    major: int
    minor: int
    op: str
    value: int
    #: The device's name (metrics' "device" label), filled in by the reader.
    device: str = ""


@dataclass(frozen=True)
class PsiData:
    """One line of a pressure file: stall time so far (microseconds) and averages (%)."""

    total_us: int
    avg10: float
    avg60: float
    avg300: float


@dataclass(frozen=True)
class Psi:
    some: PsiData | None = None
    full: PsiData | None = None


def read_text(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read()
    except OSError:  # missing, gone mid-read (ENODEV), or not readable
        return None


def read_int(path: str) -> int | None:
    """A single number; None for a missing file, "max" or anything unparsable."""
    text = read_text(path)
    if text is None:
        return None
    try:
        return int(text.strip())
    except ValueError:
        return None


def limit(value: int | None) -> int | None:
    """A limit as read, or None when it means "unlimited"."""
    return None if value is None or value < 0 or value > UNLIMITED else value


def read_limit(path: str) -> int | None:
    """A limit file ("max", -1 or a huge number mean none)."""
    return limit(read_int(path))


def parse_flat_keyed(text: str) -> dict[str, int]:
    """``memory.stat``, ``cpu.stat``, ``memory.events``, ``memory.oom_control``: one
    "key value" a line."""
    out: dict[str, int] = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2:
            try:
                out[parts[0]] = int(parts[1])
            except ValueError:
                continue
    return out


def read_keyed(path: str) -> dict[str, int]:
    text = read_text(path)
    return parse_flat_keyed(text) if text is not None else {}


def read_ids(path: str) -> list[int] | None:
    """``cgroup.procs``, ``tasks``, ``cgroup.threads``: one id a line; None if missing."""
    text = read_text(path)
    if text is None:
        return None
    return [int(line) for line in text.split() if line.isdigit()]


def parse_cpu_max(text: str) -> tuple[int | None, int | None]:
    """v2 ``cpu.max`` ("quota period", quota "max" for none) -> (quota, period)."""
    parts = text.split()
    if len(parts) != 2:
        return None, None
    quota = None if parts[0] == "max" else _to_int(parts[0])
    return quota, _to_int(parts[1])


def weight_to_shares(weight: int) -> int | None:
    """v2 ``cpu.weight`` (1..10000) as v1 cpu shares (2..262144), by cAdvisor's linear
    conversion: what the kubelet's cAdvisor metrics report, though a runtime's own
    shares-to-weight mapping may not round-trip exactly."""
    if not 1 <= weight <= 10000:
        return None
    return 2 + (weight - 1) * 262142 // 9999


def parse_blkio(text: str) -> list[IoEntry]:
    """A v1 blkio statistics file: "MAJ:MIN Op value" lines and a final "Total value"
    (skipped). Per-device "Total" lines are kept, as runc and cAdvisor keep them."""
    out = []
    for line in text.splitlines():
        parts = line.split()
        if len(parts) != 3:
            continue
        dev, op, value = parts
        major, sep, minor = dev.partition(":")
        if not sep or not (major.isdigit() and minor.isdigit() and value.isdigit()):
            continue
        out.append(IoEntry(int(major), int(minor), op, int(value)))
    return out


#: v2 ``io.stat`` keys -> (table, v1 op name): "bytes" is io_service_bytes, "ios" is
#: io_serviced (runc's mapping, which cAdvisor reports).
_IO_STAT_KEYS = {"rbytes": ("bytes", "Read"), "wbytes": ("bytes", "Write"),
                 "rios": ("ios", "Read"), "wios": ("ios", "Write")}


def parse_io_stat(text: str) -> tuple[list[IoEntry], list[IoEntry]]:
    """v2 ``io.stat`` ("MAJ:MIN rbytes=.. wbytes=.. rios=.. wios=.. dbytes=.. dios=..")
    -> (bytes entries, operation-count entries)."""
    by_bytes: list[IoEntry] = []
    by_ops: list[IoEntry] = []
    for line in text.splitlines():
        parts = line.split()
        if not parts:
            continue
        major, sep, minor = parts[0].partition(":")
        if not sep or not (major.isdigit() and minor.isdigit()):
            continue
        for item in parts[1:]:
            key, eq, value = item.partition("=")
            if not eq or key not in _IO_STAT_KEYS or not value.isdigit():
                continue
            table, op = _IO_STAT_KEYS[key]
            entry = IoEntry(int(major), int(minor), op, int(value))
            (by_bytes if table == "bytes" else by_ops).append(entry)
    return by_bytes, by_ops


def parse_psi(text: str) -> Psi | None:
    """A ``*.pressure`` file: "some|full avg10=.. avg60=.. avg300=.. total=.." lines."""
    lines: dict[str, PsiData] = {}
    for line in text.splitlines():
        parts = line.split()
        if not parts or parts[0] not in ("some", "full"):
            continue
        fields = dict(p.partition("=")[::2] for p in parts[1:])
        try:
            lines[parts[0]] = PsiData(total_us=int(fields["total"]),
                                      avg10=float(fields["avg10"]),
                                      avg60=float(fields["avg60"]),
                                      avg300=float(fields["avg300"]))
        except (KeyError, ValueError):
            continue
    if not lines:
        return None
    return Psi(some=lines.get("some"), full=lines.get("full"))


def read_psi(directory: str, resource: str) -> Psi | None:
    text = read_text(os.path.join(directory, f"{resource}.pressure"))
    return parse_psi(text) if text is not None else None


def _to_int(text: str) -> int | None:
    try:
        return int(text)
    except ValueError:
        return None


__all__ = ["UNLIMITED", "IoEntry", "Psi", "PsiData", "limit", "parse_blkio", "parse_cpu_max",
           "parse_flat_keyed", "parse_io_stat", "parse_psi", "read_ids", "read_int",
           "read_keyed", "read_limit", "read_psi", "read_text", "weight_to_shares"]
