"""PullImage of multi-layer images from the local registry, one per layer kind (random and
text-like data, gzip, zstd, uncompressed, zstd:chunked: ``bench.pull_kinds``), each beside
two floors timed in the same round: a plain HTTP download of the same manifest, config and
layer blobs, and a minimal pull (the same download, with the work every runtime must do
on a layer as it arrives: ``bench.pull_floors``). With ``--pull-against`` another CRI
runtime (containerd) pulls the same images in the same rounds, and each PullImage is also
shown against its pull of the same kind."""

from __future__ import annotations

import contextlib
import functools
import os
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from cri_api.v1 import api_pb2 as pb
from tests.support import interop
from tests.support.daemon import CRIClient

from bench.common import Target, timed
from bench.pull_floors import CONCURRENCY, REPO, http_download, minimal_pull
from bench.pull_kinds import KINDS, Kind, Pushed, layer_sizes, push_kinds
from bench.report import Section
from pycrid.bench.procs import socket_owner

MIB = 1 << 20


@dataclass(frozen=True)
class Options:
    """The section's knobs (``--pull-*``)."""

    total_mb: int
    n_layers: int
    rounds: int
    kinds: tuple[str, ...] = tuple(k.name for k in KINDS)
    #: ``unix:///path`` of a runtime to pull the same images in the same rounds, or "".
    against: str = ""


def cpu_ms(pid: int | None) -> float | None:
    """CPU time (user + system) the process has used so far, or None if unknown."""
    if pid is None:
        return None
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) * 1000 / os.sysconf("SC_CLK_TCK")


@dataclass
class Runtime:
    """A runtime that pulls: the one under test, or the one it is compared with."""

    name: str
    client: Any  # CRIClient
    pid: int | None

    def pull(self, ref: str) -> tuple[float, float | None]:
        """(wall ms, the daemon's CPU ms or None)."""
        before = cpu_ms(self.pid)
        ms, _ = timed(lambda: self.client.pull(ref, timeout=600))
        after = cpu_ms(self.pid)
        return ms, None if before is None or after is None else after - before


def blob_gets(target: Target, layers: list[str], since: int) -> int:
    """Layer blob GETs in the registry's access log after byte offset ``since``."""
    with open(target.registry.log_path, errors="replace") as f:
        f.seek(since)
        text = f.read()
    return sum(text.count(f'"GET /v2/{REPO}/blobs/{d}') for d in layers)


@dataclass
class Variant:
    """One layer kind's image and its timings."""

    kind: Kind
    image: Pushed
    ref: str
    pull_ms: dict[str, list[float]] = field(default_factory=dict)  # runtime name -> times
    cpu_ms: dict[str, list[float]] = field(default_factory=dict)  # runtime name -> CPU
    http_ms: list[float] = field(default_factory=list)
    minimal_ms: list[float] = field(default_factory=list)
    missing_downloads: dict[str, int] = field(default_factory=dict)

    def pull(self, target: Target, rt: Runtime) -> None:
        offset = target.registry.log_path.stat().st_size
        ms, cpu = rt.pull(self.ref)
        self.pull_ms.setdefault(rt.name, []).append(ms)
        if cpu is not None:
            self.cpu_ms.setdefault(rt.name, []).append(cpu)
        time.sleep(0.05)  # the registry writes its access log line after the body
        layers = [d for d, _ in self.image.layers]
        if blob_gets(target, layers, offset) < len(layers):
            self.missing_downloads[rt.name] = self.missing_downloads.get(rt.name, 0) + 1
        rt.client.remove(self.ref)  # untimed: the next round downloads again

    def download(self, target: Target) -> None:
        ms, got = timed(lambda: http_download(target.registry.port, self.kind.tag,
                                              self.image.config_digest,
                                              [d for d, _ in self.image.layers]))
        if got != self.image.bytes:
            raise RuntimeError(f"HTTP download got {got} bytes, expected {self.image.bytes}")
        self.http_ms.append(ms)

    def minimal(self, target: Target) -> None:
        ms, got = timed(lambda: minimal_pull(
            target.registry.port, self.kind.tag, self.image.config_digest,
            list(self.image.layers), self.kind.decoder, target.base))
        if got != self.image.bytes:
            raise RuntimeError(f"minimal pull got {got} bytes, expected {self.image.bytes}")
        self.minimal_ms.append(ms)


def _name(client: Any) -> str:
    return str(client.runtime.Version(pb.VersionRequest(), timeout=30).runtime_name)


@contextlib.contextmanager
def runtimes(target: Target, against: str) -> Iterator[list[Runtime]]:
    """The runtime under test, then the one to compare with (its client closed at the end)."""
    rts = [Runtime(_name(target.client), target.client, target.daemon_pid)]
    if not against:
        yield rts
        return
    client = CRIClient(against.removeprefix("unix://"))
    try:
        name = _name(client)
        rts.append(Runtime(name if name != rts[0].name else f"{name} ({against})", client,
                           socket_owner(against.removeprefix("unix://"))))
        yield rts
    finally:
        client.close()


