"""Exec, attach and port-forward end to end: the CRI call returns a URL, a test client
(or the real crictl, when ../shared/interop has it) speaks SPDY or WebSocket to it, and a
real process in a real container answers."""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import re
import secrets
import select
import shutil
import signal
import struct
import subprocess
import termios
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from cri_api.v1 import api_pb2 as pb

from tests.support import interop, network
from tests.support.daemon import Daemon
from tests.support.images import TestImages
from tests.support.pods import (
    Pods,
    busybox_daemon,
    command_lines,
    container_config,
    daemon_config,
    log_text,
    pod_config,
    processes_mentioning,
    wait_for,
)
from tests.support.registry import LocalRegistry
from tests.support.streams import (
    TRANSPORTS,
    HTTPStatusError,
    SpdyPortForward,
    websocket_port_forward,
)

pytestmark = pytest.mark.e2e

PAGE = "<html>hello from the pod</html>\n"


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory, registry: LocalRegistry,
           test_images: TestImages) -> Iterator[Daemon]:
    base = tmp_path_factory.mktemp("streaming")
    with busybox_daemon(base, registry, test_images) as d:
        yield d


@pytest.fixture(scope="module")
def pod(daemon: Daemon, tmp_path_factory: pytest.TempPathFactory
        ) -> Iterator[tuple[Pods, str, Any, str]]:
    """One pod with a long-running container and two web servers, shared by the tests
    that only exec into it or forward to it."""
    pods = Pods(daemon.client)
    config = pod_config(log_dir=str(tmp_path_factory.mktemp("streaming-logs")))
    sid = pods.run(config)
    cid = pods.run_container(sid, container_config(daemon.extra["busybox"], "main",
                                                   command=["sleep", "3600"]), config)
    for port in (8080, 8081):
        script = (f"mkdir -p /www{port} && printf '{PAGE}' > /www{port}/index.html && "
                  f"exec httpd -f -p {port} -h /www{port}")
        pods.run_container(sid, container_config(daemon.extra["busybox"], f"web{port}",
                                                 command=["sh", "-c", script]), config)
    yield pods, sid, config, cid
    pods.cleanup()


def _exec_url(daemon: Daemon, cid: str, cmd: list[str], **kw: Any) -> str:
    kw.setdefault("stdout", True)
    return str(daemon.client.runtime.Exec(pb.ExecRequest(container_id=cid, cmd=cmd, **kw),
                                          timeout=30).url)


@pytest.mark.parametrize("transport", ["spdy", "websocket"])
async def test_interactive_shell(daemon: Daemon, pod: Any, transport: str) -> None:
    _, _, _, cid = pod
    url = _exec_url(daemon, cid, ["sh"], stdin=True, stderr=True)
    assert url.startswith("http://127.0.0.1:")
    session = await TRANSPORTS[transport].start(url, stdin=True)
    await session.write_stdin(b"echo hello; echo oops >&2\n")
    await session.wait_output(lambda b: b"hello\n" in b)
    await session.wait_output(lambda b: b"oops\n" in b, stream="err")
    # The shell reads its input in blocks: type the next line only once it waits in read.
    await session.write_stdin(b"echo waiting; read x; echo got:$x; exit 7\n")
    await session.wait_output(lambda b: b"waiting\n" in b)
    await session.write_stdin(b"typed\n")
    result = await session.wait()
    assert result.stdout == b"hello\nwaiting\ngot:typed\n"
    assert result.stderr == b"oops\n"
    assert result.exit_code == 7


@pytest.mark.parametrize("transport", ["spdy", "websocket"])
async def test_stdin_end_reaches_the_process(daemon: Daemon, pod: Any, transport: str) -> None:
    _, _, _, cid = pod
    url = _exec_url(daemon, cid, ["sh", "-c", "cat; echo done"], stdin=True)
    session = await TRANSPORTS[transport].start(url, stdin=True, stderr=False)
    await session.write_stdin(b"a" * 100_000)
    await session.close_stdin()
    result = await session.wait()
    assert result.stdout == b"a" * 100_000 + b"done\n"
    assert result.exit_code == 0


