"""Interactive stdio for exec and attach (CONMON-RUNC.md §4, §5.2).

Exec runs ``runc exec`` in the foreground as the daemon's child, as CRI-O
does: without a TTY the process's stdio are pipes the daemon copies; with a
TTY runc gets a pseudo-terminal from us (its stdin, stdout and stderr), makes
the container's own and copies between them, and a resize is ``TIOCSWINSZ``
on ours followed by SIGWINCH to runc, which passes the size on. The exit code
is runc's exit status. Cancelling an exec kills what runc started, then runc
(runtime/exec_kill.py); the start of runc and that kill each run whole, so a
cancellation cannot land half-way through either.

Attach joins conmon's attach socket (SOCK_SEQPACKET: one byte stream id, 2 for
stdout and 3 for stderr, then the bytes) and resizes through conmon's ctl
fifo; the container does not notice a client leaving.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import fcntl
import functools
import logging
import os
import signal
import socket
import struct
import termios
import tty
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from pycrid import inotify
from pycrid.errors import FailedPrecondition, Unknown
from pycrid.operations import finish
from pycrid.runtime.exec_kill import Stopper, kill_exec
from pycrid.stdio import ByteSink, ByteSource, ProcessIO, TerminalSize

log = logging.getLogger(__name__)

#: After the process exited, how long its output may still trail in (a background
#: child can hold the pipes open for ever).
DRAIN_TIMEOUT = 2.0
#: How long a TTY exec waits for the client's first terminal size before it starts.
FIRST_SIZE_WAIT = 0.5
#: conmon reads at most this much stdin per packet.
_ATTACH_PACKET = 32768


async def run_exec(argv: list[str], pid_path: str, io: ProcessIO,
                   stop: Stopper | None = None) -> int:
    """Run ``argv`` (a ``runc exec``) wired to ``io``; its exit status. ``stop``, when
    given, is awaited first when the exec is cut short."""
    if io.tty:
        return await _run_tty(argv, pid_path, io, stop)
    pipe, null = asyncio.subprocess.PIPE, asyncio.subprocess.DEVNULL
    proc = await _spawn(argv, pid_path, stop, stdin=pipe if io.stdin else null,
                        stdout=pipe if io.stdout else null, stderr=pipe if io.stderr else null)
    try:
        async with asyncio.TaskGroup() as tg:
            outputs = [tg.create_task(_copy_out(functools.partial(reader.read, 65536), sink))
                       for reader, sink in ((proc.stdout, io.stdout), (proc.stderr, io.stderr))
                       if reader is not None and sink is not None]
            feeder = (tg.create_task(_feed_stdin(io.stdin, proc.stdin))
                      if io.stdin is not None and proc.stdin is not None else None)
            code = await proc.wait()
            await _drain(outputs)
            if feeder is not None:
                feeder.cancel()
        return code
    finally:
        await finish(kill_exec(pid_path, proc, stop))


async def _spawn(argv: list[str], pid_path: str, stop: Stopper | None,
                 **kwargs: Any) -> asyncio.subprocess.Process:
    """Start runc in a session of its own. A cancellation that lands while asyncio
    connects its pipes would make asyncio kill runc alone, leaving what runc started
    already: so the start runs whole, and a cancelled one kills what it started."""
    task = asyncio.ensure_future(asyncio.create_subprocess_exec(
        *argv, start_new_session=True, **kwargs))
    try:
        return await finish(task)
    except asyncio.CancelledError:
        if task.done() and not task.cancelled() and task.exception() is None:
            await finish(kill_exec(pid_path, task.result(), stop))
        raise


async def _run_tty(argv: list[str], pid_path: str, io: ProcessIO,
                   stop: Stopper | None) -> int:
    sizes: asyncio.Queue[TerminalSize] = asyncio.Queue()
    master, slave = os.openpty()
    try:
        # Raw from the start: runc makes it raw too, but only once the container's
        # terminal exists, and input arriving before would be echoed twice.
        tty.setraw(slave)
        os.set_blocking(master, False)
        async with asyncio.TaskGroup() as tg:
            reader = (tg.create_task(_queue_sizes(io.resize, sizes))
                      if io.resize is not None else None)
            if reader is not None:
                # runc copies our size to the container's terminal when it starts, and a
                # SIGWINCH before its handler exists is lost: so take the client's first
                # size (clients send it at once) before starting runc.
                with contextlib.suppress(TimeoutError):
                    _set_size(master, await asyncio.wait_for(sizes.get(), FIRST_SIZE_WAIT))
            proc = await _spawn(argv, pid_path, stop, stdin=slave, stdout=slave,
                                stderr=slave)
            os.close(slave)
            slave = -1
            pty = _PtyMaster(master)
            try:
                output = tg.create_task(_copy_out(pty.read, io.stdout))
                others = [t for t in (reader,) if t is not None]
                if io.stdin is not None:
                    others.append(tg.create_task(_feed_when_started(io.stdin, pty.write,
                                                                    pid_path)))
                if reader is not None:
                    others.append(tg.create_task(_resize_pty(sizes, master, proc.pid,
                                                             pid_path)))
                code = await proc.wait()
                await _drain([output])
                for task in others:
                    task.cancel()
            finally:
                await finish(kill_exec(pid_path, proc, stop))
        return code
    finally:
        if slave >= 0:
            os.close(slave)
        with contextlib.suppress(OSError):
            os.close(master)


async def _queue_sizes(source: AsyncIterator[TerminalSize] | None,
                       sizes: asyncio.Queue[TerminalSize]) -> None:
    assert source is not None
    async for size in source:
        sizes.put_nowait(size)


def _set_size(fd: int, size: TerminalSize) -> None:
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", size.height, size.width, 0, 0))


async def _started(pid_path: str) -> None:
    """Until runc wrote the exec's pid file: it has the container's terminal then, and
    sizes its terminal right after."""
    for _ in range(500):  # no event to wait for: poll, for at most 5 s
        if os.path.exists(pid_path):
            return
        await asyncio.sleep(0.01)


async def _feed_when_started(source: ByteSource, write: Callable[[bytes], Awaitable[None]],
                             pid_path: str) -> None:
    """Typed-ahead input waits for runc: a command it reaches before runc sized the
    container's terminal would see a 0x0 terminal."""
    await _started(pid_path)
    await _feed(source, write)


