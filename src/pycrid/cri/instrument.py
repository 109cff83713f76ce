"""Every CRI call goes through here: readiness gate, request id, timing, error mapping.

This is the one place where pycrid's error kinds become gRPC status codes
(containerd does the same in its instrumented service). Methods the core does
not implement yet answer UNIMPLEMENTED with a message that says so.
"""

from __future__ import annotations

import functools
import inspect
import logging
import secrets
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc
from google.protobuf.descriptor import ServiceDescriptor

from pycrid import errors

log = logging.getLogger("pycrid.cri")

_CODES: dict[str, grpc.StatusCode] = {
    name: getattr(grpc.StatusCode, name)
    for name in (
        "NOT_FOUND", "ALREADY_EXISTS", "INVALID_ARGUMENT", "FAILED_PRECONDITION", "UNAVAILABLE",
        "DEADLINE_EXCEEDED", "UNAUTHENTICATED", "PERMISSION_DENIED", "RESOURCE_EXHAUSTED",
        "DATA_LOSS", "UNIMPLEMENTED", "ABORTED", "INTERNAL", "UNKNOWN",
    )
}


def status_of(exc: BaseException) -> tuple[grpc.StatusCode, str]:
    """The gRPC status for an exception raised by the core."""
    if isinstance(exc, errors.PycridError):
        return _CODES.get(exc.kind, grpc.StatusCode.UNKNOWN), str(exc)
    if isinstance(exc, TimeoutError):
        return grpc.StatusCode.DEADLINE_EXCEEDED, "operation timed out"
    return grpc.StatusCode.INTERNAL, f"internal error: {type(exc).__name__}: {exc}"


class Gate:
    """``Unavailable`` until the daemon has finished starting (recovery included)."""

    def __init__(self) -> None:
        self.ready = False


def _unimplemented(full_name: str) -> Callable[..., Any]:
    async def handler(request: Any, context: grpc.aio.ServicerContext) -> Any:
        raise errors.Unimplemented(f"{full_name} is not implemented by pycrid yet")

    return handler


def instrumented_servicer(
    service: ServiceDescriptor, impl: object, gate: Gate
) -> object:
    """A servicer for ``service`` whose methods are ``impl``'s, wrapped; missing ones unimplemented.

    ``impl`` methods are ``async def Name(request, context)`` (or async generators for
    server-streaming RPCs).
    """
    servicer = type(f"Instrumented{service.name}", (), {})()
    for method in service.methods:
        full = f"/{service.full_name}/{method.name}"
        fn = getattr(impl, method.name, None) or _unimplemented(full)
        streaming = bool(method.server_streaming)
        setattr(servicer, method.name,
                _wrap_stream(full, fn, gate) if streaming else _wrap_unary(full, fn, gate))
    return servicer


def _begin(full: str, gate: Gate) -> str:
    rid = secrets.token_hex(6)
    if not gate.ready:
        raise errors.Unavailable("server is not initialized yet")
    return rid


async def _fail(full: str, rid: str, started: float, exc: BaseException,
                context: grpc.aio.ServicerContext) -> None:
    code, msg = status_of(exc)
    ms = (time.monotonic() - started) * 1000
    extra = {"rpc": full, "request_id": rid, "code": code.name, "ms": round(ms, 2)}
    if code in (grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN):
        log.error("call failed: %s", msg, extra=extra, exc_info=exc)
    else:
        log.warning("call failed: %s", msg, extra=extra)
    await context.abort(code, msg)


def _wrap_unary(full: str, fn: Callable[..., Any], gate: Gate) -> Callable[..., Any]:
    @functools.wraps(fn)
    async def call(request: Any, context: grpc.aio.ServicerContext) -> Any:
        started = time.monotonic()
        rid = "-"
        try:
            rid = _begin(full, gate)
            log.debug("call", extra={"rpc": full, "request_id": rid})
            response = await fn(request, context)
        except grpc.aio.AbortError:
            raise
        except Exception as exc:
            await _fail(full, rid, started, exc, context)
            raise  # abort() raised already; this keeps type checkers happy
        log.debug("done", extra={"rpc": full, "request_id": rid,
                                 "ms": round((time.monotonic() - started) * 1000, 2)})
        return response

    return call


def _wrap_stream(full: str, fn: Callable[..., Any], gate: Gate) -> Callable[..., Any]:
    async def call(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
        started = time.monotonic()
        rid = "-"
        try:
            rid = _begin(full, gate)
            log.debug("stream", extra={"rpc": full, "request_id": rid})
            result = fn(request, context)
            if inspect.iscoroutine(result):
                result = await result
            async for item in result:
                yield item
        except grpc.aio.AbortError:
            raise
        except Exception as exc:
            await _fail(full, rid, started, exc, context)
            raise

    return call
