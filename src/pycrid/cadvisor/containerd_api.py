"""The gRPC services of the containerd socket: Containers and Tasks (read side), Version.

Every call but Version names its containerd namespace in the ``containerd-namespace``
metadata (cAdvisor sends ``k8s.io``, its ``--containerd-namespace`` default, which is
containerd's CRI namespace). pycrid's objects all live in ``k8s.io``: another namespace
is empty, none at all is FailedPrecondition, as in containerd. Methods not declared in
the protos (every write) answer UNIMPLEMENTED.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import re
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc
from google.protobuf import message_factory
from google.protobuf.descriptor import ServiceDescriptor
from google.protobuf.message import Message

from pycrid import errors, release
from pycrid.cadvisor import filters
from pycrid.cadvisor.proto import containers_pb2, tasks_pb2, version_pb2
from pycrid.cadvisor.view import ContainerdView
from pycrid.cri.instrument import status_of

log = logging.getLogger(__name__)

#: containerd's CRI namespace, the only one that holds anything here.
NAMESPACE = "k8s.io"
NAMESPACE_KEY = "containerd-namespace"
#: containerd's rule for identifiers, namespaces included (76 characters at most).
_NAMESPACE_NAME = re.compile(r"[A-Za-z0-9]+(?:[._-][A-Za-z0-9]+)*")
_NAMESPACE_MAX = 76


def namespace_of(context: grpc.aio.ServicerContext[Message, Message]) -> str:
    """The call's containerd namespace: FailedPrecondition without one, InvalidArgument
    for a name containerd would refuse."""
    for key, value in context.invocation_metadata() or ():
        if key == NAMESPACE_KEY:
            ns = value if isinstance(value, str) else value.decode()
            if len(ns) > _NAMESPACE_MAX or not _NAMESPACE_NAME.fullmatch(ns):
                raise errors.InvalidArgument(f"namespace {ns!r}: invalid namespace name")
            return ns
    raise errors.FailedPrecondition(
        f"namespace is required: set the {NAMESPACE_KEY} gRPC metadata (pycrid's objects "
        f"are in {NAMESPACE})")


class ContainersService:
    def __init__(self, view: ContainerdView) -> None:
        self.view = view

    async def Get(self, request: Any, context: Any) -> Any:
        ns = namespace_of(context)
        if not request.id:
            raise errors.InvalidArgument("container id is required")
        if ns != NAMESPACE:
            raise errors.NotFound(f'container "{request.id}" in namespace "{ns}": not found')
        found = await asyncio.to_thread(self.view.container, request.id, ns)
        log.debug("containerd API: container %s looked up", request.id)
        return containers_pb2.GetContainerResponse(container=found)

    async def _list(self, request: Any, context: Any) -> list[containers_pb2.Container]:
        ns = namespace_of(context)
        match = filters.matcher(list(request.filters))
        if ns != NAMESPACE:
            return []
        return await asyncio.to_thread(self._read_all, match)

    def _read_all(self, match: Callable[[filters.Fields], bool]) -> list[containers_pb2.Container]:
        out = []
        for cid in self.view.ids():
            try:
                c = self.view.container(cid, NAMESPACE)
            except errors.NotFound:  # no spec yet, or removed meanwhile
                continue
            fields = filters.container_fields(id=c.id, image=c.image, runtime=c.runtime.name,
                                              snapshotter=c.snapshotter, labels=c.labels)
            if match(fields):
                out.append(c)
        return out

    async def List(self, request: Any, context: Any) -> Any:
        return containers_pb2.ListContainersResponse(containers=await self._list(request,
                                                                                 context))

    async def ListStream(self, request: Any, context: Any) -> AsyncIterator[Any]:
        for c in await self._list(request, context):
            yield containers_pb2.ListContainerMessage(container=c)


class TasksService:
    def __init__(self, view: ContainerdView) -> None:
        self.view = view

    async def Get(self, request: Any, context: Any) -> Any:
        ns = namespace_of(context)
        if not request.container_id:
            raise errors.InvalidArgument("container id is required")
        if request.exec_id:  # pycrid's execs are runc processes of their own, not tasks
            raise errors.NotFound(f"process {request.exec_id} of {request.container_id} "
                                  "not found")
        if ns != NAMESPACE:
            raise errors.NotFound(f'container "{request.container_id}" in namespace "{ns}": '
                                  "not found")
        return tasks_pb2.GetResponse(process=self.view.task(request.container_id, ns))

    async def List(self, request: Any, context: Any) -> Any:
        ns = namespace_of(context)
        return tasks_pb2.ListTasksResponse(tasks=self.view.tasks() if ns == NAMESPACE else [])


class VersionService:
    async def Version(self, request: Any, context: Any) -> Any:
        # containerd's Version: the release and, as revision, the commit.
        return version_pb2.VersionResponse(version=release.VERSION,
                                           revision=release.commit() or "unknown")


def _wrap(full: str, fn: Callable[..., Any], streaming: bool) -> Callable[..., Any]:
    """Errors to gRPC codes (the CRI edge's map). NotFound is an ordinary answer here:
    cAdvisor asks about every cgroup on the node whose name carries a 64-hex id, other
    runtimes' included, so it is not logged (nor are those ids)."""

    async def fail(exc: Exception, context: grpc.aio.ServicerContext[Message, Message]) -> None:
        code, msg = status_of(exc)
        if code != grpc.StatusCode.NOT_FOUND:
            level = logging.ERROR if code == grpc.StatusCode.INTERNAL else logging.WARNING
            log.log(level, "containerd API %s failed: %s", full, msg,
                    exc_info=exc if code == grpc.StatusCode.INTERNAL else None)
        await context.abort(code, msg)

    if streaming:
        async def stream(request: Any, context: grpc.aio.ServicerContext[Message, Message],
                         ) -> AsyncIterator[Any]:
            try:
                async for item in fn(request, context):
                    yield item
            except grpc.aio.AbortError:
                raise
            except Exception as exc:
                await fail(exc, context)
        return stream

    @functools.wraps(fn)
    async def unary(request: Any, context: grpc.aio.ServicerContext[Message, Message]) -> Any:
        try:
            return await fn(request, context)
        except grpc.aio.AbortError:
            raise
        except Exception as exc:
            await fail(exc, context)
            raise  # abort() raised already

    return unary


def generic_handler(service: ServiceDescriptor, impl: object) -> grpc.GenericRpcHandler:
    """A gRPC handler for ``service`` from its descriptor and ``impl``'s methods of the same
    names (no generated gRPC stubs needed)."""
    handlers = {}
    for method in service.methods:
        request = message_factory.GetMessageClass(method.input_type)
        response = message_factory.GetMessageClass(method.output_type)
        fn = _wrap(f"/{service.full_name}/{method.name}", getattr(impl, method.name),
                   method.server_streaming)
        make = (grpc.unary_stream_rpc_method_handler if method.server_streaming
                else grpc.unary_unary_rpc_method_handler)
        handlers[method.name] = make(fn, request_deserializer=request.FromString,
                                     response_serializer=response.SerializeToString)
    return grpc.method_handlers_generic_handler(service.full_name, handlers)


def handlers(view: ContainerdView) -> list[grpc.GenericRpcHandler]:
    """Every service of the containerd socket."""
    return [
        generic_handler(containers_pb2.DESCRIPTOR.services_by_name["Containers"],
                        ContainersService(view)),
        generic_handler(tasks_pb2.DESCRIPTOR.services_by_name["Tasks"], TasksService(view)),
        generic_handler(version_pb2.DESCRIPTOR.services_by_name["Version"], VersionService()),
    ]


__all__ = ["NAMESPACE", "ContainersService", "TasksService", "VersionService",
           "generic_handler", "handlers", "namespace_of"]