async def _resize_pty(sizes: asyncio.Queue[TerminalSize], fd: int, runc_pid: int,
                      pid_path: str) -> None:
    """Each new size onto our terminal, then SIGWINCH to runc, which copies it to the
    container's; only once runc wrote the pid file, by when its handler exists."""
    while True:
        size = await sizes.get()
        await _started(pid_path)
        _set_size(fd, size)
        with contextlib.suppress(ProcessLookupError):
            os.kill(runc_pid, signal.SIGWINCH)


class _PtyMaster:
    """Non-blocking reads and writes on a pty master; EIO (no process holds the other
    side any more) reads as the end."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self._loop = asyncio.get_running_loop()

    async def _ready(self, add: Callable[..., None], remove: Callable[[int], bool]) -> None:
        fut: asyncio.Future[None] = self._loop.create_future()

        def wake() -> None:
            if not fut.done():
                fut.set_result(None)

        add(self.fd, wake)
        try:
            await fut
        finally:
            remove(self.fd)

    async def read(self) -> bytes:
        while True:
            try:
                return os.read(self.fd, 65536)
            except BlockingIOError:
                await self._ready(self._loop.add_reader, self._loop.remove_reader)
            except OSError as e:
                if e.errno == errno.EIO:
                    return b""
                raise

    async def write(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            try:
                view = view[os.write(self.fd, view):]
            except BlockingIOError:
                await self._ready(self._loop.add_writer, self._loop.remove_writer)


async def _copy_out(read: Callable[[], Awaitable[bytes]], sink: ByteSink | None) -> None:
    """Copy to the client; once it is gone, keep reading (a process blocked on a full
    pipe would never exit) until the session's end cancels the exec."""
    while data := await read():
        if sink is not None:
            try:
                await sink.write(data)
            except (ConnectionError, OSError):
                sink = None


async def _feed(source: ByteSource, write: Callable[[bytes], Awaitable[None]]) -> None:
    while data := await source.read():
        await write(data)