@pytest.mark.parametrize("transport", ["spdy", "websocket"])
async def test_tty_resize(daemon: Daemon, pod: Any, transport: str) -> None:
    _, _, _, cid = pod
    url = _exec_url(daemon, cid, ["sh"], stdin=True, tty=True)
    session = await TRANSPORTS[transport].start(url, stdin=True, tty=True, stderr=False)
    await session.resize(111, 33)
    await session.write_stdin(b"stty size; echo term=$TERM\n")
    await session.wait_output(lambda b: b"33 111" in b and b"term=xterm" in b)
    await session.resize(80, 24)
    # runc copies a later size to the container's terminal in its SIGWINCH handler,
    # apart from the input it copies (as the client's resize and stdin are separate
    # streams): the size is applied eventually, not before the next keystroke. Ask
    # until it shows.
    for _ in range(75):
        await session.write_stdin(b"stty size\n")
        with contextlib.suppress(TimeoutError):
            await session.wait_output(lambda b: b"24 80" in b, limit=0.2)
            break
    else:
        raise AssertionError(f"the terminal never became 24x80: {bytes(session.out)!r}")
    await session.write_stdin(b"exit 3\n")
    result = await session.wait()
    assert result.exit_code == 3


async def test_older_spdy_protocols(daemon: Daemon, pod: Any) -> None:
    """v2 and v3 clients get no status on success and the message on failure."""
    _, _, _, cid = pod
    spdy = TRANSPORTS["spdy"]
    for protocol in ("v3.channel.k8s.io", "v2.channel.k8s.io", "channel.k8s.io"):
        ok = await spdy.start(_exec_url(daemon, cid, ["echo", "hi"]), stdin=False,
                              stderr=False, protocols=(protocol,))
        assert ok.client.protocol == protocol
        result = await ok.wait()
        assert (result.stdout, result.error) == (b"hi\n", b"")
        bad = await spdy.start(_exec_url(daemon, cid, ["sh", "-c", "exit 4"]), stdin=False,
                               stderr=False, protocols=(protocol,))
        result = await bad.wait()
        assert b"exit code 4" in result.error


@pytest.mark.parametrize("protocol", ["v4.channel.k8s.io", "v4.base64.channel.k8s.io",
                                      "channel.k8s.io", "base64.channel.k8s.io"])
async def test_websocket_protocols(daemon: Daemon, pod: Any, protocol: str) -> None:
    _, _, _, cid = pod
    url = _exec_url(daemon, cid, ["sh", "-c", "echo out; echo err >&2; exit 5"], stderr=True)
    session = await TRANSPORTS["websocket"].start(url, protocols=(protocol,))
    result = await session.wait()
    assert (result.stdout, result.stderr) == (b"out\n", b"err\n")
    if protocol.startswith("v4"):
        assert result.exit_code == 5
    else:
        assert b"exit code 5" in result.error


@pytest.mark.parametrize("transport", ["spdy", "websocket"])
async def test_attach(daemon: Daemon, pod: Any, transport: str) -> None:
    pods, sid, config, _ = pod
    # stderr first: once got:N is seen, err:N is in conmon's pipe and reaches the log even
    # if the container is killed right then.
    script = "echo ready; while read l; do echo err:$l >&2; echo got:$l; done"
    cid = pods.run_container(sid, container_config(
        daemon.extra["busybox"], f"attached-{transport}", command=["sh", "-c", script],
        stdin=True, stdin_once=False, log_path=f"attached-{transport}.log"), config)
    try:
        url = str(daemon.client.runtime.Attach(pb.AttachRequest(
            container_id=cid, stdin=True, stdout=True, stderr=True), timeout=30).url)
        session = await TRANSPORTS[transport].start(url, stdin=True)
        await session.write_stdin(b"one\n")
        await session.wait_output(lambda b: b"got:one\n" in b)
        await session.wait_output(lambda b: b"err:one\n" in b, stream="err")
        await session.close()
        # Detaching leaves the container running; a second client is heard too.
        assert pods.status(cid).status.state == pb.CONTAINER_RUNNING
        url = str(daemon.client.runtime.Attach(pb.AttachRequest(
            container_id=cid, stdin=True, stdout=True), timeout=30).url)
        session = await TRANSPORTS[transport].start(url, stdin=True, stderr=False)
        await session.write_stdin(b"two\n")
        await session.wait_output(lambda b: b"got:two\n" in b)
        pods.stop(cid)  # the container's end ends the attach, with success
        result = await session.wait()
        assert result.exit_code == 0
        # The container logged all along, attached or not.
        log = os.path.join(config.log_directory, f"attached-{transport}.log")
        assert log_text(log, "stdout") == "ready\ngot:one\ngot:two\n"
        assert log_text(log, "stderr") == "err:one\nerr:two\n"
    finally:
        pods.remove(cid)


