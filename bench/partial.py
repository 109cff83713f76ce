"""Partial pulls (issue 39): an image v1 of ``--partial-mb`` MiB in ``--partial-layers``
layers of many files and a rebuild v2 with 5% of every layer's files changed, both
zstd:chunked by skopeo (``../shared/interop``), plus v2 with plain zstd layers of the
same tars. Each round, in the runtime under test:

- v1 (untimed) then v2, timed, with the bytes the registry sent for v2 and the disk the
  two take (ImageFsInfo), then both removed;
- v2 on a node with nothing of it (the floor of the line above), removed;
- v2 with plain zstd layers, nothing to reuse (the floor of the line above), removed;
- with ``--pull-against`` (containerd, say), v2 and v1-then-v2 by that runtime too,
  so the ratios against it are taken in the same run;
- when this run started pycrid, v1 then v2 again by a second pycrid with
  ``use_hard_links = true``: its time, and its disk (shared files counted once);
- v2's layer tars unpacked from memory by pycrid's own unpacker in this process, one
  after another into a fresh directory: the file work of any pull of v2 (create, write,
  owner, mode, times of every file; the diff id hashed) with nothing fetched, decompressed,
  looked up or recorded. Partial pulls do that work too, so it bounds how far under a
  whole pull they can go on this machine.

Bytes fetched are read from the registry's access log (what it sent, whichever runtime
asked), so the figures compare runtimes on the same terms.
"""

from __future__ import annotations

import io
import re
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from cri_api.v1 import api_pb2 as pb
from tests.support import interop
from tests.support.chunked import app_layers, skopeo_chunked
from tests.support.daemon import CRIClient, running_daemon
from tests.support.images import build_image, push
from tests.support.pods import daemon_config

from bench.common import Target
from bench.report import Section
from bench.throttle import Throttle
from pycrid.bench.partial import Pulls, add_figures, cold, upgrade
from pycrid.images.unpack import extract

REPO = "bench/partial"
MIB = 1 << 20
_SENT = re.compile(r'"GET /v2/bench/partial[^ "]* HTTP/[0-9.]+" \d{3} (\d+)')


def registry_counter(log: Path) -> Callable[[], int]:
    """Bytes the registry has sent for this section's images so far (its access log)."""
    def sent() -> int:
        with open(log, errors="replace") as f:
            return sum(int(m[1]) for m in _SENT.finditer(f.read()))
    return sent


def images(target: Target, mb: int, n_layers: int, files: int,
           skopeo: Path) -> tuple[dict[str, str], list[bytes]]:
    """Build and push the images; their references by name, and v2's layer tars."""
    size = mb * MIB // (n_layers * files)
    print(f"building v1 and v2: {mb} MiB in {n_layers} layers of {files} files, "
          "zstd:chunked by skopeo, and v2 with plain zstd ...", file=sys.stderr)
    refs: dict[str, str] = {}
    v2_tars: list[bytes] = []
    for v in (1, 2):
        tars = app_layers(v, layers=n_layers, files=files, size=size, binary=0.25)
        skopeo_chunked(target.registry, build_image(tars, compression="none"),
                       f"{REPO}:v{v}", skopeo)
        refs[f"v{v}"] = f"{target.registry.host}/{REPO}:v{v}"
        if v == 2:
            push(target.registry, f"{REPO}-zstd", "v2", build_image(tars, compression="zstd"))
            refs["v2 zstd"] = f"{target.registry.host}/{REPO}-zstd:v2"
            v2_tars = tars
    return refs, v2_tars


def unpack_alone(tars: list[bytes], base: Path) -> float:
    """Milliseconds to unpack ``tars`` from memory, one after another, into a new
    directory under ``base`` (removed again), as a pull unpacks a layer it has."""
    where = Path(tempfile.mkdtemp(prefix="unpack-floor-", dir=base))
    try:
        started = time.perf_counter()
        for i, tar in enumerate(tars):
            root = where / str(i)
            root.mkdir()
            extract(io.BufferedReader(io.BytesIO(tar)), str(root), name=f"layer {i}",
                    has_lower=i > 0, allow_device_nodes=False)
        return (time.perf_counter() - started) * 1000
    finally:
        shutil.rmtree(where)


def run(target: Target, mb: int, n_layers: int, files: int, rounds: int,
        compare: str | None, compare_hosts: str | None = None,
        link_mbit: float = 0) -> Section:
    skopeo = interop.binary("skopeo")
    if skopeo is None:
        return Section("partial", skipped="needs skopeo (../shared/interop/bin/skopeo), "
                                          "the zstd:chunked producer")
    refs, v2_tars = images(target, mb, n_layers, files, skopeo)
    if not link_mbit:
        return _measure(target, refs, rounds, compare, compare_hosts, (mb, n_layers, files),
                        v2_tars=v2_tars)
    with Throttle(target.registry.port, link_mbit).running() as link:
        # The same registry behind a link of link_mbit Mbit/s (hosts.toml: plain http).
        host = f"127.0.0.1:{link.port}"
        refs = {k: v.replace(target.registry.host, host, 1) for k, v in refs.items()}
        sec = _measure(target, refs, rounds, compare, compare_hosts, (mb, n_layers, files),
                       host, v2_tars=v2_tars)
    sec.notes.append(f"every pull went through a link of {link_mbit:g} Mbit/s (a proxy "
                     "that caps the registry's answers; requests are not slowed)")
    sec.extra["link_mbit"] = link_mbit
    return sec


