"""Streaming server latency and throughput: exec round trips and port-forward transfers,
each beside a plain TCP baseline measured in the same run.

Run from the repository root as root::

    .venv/bin/python -m bench.streaming [--iterations 200] [--mb 64] [--rounds 5]
                                        [--short-execs 20] [--json results.json]

Uses the environment of ``python -m bench`` (a local registry with the standard test images,
one ``pycrid serve`` subprocess configured as the e2e tests configure it) and one pod on
the CNI test network with two busybox containers: ``shell`` (``sleep 3600``, the exec
target) and ``source`` (``busybox httpd`` serving a file of M MiB of zeros made with dd).

1. Exec round trip. One interactive ``sh`` exec (stdin, stdout, stderr, no tty) over SPDY
   (v4.channel.k8s.io) and one over WebSocket (v5.channel.k8s.io) are kept open beside a
   connection to an asyncio echo server on 127.0.0.1 in this process. N times the client
   writes ``echo r<i>`` and waits until ``r<i>`` plus a newline ends the output read so
   far; the three transports take turns in a rotating order inside each iteration. The
   client is notified by the reader task as soon as bytes arrive (no polling).
   Also timed: whole short execs (Exec RPC, SPDY connect, ``true``, exit status).
2. Port-forward throughput. ``GET /big`` (M MiB) from the pod's httpd through a SPDY
   port-forward connection (one PortForward URL, one stream pair per transfer), directly
   from the host to the pod IP (the same httpd over the bridge, no pycrid), and from a
   Python server thread on 127.0.0.1 sending M MiB (the loopback floor); in rotating order
   each round. Each transfer is timed from before its connection (stream pair) is opened to
   the end of its data; MB/s is M MiB / seconds, in MiB.

Everything (pod, daemon, registry, the test bridge, ``ip_forward``, the temp dir) is
cleaned up on exit, Ctrl-C included.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import secrets
import socket
import statistics
import sys
import threading
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from cri_api.v1 import api_pb2 as pb
from tests.support.pods import container_cgroups, container_config, leftovers, pod_config
from tests.support.streams import SpdyCommand, SpdyPortForward, WebSocketCommand

from bench.common import Env, arm_signals, check_host, cri_env, is_worker, supervise
from pycrid.bench.scratch import interruptible, run_dir, said_left_behind

PROG = "bench.streaming"
MIB = 1 << 20
HTTP_PORT = 8080
SPDY_PROTOCOL = "v4.channel.k8s.io"
WS_PROTOCOL = "v5.channel.k8s.io"
RT_SPDY, RT_WS, RT_TCP = "exec spdy v4", "exec websocket v5", "tcp loopback echo"
SHORT_EXEC = "short exec (Exec+connect+true+status)"
TP_PF, TP_POD, TP_TCP = "port-forward spdy", "pod IP direct", "tcp loopback"
STEP_TIMEOUT = 30.0


# ---------------------------------------------------------------------------
# Round trips (the test clients set ``arrived`` whenever output comes in)


class EchoClient:
    """A connection to the loopback echo server, read the same way: a reader task appends
    to ``out`` and sets ``arrived``."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.out = bytearray()
        self.arrived = asyncio.Event()
        self._task = asyncio.create_task(self._read())

    async def _read(self) -> None:
        while chunk := await self.reader.read(65536):
            self.out += chunk
            self.arrived.set()
        self.arrived.set()

    async def write_stdin(self, data: bytes) -> None:
        self.writer.write(data)
        await self.writer.drain()

    async def close(self) -> None:
        self.writer.close()
        with contextlib.suppress(Exception):
            await self.writer.wait_closed()
        self._task.cancel()
        with contextlib.suppress(BaseException):
            await self._task


async def _echo_handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except ConnectionError:
        pass
    finally:
        writer.close()