def rounds_of(target: Target, variants: list[Variant], rts: list[Runtime],
              rounds: int) -> None:
    """Each round times every kind's pulls and floors, in an order that rotates from round
    to round (which step goes first, and which kind)."""
    for i in range(rounds):
        steps: list[Callable[[], None]] = []
        for v in variants if i % 2 == 0 else reversed(variants):
            ops: list[Callable[[], None]] = [
                *(functools.partial(v.pull, target, rt) for rt in rts),
                functools.partial(v.download, target), functools.partial(v.minimal, target)]
            k = i % len(ops)
            steps += ops[k:] + ops[:k]
        for step in steps:
            step()
        print(f"\rpull {i + 1}/{rounds}", end="", file=sys.stderr, flush=True)
    print(file=sys.stderr)


def report(sec: Section, v: Variant, rts: list[Runtime], opts: Options) -> None:
    """The figures and floors of one kind."""
    mb, s = v.image.bytes / MIB, v.kind.suffix
    floor = f"HTTP download{s}"
    sec.floor(floor, v.http_ms)
    sec.floor(f"{floor} throughput", [mb / (ms / 1000) for ms in v.http_ms], unit="MB/s")
    minimal = f"minimal pull{s}"
    sec.floor(minimal, v.minimal_ms)
    ours = v.pull_ms[rts[0].name]
    sec.figure(f"PullImage{s} ({opts.total_mb} MiB, {opts.n_layers} layers)", ours,
               floor=floor)
    sec.figure(f"PullImage{s} throughput", [mb / (ms / 1000) for ms in ours],
               unit="MB/s", floor=f"{floor} throughput")
    sec.figure(f"PullImage{s} against the minimal pull", ours, floor=minimal)
    for rt in rts[1:]:
        theirs = f"{rt.name} PullImage{s}"
        sec.floor(theirs, v.pull_ms[rt.name])
        sec.figure(f"PullImage{s} against {rt.name}", ours, floor=theirs)
        sec.figure(f"{rt.name} PullImage{s} against the minimal pull", v.pull_ms[rt.name],
                   floor=minimal)
        mine, other = v.cpu_ms.get(rts[0].name), v.cpu_ms.get(rt.name)
        if mine and other:  # the daemons' own CPU: less at the mercy of a busy machine
            sec.floor(f"{rt.name} PullImage{s} daemon CPU", other)
            sec.figure(f"PullImage{s} daemon CPU against {rt.name}", mine,
                       floor=f"{rt.name} PullImage{s} daemon CPU")
    for name, n in v.missing_downloads.items():
        sec.notes.append(f"{v.kind.name}: {n} of {opts.rounds} pulls by {name} did not "
                         "fetch every layer from the registry (content kept after "
                         "RemoveImage?)")


def run(target: Target, opts: Options) -> Section:
    sec = Section("pull")
    kinds = [k for k in KINDS if k.name in opts.kinds]
    if any(k.compression == "zstd:chunked" for k in kinds) and interop.binary("skopeo") is None:
        kinds = [k for k in kinds if k.compression != "zstd:chunked"]
        sec.notes.append(f"zstd:chunked kinds left out: no {interop.ROOT / 'bin' / 'skopeo'} "
                         "(upstream skopeo makes them)")
    if not kinds:
        raise RuntimeError("no layer kind to pull")
    print(f"building {opts.total_mb} MiB images of {opts.n_layers} layers: "
          f"{', '.join(k.name for k in kinds)} ...", file=sys.stderr)
    pushed = push_kinds(target.registry, kinds, opts.total_mb, opts.n_layers)
    variants = [Variant(k, pushed[k.name], f"{target.registry.host}/{REPO}:{k.tag}")
                for k in kinds]
    with runtimes(target, opts.against) as rts:
        try:
            rounds_of(target, variants, rts, opts.rounds)
        finally:
            for rt in rts:
                refs = {v.ref for v in variants}
                for img in rt.client.list():
                    if refs & set(img.repo_tags):
                        with contextlib.suppress(Exception):
                            rt.client.remove(img.id)
        for v in variants:
            report(sec, v, rts, opts)
    sec.notes.append(
        "MB/s is MiB of manifest, config and layer blobs per second; kinds: random data "
        "(one file a layer, does not compress) and text-like data (files of 512 B-64 KiB, "
        "about 3x under gzip), each gzip, zstd and uncompressed, the text also zstd:chunked "
        f"(skopeo); the HTTP floor fetches {CONCURRENCY} blobs at a time and keeps nothing; "
        "the minimal pull fetches the same way and hashes, writes and decompresses each "
        "layer as it arrives, hashes and writes its tar as one file, fsyncs the blob (no "
        "snapshot, no untar, no metadata)")
    sizes = layer_sizes(opts.total_mb, opts.n_layers)

    def image(v: Variant) -> dict[str, Any]:
        return {"kind": v.kind.name, "ref": v.ref, "digest": v.image.manifest_digest,
                "layers": opts.n_layers, "layer_mib": sizes, "bytes": v.image.bytes,
                "compression": v.kind.compression, "content": v.kind.content}

    sec.extra.update({"image": image(variants[0]), "images": [image(v) for v in variants],
                      "rounds": opts.rounds, "concurrency": CONCURRENCY,
                      "against": opts.against or None})
    return sec