async def _feed_stdin(source: ByteSource, stdin: asyncio.StreamWriter) -> None:
    """Client stdin to the process until the client ends it, then close the process's
    stdin (so ``cat`` or ``sh`` see EOF)."""
    with contextlib.suppress(ConnectionError, OSError):
        while data := await source.read():
            stdin.write(data)
            await stdin.drain()
        stdin.close()


async def _drain(outputs: list[asyncio.Task[None]]) -> None:
    if outputs:
        _, pending = await asyncio.wait(outputs, timeout=DRAIN_TIMEOUT)
        for task in pending:
            task.cancel()


# ---- attach ---------------------------------------------------------------------------


async def attach(bundle: str, io: ProcessIO) -> None:
    """Copy between the client and conmon's attach socket until the container's output
    ends (it exited) or the caller cancels (the client left)."""
    loop = asyncio.get_running_loop()
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
    sock.setblocking(False)
    try:
        # Through an O_PATH fd: the bundle path may not fit in sockaddr_un.
        dirfd = os.open(bundle, os.O_PATH | os.O_DIRECTORY)
        try:
            await loop.sock_connect(sock, f"/proc/self/fd/{dirfd}/attach")
        finally:
            os.close(dirfd)
        async with asyncio.TaskGroup() as tg:
            others = []
            if io.stdin is not None:
                others.append(tg.create_task(_attach_stdin(loop, sock, io.stdin)))
            if io.resize is not None:
                others.append(tg.create_task(_resize_ctl(io.resize, bundle)))
            await _attach_output(loop, sock, io)
            for task in others:
                task.cancel()
    finally:
        sock.close()


async def _attach_output(loop: asyncio.AbstractEventLoop, sock: socket.socket,
                         io: ProcessIO) -> None:
    while packet := await loop.sock_recv(sock, 8193):
        sink = io.stdout if packet[0] == 2 or io.tty else io.stderr
        if sink is not None and len(packet) > 1:
            try:
                await sink.write(packet[1:])
            except (ConnectionError, OSError):
                return  # the client left; the container goes on


async def _attach_stdin(loop: asyncio.AbstractEventLoop, sock: socket.socket,
                        source: ByteSource) -> None:
    """The client's stdin to conmon; at its end, half-close, which makes conmon close
    the container's stdin when the container has stdin_once."""
    with contextlib.suppress(ConnectionError, OSError):
        while data := await source.read():
            for i in range(0, len(data), _ATTACH_PACKET):
                await loop.sock_sendall(sock, data[i:i + _ATTACH_PACKET])
        sock.shutdown(socket.SHUT_WR)


async def _resize_ctl(sizes: AsyncIterator[TerminalSize] | None, bundle: str) -> None:
    assert sizes is not None
    async for size in sizes:
        write_ctl(bundle, f"1 {size.height} {size.width}\n")


def write_ctl(bundle: str, message: str) -> bool:
    """One message to conmon's ctl fifo; False when conmon is gone (nobody reads it: a
    blocking open would hang for ever)."""
    try:
        fd = os.open(os.path.join(bundle, "ctl"), os.O_WRONLY | os.O_NONBLOCK)
    except OSError:
        return False
    try:
        os.write(fd, message.encode())
        return True
    except OSError:
        return False
    finally:
        os.close(fd)


async def reopen_log(bundle: str, log_path: str, within: float) -> None:
    """Ask conmon to reopen the log (after the kubelet rotated it): ``2 0 0`` on ctl.

    conmon reopens when it next reads its ctl fifo, after this returns; the kubelet
    opens the path right after the call, so wait until the new file is there (an
    inotify watch on its directory, armed before asking), up to ``within`` seconds."""
    watch: inotify.Inotify | None = None
    try:
        if log_path and not os.path.exists(log_path):
            watch = inotify.Inotify()
            watch.add_watch(os.path.dirname(log_path) or ".", inotify.CREATE | inotify.MOVED_TO)
        if not write_ctl(bundle, "2 0 0\n"):
            raise FailedPrecondition("container monitor (conmon) is not running")
        if watch is not None:
            await asyncio.wait_for(_appears(watch, log_path), within)
    except TimeoutError:
        raise Unknown(f"conmon did not reopen {log_path} within {within:.0f}s") from None
    finally:
        if watch is not None:
            watch.close()


async def _appears(watch: inotify.Inotify, path: str) -> None:
    while not os.path.exists(path):
        await watch.wait()