async def test_port_forward_spdy(daemon: Daemon, pod: Any) -> None:
    _, sid, _, _ = pod
    url = str(daemon.client.runtime.PortForward(pb.PortForwardRequest(
        pod_sandbox_id=sid, port=[8080]), timeout=30).url)
    pf = await SpdyPortForward.connect(url)
    try:
        request = b"GET / HTTP/1.0\r\n\r\n"
        # Several connections to two ports at once, on one SPDY connection.
        results = await asyncio.gather(*(pf.request(port, request)
                                         for port in (8080, 8081, 8080, 8081, 8080)))
        for response, error in results:
            assert error == b""
            assert response.startswith(b"HTTP/1.") and response.endswith(PAGE.encode())
        response, error = await pf.request(9, request)  # nothing listens there
        assert response == b""
        assert b"failed to connect to localhost:9" in error
    finally:
        await pf.close()


@pytest.mark.parametrize("protocol", ["v4.channel.k8s.io", "v4.base64.channel.k8s.io"])
async def test_port_forward_websocket(daemon: Daemon, pod: Any, protocol: str) -> None:
    _, sid, _, _ = pod
    for port in (8080, 8081):
        url = str(daemon.client.runtime.PortForward(pb.PortForwardRequest(
            pod_sandbox_id=sid, port=[port]), timeout=30).url)
        data, error = await websocket_port_forward(url, port, b"GET / HTTP/1.0\r\n\r\n",
                                                   protocol=protocol)
        assert error == b""
        assert data.startswith(b"HTTP/1.") and data.endswith(PAGE.encode())


async def test_tokens_are_single_use(daemon: Daemon, pod: Any) -> None:
    _, _, _, cid = pod
    url = _exec_url(daemon, cid, ["true"])
    first = await TRANSPORTS["spdy"].start(url, stdin=False, stderr=False)
    assert (await first.wait()).exit_code == 0
    for transport in ("spdy", "websocket"):
        with pytest.raises(HTTPStatusError) as e:
            await TRANSPORTS[transport].start(url, stdin=False, stderr=False)
        assert e.value.status == 404
    bogus = url.rsplit("/", 1)[0] + "/AAAAAAAA"
    with pytest.raises(HTTPStatusError) as e:
        await TRANSPORTS["spdy"].start(bogus, stdin=False)
    assert e.value.status == 404
    # An exec token is not an attach token.
    other = _exec_url(daemon, cid, ["true"]).replace("/exec/", "/attach/")
    with pytest.raises(HTTPStatusError) as e:
        await TRANSPORTS["spdy"].start(other, stdin=False)
    assert e.value.status == 404


def test_bad_requests(daemon: Daemon, pod: Any) -> None:
    pods, sid, config, cid = pod
    rt = daemon.client.runtime
    cases: list[tuple[Any, Any, grpc.StatusCode, str]] = [
        (rt.Exec, pb.ExecRequest(container_id=cid, cmd=[], stdout=True),
         grpc.StatusCode.INVALID_ARGUMENT, "command"),
        (rt.Exec, pb.ExecRequest(container_id=cid, cmd=["sh"], tty=True, stdout=True,
                                 stderr=True), grpc.StatusCode.INVALID_ARGUMENT, "tty and stderr"),
        (rt.Exec, pb.ExecRequest(container_id=cid, cmd=["sh"]),
         grpc.StatusCode.INVALID_ARGUMENT, "one of stdin, stdout, or stderr"),
        (rt.Exec, pb.ExecRequest(container_id="nosuch", cmd=["sh"], stdout=True),
         grpc.StatusCode.NOT_FOUND, "nosuch"),
        (rt.Attach, pb.AttachRequest(container_id="nosuch", stdout=True),
         grpc.StatusCode.NOT_FOUND, "nosuch"),
        (rt.PortForward, pb.PortForwardRequest(pod_sandbox_id="nosuch", port=[80]),
         grpc.StatusCode.NOT_FOUND, "nosuch"),
        (rt.PortForward, pb.PortForwardRequest(pod_sandbox_id=sid, port=[70000]),
         grpc.StatusCode.INVALID_ARGUMENT, "70000"),
    ]
    exited = pods.run_container(sid, container_config(daemon.extra["busybox"], "done",
                                                      command=["true"]), config)
    pods.wait_state(exited, pb.CONTAINER_EXITED)
    cases.append((rt.Exec, pb.ExecRequest(container_id=exited, cmd=["sh"], stdout=True),
                  grpc.StatusCode.FAILED_PRECONDITION, "EXITED"))
    cases.append((rt.Attach, pb.AttachRequest(container_id=exited, stdout=True),
                  grpc.StatusCode.FAILED_PRECONDITION, "EXITED"))
    for call, request, code, text in cases:
        with pytest.raises(grpc.RpcError) as e:
            call(request, timeout=30)
        assert e.value.code() == code, (request, e.value.details())
        assert text in e.value.details(), e.value.details()
    pods.remove(exited)