async def round_trip(session: Any, i: int) -> float:
    """Write ``echo r<i>``; milliseconds until the output ends with ``r<i>\\n``."""
    want = f"r{i}\n".encode()
    loop = asyncio.get_running_loop()
    deadline = loop.time() + STEP_TIMEOUT
    t0 = time.perf_counter()
    await session.write_stdin(f"echo r{i}\n".encode())
    while not session.out.endswith(want):
        session.arrived.clear()
        remaining = deadline - loop.time()
        if remaining <= 0:
            raise TimeoutError(f"no echo of r{i}; got {bytes(session.out[-200:])!r}")
        await asyncio.wait_for(session.arrived.wait(), remaining)
    return (time.perf_counter() - t0) * 1000.0


# ---------------------------------------------------------------------------
# Transfers


class LoopbackSource:
    """A thread with a blocking listening socket on 127.0.0.1: every connection gets its
    request read (up to the blank line), then ``size`` bytes of zeros, then EOF."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self._stop = False
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        chunk = memoryview(bytes(MIB))
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            if self._stop:
                conn.close()
                return
            with conn:
                try:
                    got = b""
                    while b"\r\n\r\n" not in got:
                        data = conn.recv(4096)
                        if not data:
                            break
                        got += data
                    left = self.size
                    while left > 0:
                        n = min(left, len(chunk))
                        conn.sendall(chunk[:n])
                        left -= n
                except OSError:
                    pass

    def close(self) -> None:
        self._stop = True
        with contextlib.suppress(OSError):
            socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
        self.sock.close()
        self._thread.join(5)


async def tcp_download(host: str, port: int, request: bytes) -> int:
    """Bytes received on one TCP connection after sending ``request``, until EOF."""
    reader, writer = await asyncio.open_connection(host, port)
    try:
        writer.write(request)
        await writer.drain()
        total = 0
        while chunk := await reader.read(65536):
            total += len(chunk)
        return total
    finally:
        writer.close()
        with contextlib.suppress(Exception):
            await writer.wait_closed()


async def pf_download(pf: SpdyPortForward, rid: str, port: int,
                      request: bytes) -> tuple[int, bytes]:
    """One forwarded connection (a new error + data stream pair on ``pf``): send
    ``request``, count the bytes of the data stream until its end; (bytes, error text)."""
    client = pf.client
    headers = {"port": str(port), "requestID": rid}
    error = await client.open({**headers, "streamType": "error"}, fin=True)
    data = await client.open({**headers, "streamType": "data"})
    await client.send(data, request, fin=True)
    total = 0
    while chunk := await client.read(data):
        total += len(chunk)
    return total, await client.read_all(error)


# ---------------------------------------------------------------------------
# Measuring


def percentile(vals: list[float], q: int) -> float:
    if len(vals) < 2:
        return vals[0]
    return statistics.quantiles(vals, n=100, method="inclusive")[q - 1]


def latency_stats(vals: list[float]) -> dict[str, Any]:
    return {"median_ms": statistics.median(vals), "p90_ms": percentile(vals, 90),
            "p99_ms": percentile(vals, 99), "min_ms": min(vals), "max_ms": max(vals),
            "n": len(vals)}


def exec_url(env: Env, cid: str, cmd: list[str], **kw: Any) -> str:
    return str(env.daemon.client.runtime.Exec(pb.ExecRequest(
        container_id=cid, cmd=cmd, stdout=True, **kw), timeout=30).url)


async def measure_latency(env: Env, cid: str, n: int, warmup: int, short_execs: int,
                          result: dict[str, Any]) -> None:
    spdy = await SpdyCommand.start(exec_url(env, cid, ["sh"], stdin=True, stderr=True),
                                   stdin=True, protocols=(SPDY_PROTOCOL,))
    ws = await WebSocketCommand.start(exec_url(env, cid, ["sh"], stdin=True, stderr=True),
                                      protocols=(WS_PROTOCOL,))
    server = await asyncio.start_server(_echo_handler, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    echo = EchoClient(*await asyncio.open_connection("127.0.0.1", port))
    result["protocols"] = {"spdy": spdy.client.protocol, "websocket": ws.ws.protocol}
    sessions: list[tuple[str, Any]] = [(RT_SPDY, spdy), (RT_WS, ws), (RT_TCP, echo)]
    samples: dict[str, list[float]] = {name: [] for name, _ in sessions}
    try:
        for i in range(warmup + n):
            k = i % len(sessions)
            for name, session in sessions[k:] + sessions[:k]:
                ms = await round_trip(session, i)
                if i >= warmup:
                    samples[name].append(ms)
            if (i + 1) % 20 == 0 or i + 1 == warmup + n:
                print(f"\rexec round trips {i + 1}/{warmup + n}", end="", file=sys.stderr,
                      flush=True)
        print(file=sys.stderr)
        for name, session in ((RT_SPDY, spdy), (RT_WS, ws)):
            await session.write_stdin(b"exit 0\n")
            end = await session.wait(limit=STEP_TIMEOUT)
            if end.exit_code != 0 or end.stderr:
                raise RuntimeError(f"{name}: shell ended with {end.error!r}, "
                                   f"stderr {end.stderr!r}")
    finally:
        for session in (spdy, ws, echo):
            with contextlib.suppress(Exception):
                await session.close()
        server.close()
        await server.wait_closed()

    short: list[float] = []
    for i in range(warmup // 5 + short_execs):
        t0 = time.perf_counter()
        session = await SpdyCommand.start(exec_url(env, cid, ["true"]), stdin=False,
                                          stderr=False, protocols=(SPDY_PROTOCOL,))
        end = await session.wait(limit=STEP_TIMEOUT)
        ms = (time.perf_counter() - t0) * 1000.0
        if end.exit_code != 0:
            raise RuntimeError(f"exec true ended with {end.error!r}")
        if i >= warmup // 5:
            short.append(ms)
    samples[SHORT_EXEC] = short
    result["round_trip"] = {name: latency_stats(v) for name, v in samples.items()
                            if name != SHORT_EXEC}
    base = result["round_trip"][RT_TCP]["median_ms"]
    result["round_trip_ratio"] = {f"{name} / {RT_TCP}": s["median_ms"] / base
                                  for name, s in result["round_trip"].items()
                                  if name != RT_TCP and base > 0}
    result["short_exec"] = latency_stats(short)
    result["samples_ms"] = samples


async def wait_source(pf: SpdyPortForward, limit: float = 120.0) -> None:
    """Until the pod's httpd serves /ok (written after the big file)."""
    deadline = time.monotonic() + limit
    last = b""
    while time.monotonic() < deadline:
        with contextlib.suppress(Exception):
            response, error = await pf.request(HTTP_PORT, b"GET /ok HTTP/1.0\r\n\r\n",
                                               limit=10)
            if response.startswith(b"HTTP/1.") and b" 200 " in response.split(b"\r\n")[0]:
                return
            last = error or response[:200]
        await asyncio.sleep(0.2)
    raise RuntimeError(f"the pod's httpd never served /ok: {last!r}")


