"""The shapes of a gRPC method handler, typed by its request and response messages.

grpc calls a servicer's methods by name; these aliases let the servicers, the wrappers
around them (cri/instrument.py, tracing.py) and mypy agree on what each one takes and
returns without an ``Any`` in between.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TypeAlias, TypeVar

import grpc
from google.protobuf.message import Message

Req = TypeVar("Req", bound=Message)
Resp = TypeVar("Resp", bound=Message)

#: The servicer context of one call (grpc's own class, generic only in its stubs).
Context: TypeAlias = "grpc.aio.ServicerContext[Req, Resp]"
#: A unary-unary method: one request in, one response out.
Unary: TypeAlias = "Callable[[Req, grpc.aio.ServicerContext[Req, Resp]], Awaitable[Resp]]"
#: A unary-stream method: an async generator of responses, or a coroutine returning one.
Streaming: TypeAlias = (
    "Callable[[Req, grpc.aio.ServicerContext[Req, Resp]], "
    "AsyncIterator[Resp] | Awaitable[AsyncIterator[Resp]]]")
