"""Every CRI call goes through here: readiness gate, request id, timing, error mapping.

This is the one place where pycrid's error kinds become gRPC status codes
(containerd does the same in its instrumented service). Methods the core does
not implement yet answer UNIMPLEMENTED with a message that says so.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import secrets
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Never, Protocol, cast

import grpc
from google.protobuf.descriptor import ServiceDescriptor
from google.protobuf.message import Message

from pycrid import errors
from pycrid.cri.handler_types import Context, Req, Resp, Streaming, Unary
from pycrid.cri.rpc_methods import rpc_service
from pycrid.host import space

log = logging.getLogger("pycrid.cri")

_CODES: dict[str, grpc.StatusCode] = {
    name: grpc.StatusCode[name]
    for name in (
        "NOT_FOUND", "ALREADY_EXISTS", "INVALID_ARGUMENT", "FAILED_PRECONDITION", "UNAVAILABLE",
        "DEADLINE_EXCEEDED", "UNAUTHENTICATED", "PERMISSION_DENIED", "RESOURCE_EXHAUSTED",
        "DATA_LOSS", "UNIMPLEMENTED", "ABORTED", "INTERNAL", "UNKNOWN", "CANCELLED",
    )
}


def status_of(exc: BaseException, method: str = "") -> tuple[grpc.StatusCode, str]:
    """The gRPC status for an exception raised by the core. Running out of space where
    nothing said what it was writing is still NoSpace, naming the file and the call."""
    if space.is_no_space(exc):
        exc = space.no_space(exc, f"for {method or 'this call'}")
    if isinstance(exc, errors.PycridError):
        return _CODES.get(exc.kind, grpc.StatusCode.UNKNOWN), str(exc)
    if isinstance(exc, TimeoutError):
        return grpc.StatusCode.DEADLINE_EXCEEDED, "operation timed out"
    return grpc.StatusCode.INTERNAL, f"internal error: {type(exc).__name__}: {exc}"


class Gate:
    """``Unavailable`` until the daemon has finished starting (recovery included)."""

    def __init__(self) -> None:
        self.ready = False


def _unimplemented(
        full_name: str) -> Callable[[Message, Context[Message, Message]], Awaitable[Never]]:
    """A handler that fits unary and streaming methods alike: it never answers."""

    async def handler(request: Message, context: Context[Message, Message]) -> Never:
        raise errors.Unimplemented(f"{full_name} is not implemented by pycrid yet")

    return handler


#: Records one finished call: (method short name, gRPC code name, seconds).
Record = Callable[[str, str, float], None]


class Tracer(Protocol):
    def wrap_unary(self, method: str, fn: Unary[Req, Resp]) -> Unary[Req, Resp]:
        """``fn`` inside one span per call."""


def instrumented_servicer(
    service: ServiceDescriptor, impl: object, gate: Gate, record: Record | None = None,
    tracer: Tracer | None = None,
) -> object:
    """A servicer for ``service`` whose methods are ``impl``'s, wrapped; missing ones unimplemented.

    ``impl`` methods are ``async def Name(request, context)`` (or async generators for
    server-streaming RPCs). ``record`` sees every call's end (metrics); a ``tracer`` wraps
    unary calls in spans. Both are chosen here, once, so a daemon without tracing never
    makes even a no-op span.
    """
    rpc = rpc_service(service)
    namespace: dict[str, object] = {}
    cls: type[object] = type(f"Instrumented{rpc.name}", (), namespace)
    servicer = cls()
    for method in rpc.methods:
        # grpc finds handlers by name: what ``impl`` has under each is taken on trust.
        found = cast("object | None", getattr(impl, method.name, None))
        wrapped: object
        if method.server_streaming:
            stream: Streaming[Message, Message] = (
                cast("Streaming[Message, Message] | None", found)
                or _unimplemented(method.path))
            wrapped = _wrap_stream(method.path, stream, gate, record)
        else:
            fn: Unary[Message, Message] = (
                cast("Unary[Message, Message] | None", found) or _unimplemented(method.path))
            if tracer is not None:
                fn = tracer.wrap_unary(method.name, fn)
            wrapped = _wrap_unary(method.path, fn, gate, record)
        setattr(servicer, method.name, wrapped)
    return servicer


def _aborted_code(context: Context[Req, Resp]) -> str:
    # Typed as a StatusCode, but grpc answers None (or an int) until a code is set.
    code: object = context.code()
    return code.name if isinstance(code, grpc.StatusCode) else "UNKNOWN"


def _begin(full: str, gate: Gate) -> str:
    rid = secrets.token_hex(6)
    if not gate.ready:
        raise errors.Unavailable("server is not initialized yet")
    return rid


async def _fail(full: str, rid: str, started: float, exc: BaseException,
                context: Context[Req, Resp], record: Record | None) -> None:
    code, msg = status_of(exc, full.rpartition("/")[2])
    ms = (time.monotonic() - started) * 1000
    if record is not None:
        record(full.rpartition("/")[2], code.name, ms / 1000)
    extra = {"rpc": full, "request_id": rid, "code": code.name, "ms": round(ms, 2)}
    if code in (grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN):
        log.error("call failed: %s", msg, extra=extra, exc_info=exc)
    else:
        log.warning("call failed: %s", msg, extra=extra)
    await context.abort(code, msg)


def _wrap_unary(full: str, fn: Unary[Req, Resp], gate: Gate,
                record: Record | None) -> Unary[Req, Resp]:
    name = full.rpartition("/")[2]

    @functools.wraps(fn)
    async def call(request: Req, context: Context[Req, Resp]) -> Resp:
        started = time.monotonic()
        rid = "-"
        try:
            rid = _begin(full, gate)
            log.debug("call", extra={"rpc": full, "request_id": rid})
            response = await fn(request, context)
        except grpc.aio.AbortError:
            if record is not None:
                record(name, _aborted_code(context), time.monotonic() - started)
            raise
        except Exception as exc:
            await _fail(full, rid, started, exc, context, record)
            raise  # abort() raised already; this keeps type checkers happy
        elapsed = time.monotonic() - started
        if record is not None:
            record(name, "OK", elapsed)
        log.debug("done", extra={"rpc": full, "request_id": rid, "ms": round(elapsed * 1000, 2)})
        return response

    return call


def _wrap_stream(
    full: str, fn: Streaming[Req, Resp], gate: Gate, record: Record | None,
) -> Callable[[Req, Context[Req, Resp]], AsyncIterator[Resp]]:
    name = full.rpartition("/")[2]

    async def call(request: Req, context: Context[Req, Resp]) -> AsyncIterator[Resp]:
        started = time.monotonic()
        rid = "-"
        code = "OK"  # a stream counts at its end; a client going away cancels it
        try:
            rid = _begin(full, gate)
            log.debug("stream", extra={"rpc": full, "request_id": rid})
            result = fn(request, context)
            if not isinstance(result, AsyncIterator):
                result = await result  # a coroutine that returns the stream
            async for item in result:
                yield item
        except grpc.aio.AbortError:
            code = _aborted_code(context)
            raise
        except asyncio.CancelledError:
            code = "CANCELLED"
            raise
        except Exception as exc:
            code = ""
            await _fail(full, rid, started, exc, context, record)
            raise
        finally:
            if record is not None and code:
                record(name, code, time.monotonic() - started)

    return call