def _marker() -> str:
    """A ``sleep`` argument no other test run on this machine uses at the same time."""
    return str(100_000 + secrets.randbelow(900_000))


def _sleepers(marker: str) -> list[str]:
    return [cmd for _, cmd in command_lines() if cmd == f"sleep {marker}"]


@pytest.mark.parametrize("transport", ["spdy", "websocket"])
async def test_client_disconnect_kills_the_exec(daemon: Daemon, pod: Any,
                                                transport: str) -> None:
    _, _, _, cid = pod
    marker = _marker()
    session = await TRANSPORTS[transport].start(
        _exec_url(daemon, cid, ["sleep", marker], stdin=True), stdin=True, stderr=False)
    await asyncio.to_thread(wait_for, lambda: _sleepers(marker), 15, "the exec to run")
    await session.close()
    await asyncio.to_thread(wait_for, lambda: not _sleepers(marker), 15,
                            "the exec to be killed")


#: runc, except that ``runc exec`` never publishes its pid file (it writes it aside):
#: the moment a slow runc shows under load, when the exec's process runs and the pid
#: file is not written yet (70 ms measured here), made to last.
LATE_PID_FILE_RUNC = """#!/bin/sh
case " $* " in *" exec "*) ;; *) exec {runc} "$@" ;; esac
for arg; do
  shift
  if [ "$hide" = 1 ]; then arg="$arg.unpublished"; hide=; fi
  [ "$arg" = --pid-file ] && hide=1
  set -- "$@" "$arg"
done
{runc} "$@"
"""


@pytest.fixture(scope="module")
def late_pid_file_daemon(tmp_path_factory: pytest.TempPathFactory, registry: LocalRegistry,
                         test_images: TestImages) -> Iterator[tuple[Daemon, str]]:
    """A daemon whose runc execs never report their pid, and a running container."""
    base = tmp_path_factory.mktemp("late-pid-file")
    runc = base / "runc"
    runc.write_text(LATE_PID_FILE_RUNC.format(runc=shutil.which("runc")))
    runc.chmod(0o755)
    config = (daemon_config(registry, test_images, base)
              + f'[plugins."pycrid.cri.v1.runtime"]\nruntime_path = "{runc}"\n')
    with busybox_daemon(base, registry, test_images, config) as d:
        pods = Pods(d.client)
        pod = pod_config(log_dir=str(base / "logs"))
        sid = pods.run(pod)
        cid = pods.run_container(sid, container_config(d.extra["busybox"], "main",
                                                       command=["sleep", "3600"]), pod)
        yield d, cid
        pods.cleanup()


@pytest.mark.parametrize(("transport", "tty"), [("spdy", False), ("websocket", False),
                                                ("spdy", True)])
async def test_disconnect_before_runc_reports_the_exec_kills_it(
        late_pid_file_daemon: tuple[Daemon, str], transport: str, tty: bool) -> None:
    """The client goes while runc has started the exec's process but not written its pid
    file: the process is found as runc's child and killed (killing runc alone left it
    running; test_client_disconnect_kills_the_exec[spdy] met that once under load)."""
    daemon, cid = late_pid_file_daemon
    marker = _marker()
    session = await TRANSPORTS[transport].start(
        _exec_url(daemon, cid, ["sleep", marker], stdin=True, tty=tty), stdin=True,
        stderr=False, tty=tty)
    await asyncio.to_thread(wait_for, lambda: _sleepers(marker), 15, "the exec to run")
    await session.close()
    await asyncio.to_thread(wait_for, lambda: not _sleepers(marker), 15,
                            "the exec to be killed")
    await asyncio.to_thread(
        wait_for, lambda: not [p for p in processes_mentioning(cid) if " exec --process " in p],
        15, "runc exec to be killed")