async def measure_throughput(env: Env, sid: str, pod_ip: str, mb: int, rounds: int,
                             result: dict[str, Any]) -> None:
    size = mb * MIB
    request = b"GET /big HTTP/1.0\r\nHost: bench\r\n\r\n"
    url = str(env.daemon.client.runtime.PortForward(pb.PortForwardRequest(
        pod_sandbox_id=sid, port=[HTTP_PORT]), timeout=30).url)
    pf = await SpdyPortForward.connect(url)
    source = LoopbackSource(size)
    rids = (f"bench-{i}" for i in range(1_000_000))
    notes: list[str] = []
    direct_ok = True

    async def via_pf() -> int:
        got, error = await pf_download(pf, next(rids), HTTP_PORT, request)
        if error:
            raise RuntimeError(f"port-forward error: {error!r}")
        return got

    async def via_pod_ip() -> int:
        return await tcp_download(pod_ip, HTTP_PORT, request)

    async def via_loopback() -> int:
        return await tcp_download("127.0.0.1", source.port, request)

    paths: list[tuple[str, Callable[[], Awaitable[int]]]] = [
        (TP_PF, via_pf), (TP_POD, via_pod_ip), (TP_TCP, via_loopback)]
    seconds: dict[str, list[float]] = {name: [] for name, _ in paths}
    try:
        await wait_source(pf)
        # One untimed transfer each: page cache, connection paths, the file fully written.
        for name, fn in paths:
            try:
                got = await asyncio.wait_for(fn(), 120)
                if got < size:
                    raise RuntimeError(f"{name}: got {got} bytes, want at least {size}")
            except (OSError, TimeoutError) as e:
                if name != TP_POD:
                    raise
                direct_ok = False
                notes.append(f"{TP_POD}: cannot reach {pod_ip}:{HTTP_PORT} from the host: {e}")
        for r in range(rounds):
            for name, fn in paths[r % 3:] + paths[:r % 3]:
                if name == TP_POD and not direct_ok:
                    continue
                t0 = time.perf_counter()
                got = await asyncio.wait_for(fn(), 300)
                dt = time.perf_counter() - t0
                if got < size:
                    raise RuntimeError(f"{name}: got {got} bytes, want at least {size}")
                seconds[name].append(dt)
            print(f"\rtransfers: round {r + 1}/{rounds}", end="", file=sys.stderr, flush=True)
        print(file=sys.stderr)
    finally:
        await pf.close()
        source.close()
    tp: dict[str, Any] = {}
    for name, secs in seconds.items():
        if not secs:
            tp[name] = None
            continue
        rates = [mb / s for s in secs]
        tp[name] = {"mb_per_s": statistics.median(rates), "min_mb_per_s": min(rates),
                    "max_mb_per_s": max(rates), "seconds": secs, "n": len(secs)}
    result["throughput"] = tp
    ratios: dict[str, float | None] = {}
    for base in (TP_TCP, TP_POD):
        b, s = tp.get(base), tp.get(TP_PF)
        ratios[f"{TP_PF} / {base}"] = (s["mb_per_s"] / b["mb_per_s"]
                                       if b and s and b["mb_per_s"] > 0 else None)
    result["throughput_ratio"] = ratios
    result["notes"] = notes