def _measure(target: Target, refs: dict[str, str], rounds: int, compare: str | None,
             compare_hosts: str | None, shape: tuple[int, int, int],
             host: str = "", *, v2_tars: list[bytes]) -> Section:
    sec = Section("partial")
    mb, n_layers, files = shape
    host = host or target.registry.host
    counter = registry_counter(target.registry.log_path)
    runs: dict[str, tuple[Pulls, Pulls]] = {"": (Pulls(), Pulls())}
    plain = Pulls()
    other = CRIClient(compare.removeprefix("unix://")) if compare else None
    hosts = Path(compare_hosts, host) if compare_hosts and other else None
    if hosts is not None and (hosts / "hosts.toml").exists():
        hosts = None  # written for the whole run already (the registry itself)
    if hosts is not None:  # plain http, no HTTPS try first
        hosts.mkdir(parents=True, exist_ok=True)
        (hosts / "hosts.toml").write_text(
            f'server = "http://{host}"\n\n[host."http://{host}"]\n'
            '  capabilities = ["pull", "resolve"]\n')
    name = "compared runtime"
    if other is not None:
        name = other.runtime.Version(pb.VersionRequest(), timeout=30).runtime_name
        runs[name] = (Pulls(), Pulls())
    linked = Pulls()
    unpacked: list[float] = []
    try:
        for i in range(rounds):
            steps = [lambda: upgrade(target.client, refs["v1"], refs["v2"], runs[""][0],
                                     counter),
                     lambda: cold(target.client, refs["v2"], runs[""][1], counter),
                     lambda: cold(target.client, refs["v2 zstd"], plain, counter)]
            if other is not None:
                steps += [lambda: upgrade(other, refs["v1"], refs["v2"], runs[name][0],
                                          counter),
                          lambda: cold(other, refs["v2"], runs[name][1], counter)]
            steps.append(lambda: unpacked.append(unpack_alone(v2_tars, target.base)))
            for step in steps if i % 2 == 0 else steps[::-1]:
                step()
            if target.daemon is not None:
                _with_hard_links(target, refs, linked, counter)
            print(f"\rpartial {i + 1}/{rounds}", end="", file=sys.stderr, flush=True)
        print(file=sys.stderr)
    finally:
        if other is not None:
            other.close()
        if hosts is not None:
            shutil.rmtree(hosts, ignore_errors=True)
    mine, theirs = runs[""], runs.get(name)
    # Nothing of v2 on the node: the whole image, manifest and config included.
    v2_size = statistics.median(mine[1].fetched)
    add_figures(sec, "v2", *mine)
    sec.floor("PullImage v2 plain zstd", plain.ms)
    sec.figure("PullImage v2 zstd:chunked, nothing to reuse (vs plain zstd)", mine[1].ms,
               floor="PullImage v2 plain zstd")
    sec.floor("bytes of v2 (a whole pull)", [b / 1024 for b in mine[1].fetched], unit="KiB")
    sec.figure("bytes fetched v2 after v1 (vs a whole v2)",
               [b / 1024 for b in mine[0].fetched], unit="KiB",
               floor="bytes of v2 (a whole pull)")
    if theirs is not None:
        sec.floor(f"{name}: PullImage v2", theirs[1].ms)
        sec.floor(f"{name}: PullImage v2 after v1", theirs[0].ms)
        sec.figure("PullImage v2 after v1 (vs the compared runtime's whole v2)", mine[0].ms,
                   floor=f"{name}: PullImage v2")
        sec.figure("PullImage v2, nothing to reuse (vs the compared runtime's)", mine[1].ms,
                   floor=f"{name}: PullImage v2")
        sec.figure(f"{name}: bytes fetched v2 after v1", [b / 1024 for b in theirs[0].fetched],
                   unit="KiB", floor="bytes of v2 (a whole pull)")
        # (Not its disk: containerd's ImageFsInfo is a figure its background loop
        # refreshes every few seconds, so a difference right after the pulls says nothing.)
    sec.floor("unpack v2's tars from memory, nothing fetched", unpacked)
    sec.figure("PullImage v2 after v1 (vs unpacking v2's tars alone)", mine[0].ms,
               floor="unpack v2's tars from memory, nothing fetched")
    sec.figure("PullImage v2, nothing to reuse (vs unpacking v2's tars alone)", mine[1].ms,
               floor="unpack v2's tars from memory, nothing fetched")
    if linked.ms:
        sec.figure("PullImage v2 after v1, use_hard_links", linked.ms,
                   floor="PullImage v2, nothing to reuse")
        sec.figure("disk of the old version and v2, use_hard_links",
                   [b / 1024 for b in linked.disk],
                   unit="KiB")
    sec.notes.append(
        f"v1 and v2 are {mb} MiB uncompressed in {n_layers} layers of {files} files (a "
        "quarter random bytes, the rest text); v2 rewrites every 20th file of each layer "
        f"and adds one; v2 is {v2_size / MIB:.1f} MiB as zstd:chunked; bytes are what the "
        "registry sent (its access log), manifests and configs included")
    sec.extra.update({"images": refs, "rounds": rounds, "v2_bytes": v2_size,
                      "compare": compare})
    return sec


def _with_hard_links(target: Target, refs: dict[str, str], into: Pulls,
                     counter: Callable[[], int]) -> None:
    """v1 then v2 by a second pycrid whose partial pulls share files by hard link."""
    base = target.base / "daemon-hard-links"
    section = '[plugins."pycrid.cri.v1.images"]\n'
    text = daemon_config(target.registry, target.images, base).replace(
        section, section + "use_hard_links = true\n", 1)
    with running_daemon(str(base), text, "--log-level", "info") as d:
        upgrade(d.client, refs["v1"], refs["v2"], into, counter)