async def test_removed_container_ends_the_exec_with_an_error(daemon: Daemon,
                                                             pod: Any) -> None:
    pods, sid, config, _ = pod
    cid = pods.run_container(sid, container_config(daemon.extra["busybox"], "doomed",
                                                   command=["sleep", "3600"]), config)
    marker = _marker()
    session = await TRANSPORTS["spdy"].start(
        _exec_url(daemon, cid, ["sh", "-c", f"trap '' TERM; sleep {marker}"]), stdin=False,
        stderr=False)
    await asyncio.to_thread(wait_for, lambda: _sleepers(marker), 15, "the exec to run")
    await asyncio.to_thread(pods.remove, cid)
    result = await session.wait(limit=30)
    assert b"InternalError" in result.error or b"Failure" in result.error, result.error
    assert cid.encode() in result.error
    assert not _sleepers(marker)


async def test_many_concurrent_execs(daemon: Daemon, pod: Any) -> None:
    _, _, _, cid = pod
    n = 20
    started = time.monotonic()

    async def one(i: int) -> bytes:
        transport = "spdy" if i % 2 else "websocket"
        url = await asyncio.to_thread(_exec_url, daemon, cid, ["sh", "-c", f"echo n{i}"])
        result = await (await TRANSPORTS[transport].start(url, stdin=False,
                                                          stderr=False)).wait()
        assert result.exit_code == 0
        return result.stdout

    outputs = await asyncio.gather(*(one(i) for i in range(n)))
    assert outputs == [f"n{i}\n".encode() for i in range(n)]
    assert time.monotonic() - started < 120
    # Every exec's temporary files are gone.
    tmp = os.path.join(daemon.state, "conmon")
    assert not [e for e in os.listdir(tmp) if e.startswith("exec-")]


# ---- the real crictl (../shared/interop) ---------------------------------------------------
#
# crictl exits 1 and logs the error for every failed exec, whatever the transport and the
# runtime (cmd/crictl/main.go logs what the command returned and exits 1; the exit code is
# only in the message), so a non-zero exit shows as that one line and status 1.

TRANSPORT_NAMES = ["websocket", "spdy"]


def _run(argv: list[str], stdin: bytes = b"") -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(argv, input=stdin, capture_output=True, timeout=120)


def _exec_failed_line(cid: str, code: int) -> re.Pattern[bytes]:
    return re.compile(rb'time="[^"]+" level=error msg="execing command in container '
                      + cid.encode() + rb": command terminated with exit code "
                      + str(code).encode() + rb'"\n')


@pytest.mark.parametrize("transport", TRANSPORT_NAMES)
def test_crictl_exec_exit_codes(daemon: Daemon, pod: Any, tmp_path: Path,
                                transport: str) -> None:
    _, _, _, cid = pod
    crictl = [*interop.crictl(daemon.address, tmp_path), "exec", "-r", transport, cid, "sh", "-c"]
    ok = _run([*crictl, "echo out; echo err >&2"])
    assert (ok.returncode, ok.stdout, ok.stderr) == (0, b"out\n", b"err\n")
    failed = _run([*crictl, "echo out; echo err >&2; exit 7"])
    assert (failed.returncode, failed.stdout) == (1, b"out\n"), failed.stderr
    # The command's stderr, then crictl's one line with the exit code; no stream error.
    assert failed.stderr.startswith(b"err\n"), failed.stderr
    assert _exec_failed_line(cid, 7).fullmatch(failed.stderr[4:]), failed.stderr


@pytest.mark.parametrize("transport", TRANSPORT_NAMES)
def test_crictl_exec_stdin(daemon: Daemon, pod: Any, tmp_path: Path, transport: str) -> None:
    _, _, _, cid = pod
    crictl = [*interop.crictl(daemon.address, tmp_path), "exec", "-i", "-r", transport, cid]
    hi = _run([*crictl, "cat"], stdin=b"hi\n")
    assert (hi.returncode, hi.stdout, hi.stderr) == (0, b"hi\n", b"")
    # More than a pipe and a socket buffer hold, then stdin's end reaches the process.
    text = b"".join(b"line %d\n" % i for i in range(30_000))
    big = _run([*crictl, "sh", "-c", "cat; echo done"], stdin=text)
    assert (big.returncode, big.stderr) == (0, b"")
    assert big.stdout == text + b"done\n"