def setup_pod(env: Env, mb: int) -> tuple[str, str, str]:
    """The pod, its shell container and its file source; (pod id, shell id, pod IP)."""
    pods = env.pods
    config = pod_config("bench-streaming-" + secrets.token_hex(3))
    sid = pods.run(config)
    cid = pods.run_container(sid, container_config(env.busybox, "shell",
                                                   command=["sleep", "3600"]), config)
    script = (f"mkdir -p /www && dd if=/dev/zero of=/www/big bs=1M count={mb} 2>/dev/null "
              f"&& echo ok > /www/ok && exec httpd -f -p {HTTP_PORT} -h /www")
    pods.run_container(sid, container_config(env.busybox, "source",
                                             command=["sh", "-c", script]), config)
    ip = str(pods.pod_status(sid).status.network.ip)
    return sid, cid, ip


# ---------------------------------------------------------------------------
# Report


def print_report(result: dict[str, Any]) -> None:
    n = result["iterations"]
    print(f"\nexec round trip: 'echo r<i>' line in, 'r<i>' line out, {n} iterations"
          " (milliseconds)\n")
    rows = {**result["round_trip"], SHORT_EXEC: result["short_exec"]}
    width = max(len(k) for k in rows) + 2
    print(f"{'transport':<{width}}{'median':>9}{'p90':>9}{'p99':>9}{'min':>9}{'max':>9}"
          f"{'n':>6}")
    print("-" * (width + 51))
    for name, s in rows.items():
        print(f"{name:<{width}}{s['median_ms']:>9.2f}{s['p90_ms']:>9.2f}{s['p99_ms']:>9.2f}"
              f"{s['min_ms']:>9.2f}{s['max_ms']:>9.2f}{s['n']:>6}")
    print()
    for name, r in result["round_trip_ratio"].items():
        print(f"{name} = {r:.1f}x  (medians)")

    mb, rounds = result["mb"], result["rounds"]
    print(f"\nthroughput: {mb} MiB from the pod (or a loopback server) to this process,"
          f" {rounds} rounds (MiB/s)\n")
    width = max(len(k) for k in result["throughput"]) + 2
    print(f"{'path':<{width}}{'median':>10}{'min':>10}{'max':>10}")
    print("-" * (width + 30))
    for name, s in result["throughput"].items():
        if s is None:
            print(f"{name:<{width}}{'n/a':>10}{'n/a':>10}{'n/a':>10}")
            continue
        print(f"{name:<{width}}{s['mb_per_s']:>10.1f}{s['min_mb_per_s']:>10.1f}"
              f"{s['max_mb_per_s']:>10.1f}")
    print()
    for name, r in result["throughput_ratio"].items():
        print(f"{name} = " + ("n/a" if r is None else f"{r:.2f}x") + "  (medians)")
    for note in result.get("notes", []):
        print(f"note: {note}")