def _in_terminal(argv: list[str], typed: bytes, rows: int, cols: int) -> tuple[int, bytes]:
    """Run ``argv`` on a new pseudo-terminal of ``rows`` x ``cols`` (crictl -t insists on
    a terminal), type ``typed`` at the shell's first prompt; (exit status, the screen)."""
    master, slave = os.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))
    proc = subprocess.Popen(argv, stdin=slave, stdout=slave, stderr=slave,
                            start_new_session=True)
    os.close(slave)
    screen = bytearray()
    try:
        while True:
            if not select.select([master], [], [], 60)[0]:
                raise AssertionError(f"no output for 60 s; so far {bytes(screen)!r}")
            try:
                chunk = os.read(master, 65536)
            except OSError:  # EIO: crictl, the last holder of the terminal, is gone
                break
            if not chunk:
                break
            if b"# " not in screen and b"# " in screen + chunk:
                os.write(master, typed)
            screen += chunk
        return proc.wait(timeout=30), bytes(screen)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        os.close(master)


@pytest.mark.parametrize("transport", TRANSPORT_NAMES)
def test_crictl_exec_tty(daemon: Daemon, pod: Any, tmp_path: Path, transport: str) -> None:
    _, _, _, cid = pod
    status, screen = _in_terminal(
        [*interop.crictl(daemon.address, tmp_path), "exec", "-it", "-r", transport, cid, "sh"],
        b"stty size; tty; exit 3\r", rows=33, cols=111)
    lines = screen.replace(b"\r", b"")  # both terminals on the way add carriage returns
    assert b"\n33 111\n" in lines and b"\n/dev/pts/0\n" in lines, screen
    assert status == 1 and b"command terminated with exit code 3" in screen, screen
    assert b"error reading" not in screen and b"Unknown stream" not in screen, screen


def test_crictl_exec_sync(daemon: Daemon, pod: Any, tmp_path: Path) -> None:
    _, _, _, cid = pod
    crictl = [*interop.crictl(daemon.address, tmp_path), "exec", "-s", cid, "sh", "-c"]
    ok = _run([*crictl, "echo out; echo err >&2"])
    # crictl prints both buffers on stdout, each with a newline after it.
    assert (ok.returncode, ok.stdout, ok.stderr) == (0, b"out\n\nerr\n\n", b"")
    failed = _run([*crictl, "echo out; echo err >&2; exit 7"])
    assert (failed.returncode, failed.stdout) == (1, b"")
    assert b"synchronously: command 'sh -c echo out; echo err >&2; exit 7' exited with 7: " \
           b"err" in failed.stderr, failed.stderr


@pytest.mark.parametrize("transport", TRANSPORT_NAMES)
def test_crictl_attach(daemon: Daemon, pod: Any, tmp_path: Path, transport: str) -> None:
    pods, sid, config, _ = pod
    cid = pods.run_container(sid, container_config(
        daemon.extra["busybox"], f"crictl-attach-{transport}", stdin=True, stdin_once=True,
        command=["sh", "-c", "read l; echo got:$l; echo err:$l >&2; exit 4"]), config)
    try:
        # The container waits for a line only the attach can give it; its end (with
        # whatever code) ends the attach with success.
        result = _run([*interop.crictl(daemon.address, tmp_path), "attach", "-i", "-r",
                       transport, cid], stdin=b"one\n")
        assert (result.returncode, result.stdout, result.stderr) == (
            0, b"got:one\n", b"err:one\n")
        assert pods.wait_state(cid, pb.CONTAINER_EXITED).exit_code == 4
    finally:
        pods.stop(cid)
        pods.remove(cid)


@pytest.mark.parametrize("transport", TRANSPORT_NAMES)
@pytest.mark.timeout(120)
def test_crictl_port_forward(daemon: Daemon, pod: Any, tmp_path: Path,
                             transport: str) -> None:
    """``-r websocket`` is SPDY tunnelled in a WebSocket (client-go's tunneling dialer)."""
    _, sid, _, _ = pod
    proc = subprocess.Popen(
        [*interop.crictl(daemon.address, tmp_path), "port-forward", "-r", transport, sid, "0:8080"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None
    try:
        first = proc.stdout.readline()
        found = re.fullmatch(rb"Forwarding from 127\.0\.0\.1:(\d+) -> 8080\n", first)
        assert found, (first, proc.poll())
        port = int(found.group(1))
        for _ in range(3):
            response = network.http_get(port)
            assert response.startswith(b"HTTP/1.") and response.endswith(PAGE.encode())
        proc.send_signal(signal.SIGINT)  # how a user stops it
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert (proc.returncode, err) == (0, b"")
    assert out.count(b"Handling connection for %d\n" % port) == 3, out