# ---------------------------------------------------------------------------


async def run(env: Env, args: argparse.Namespace, result: dict[str, Any]) -> None:
    sid, cid, ip = setup_pod(env, args.mb)
    result["pod_ip"] = ip
    await measure_latency(env, cid, args.iterations, args.warmup, args.short_execs, result)
    await measure_throughput(env, sid, ip, args.mb, args.rounds, result)


@interruptible
def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not is_worker():
        return supervise(argv, PROG)
    ap = argparse.ArgumentParser(prog=f"python -m {PROG}", description=__doc__.split("\n")[0])
    ap.add_argument("--iterations", "-n", type=int, default=200,
                    help="exec round trips per transport (default 200)")
    ap.add_argument("--warmup", type=int, default=10,
                    help="untimed round trips first (default 10)")
    ap.add_argument("--short-execs", type=int, default=20,
                    help="whole short execs timed (default 20)")
    ap.add_argument("--mb", "-m", type=int, default=64,
                    help="MiB per transfer (default 64)")
    ap.add_argument("--rounds", type=int, default=5,
                    help="transfers per path (default 5)")
    ap.add_argument("--json", metavar="PATH", help="also write the results as JSON here")
    ap.add_argument("--keep", action="store_true", help="keep the temp dir (logs) on exit")
    args = ap.parse_args(argv)
    if min(args.iterations, args.short_execs, args.mb, args.rounds) < 1 or args.warmup < 0:
        ap.error("--iterations, --short-execs, --mb and --rounds must be at least 1")
    check_host(PROG)
    arm_signals()

    t_start = time.monotonic()
    cgroups_before = set(container_cgroups())
    result: dict[str, Any] = {"iterations": args.iterations, "warmup": args.warmup,
                              "short_execs": args.short_execs, "mb": args.mb,
                              "rounds": args.rounds}
    left: list[str] = []
    with run_dir("pycrid-bs-", args.keep) as base:
        print("starting registry and pycrid ...", file=sys.stderr)
        try:
            with cri_env(base) as env:
                asyncio.run(run(env, args, result))
        finally:
            dbase = base / "daemon"
            if (dbase / "config.toml").exists():
                left = [x for x in leftovers(str(dbase / "root"), str(dbase / "state"))
                        if not (x.startswith("cgroup ") and x[7:] in cgroups_before)]
    if said_left_behind(left):
        return 1

    print_report(result)
    if args.json:
        result = {**result, "wall_seconds": round(time.monotonic() - t_start, 2),
                  "host": {"cpus": os.cpu_count(), "kernel": os.uname().release}}
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
        print(f"\nwrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
