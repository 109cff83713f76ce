"""runtime.v1.RuntimeService: protobuf in, core call, protobuf out. No behaviour here."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Awaitable, Mapping, Sequence
from typing import cast

from cri_api.v1 import api_pb2 as pb
from google.protobuf.message import Message

from pycrid.core.containers.checkpoint import checkpoint_container
from pycrid.core.containers.create import create_container
from pycrid.core.containers.exec import exec_sync
from pycrid.core.containers.remove import remove_container
from pycrid.core.containers.reopen_log import reopen_log
from pycrid.core.containers.start import start_container
from pycrid.core.containers.status import container_details, list_containers
from pycrid.core.containers.stop import stop_container
from pycrid.core.containers.update import update_resources
from pycrid.core.cri_service import KUBE_API_VERSION, CRIService
from pycrid.core.pods.remove import remove_pod
from pycrid.core.pods.run import run_pod
from pycrid.core.pods.status import list_pods, pod_details
from pycrid.core.pods.stop import stop_pod
from pycrid.core.pods.update_resources import update_pod_resources
from pycrid.core.streams import ContainerStreams
from pycrid.cri import record_messages as convert
from pycrid.cri import stats_messages as stats_pb
from pycrid.cri.handler_types import Context
from pycrid.cri.status_json import status_info_map
from pycrid.cri_fields import go_json
from pycrid.streaming.server import StreamServer


class RuntimeServicer:
    """The RuntimeService methods (all of them; one that is missing would answer
    UNIMPLEMENTED)."""

    def __init__(self, core: CRIService, streams: ContainerStreams,
                 stream_server: StreamServer) -> None:
        self.core = core
        self.streams = streams
        self.stream_server = stream_server
        self._pod_msgs = convert.MessageCache(convert.sandbox_pb)
        self._container_msgs = convert.MessageCache(convert.container_pb)

    async def Version(
        self, request: pb.VersionRequest,
        context: Context[pb.VersionRequest, pb.VersionResponse],
    ) -> pb.VersionResponse:
        name, version, api = self.core.version()
        return pb.VersionResponse(version=KUBE_API_VERSION, runtime_name=name,
                                  runtime_version=version, runtime_api_version=api)

    async def Status(self, request: pb.StatusRequest,
                     context: Context[pb.StatusRequest, pb.StatusResponse]) -> pb.StatusResponse:
        conds = [pb.RuntimeCondition(type=c.type, status=c.status, reason=c.reason,
                                     message=c.message) for c in await self.core.conditions()]
        info = (status_info_map(self.core.status_info(), self.stream_server.base_url)
                if request.verbose else {})
        handlers = [pb.RuntimeHandler(name=name, features=pb.RuntimeHandlerFeatures(
            recursive_read_only_mounts=f.recursive_read_only_mounts,
            user_namespaces=f.user_namespaces)) for name, f in self.core.runtime_handlers()]
        return pb.StatusResponse(
            status=pb.RuntimeStatus(conditions=conds), info=info, runtime_handlers=handlers,
            features=pb.RuntimeFeatures(supplemental_groups_policy=True))

    async def RuntimeConfig(
        self, request: pb.RuntimeConfigRequest,
        context: Context[pb.RuntimeConfigRequest, pb.RuntimeConfigResponse],
    ) -> pb.RuntimeConfigResponse:
        driver = (pb.CgroupDriver.SYSTEMD if self.core.cgroup_driver() == "systemd"
                  else pb.CgroupDriver.CGROUPFS)
        return pb.RuntimeConfigResponse(linux=pb.LinuxRuntimeConfiguration(cgroup_driver=driver))

    async def UpdateRuntimeConfig(
        self, request: pb.UpdateRuntimeConfigRequest,
        context: Context[pb.UpdateRuntimeConfigRequest, pb.UpdateRuntimeConfigResponse],
    ) -> pb.UpdateRuntimeConfigResponse:
        await self.core.update_runtime_config(
            request.runtime_config.network_config.pod_cidr)
        return pb.UpdateRuntimeConfigResponse()

    # ---- pod sandboxes -----------------------------------------------------------------

    async def RunPodSandbox(
        self, request: pb.RunPodSandboxRequest,
        context: Context[pb.RunPodSandboxRequest, pb.RunPodSandboxResponse],
    ) -> pb.RunPodSandboxResponse:
        sid = await run_pod(self.core.pods, request.config, request.runtime_handler)
        return pb.RunPodSandboxResponse(pod_sandbox_id=sid)

    async def StopPodSandbox(
        self, request: pb.StopPodSandboxRequest,
        context: Context[pb.StopPodSandboxRequest, pb.StopPodSandboxResponse],
    ) -> pb.StopPodSandboxResponse:
        await stop_pod(self.core.pods, request.pod_sandbox_id)
        return pb.StopPodSandboxResponse()

    async def RemovePodSandbox(
        self, request: pb.RemovePodSandboxRequest,
        context: Context[pb.RemovePodSandboxRequest, pb.RemovePodSandboxResponse],
    ) -> pb.RemovePodSandboxResponse:
        await remove_pod(self.core.pods, request.pod_sandbox_id)
        return pb.RemovePodSandboxResponse()

    async def PodSandboxStatus(
        self, request: pb.PodSandboxStatusRequest,
        context: Context[pb.PodSandboxStatusRequest, pb.PodSandboxStatusResponse],
    ) -> pb.PodSandboxStatusResponse:
        rec = self.core.pods.find(request.pod_sandbox_id, visible=True)
        resp = pb.PodSandboxStatusResponse(status=convert.sandbox_status_pb(rec),
                                           timestamp=time.time_ns())
        if request.verbose:
            # The core's details are JSON objects (typed with Any there).
            details = await cast("Awaitable[Mapping[str, object]]",
                                 pod_details(self.core.pods, rec))
            resp.info.update(convert.verbose_info(rec, details))
            resp.containers_statuses.extend(
                convert.container_status_pb(c) for c in self.core.containers.of_sandbox(rec.id))
        return resp

    async def ListPodSandbox(
        self, request: pb.ListPodSandboxRequest,
        context: Context[pb.ListPodSandboxRequest, pb.ListPodSandboxResponse],
    ) -> pb.ListPodSandboxResponse:
        flt = request.filter if request.HasField("filter") else None
        return pb.ListPodSandboxResponse(items=self._pod_msgs.messages(
            list_pods(self.core.pods, flt), complete=_selects_all(flt)))

    # ---- containers --------------------------------------------------------------------

    async def CreateContainer(
        self, request: pb.CreateContainerRequest,
        context: Context[pb.CreateContainerRequest, pb.CreateContainerResponse],
    ) -> pb.CreateContainerResponse:
        sandbox_config = request.sandbox_config if request.HasField("sandbox_config") else None
        cid = await create_container(self.core.containers, request.pod_sandbox_id,
                                     request.config, sandbox_config)
        return pb.CreateContainerResponse(container_id=cid)

    async def StartContainer(
        self, request: pb.StartContainerRequest,
        context: Context[pb.StartContainerRequest, pb.StartContainerResponse],
    ) -> pb.StartContainerResponse:
        await start_container(self.core.containers, request.container_id)
        return pb.StartContainerResponse()

    async def StopContainer(
        self, request: pb.StopContainerRequest,
        context: Context[pb.StopContainerRequest, pb.StopContainerResponse],
    ) -> pb.StopContainerResponse:
        await stop_container(self.core.containers, request.container_id, request.timeout)
        return pb.StopContainerResponse()

    async def RemoveContainer(
        self, request: pb.RemoveContainerRequest,
        context: Context[pb.RemoveContainerRequest, pb.RemoveContainerResponse],
    ) -> pb.RemoveContainerResponse:
        await remove_container(self.core.containers, request.container_id)
        return pb.RemoveContainerResponse()

    async def ListContainers(
        self, request: pb.ListContainersRequest,
        context: Context[pb.ListContainersRequest, pb.ListContainersResponse],
    ) -> pb.ListContainersResponse:
        flt = request.filter if request.HasField("filter") else None
        return pb.ListContainersResponse(containers=self._container_msgs.messages(
            list_containers(self.core.containers, flt), complete=_selects_all(flt)))

    async def ContainerStatus(
        self, request: pb.ContainerStatusRequest,
        context: Context[pb.ContainerStatusRequest, pb.ContainerStatusResponse],
    ) -> pb.ContainerStatusResponse:
        rec = self.core.containers.find(request.container_id, visible=True)
        resp = pb.ContainerStatusResponse(status=convert.container_status_pb(rec))
        if request.verbose:
            details = cast("Mapping[str, object]", container_details(self.core.containers, rec))
            resp.info.update(convert.verbose_info(rec, details))
        return resp

    async def ExecSync(
        self, request: pb.ExecSyncRequest,
        context: Context[pb.ExecSyncRequest, pb.ExecSyncResponse],
    ) -> pb.ExecSyncResponse:
        code, out, err = await exec_sync(
            self.core.containers, request.container_id, request.cmd, request.timeout)
        return pb.ExecSyncResponse(stdout=out, stderr=err, exit_code=code)

    async def Exec(self, request: pb.ExecRequest,
                   context: Context[pb.ExecRequest, pb.ExecResponse]) -> pb.ExecResponse:
        req = self.streams.exec_request(
            request.container_id, request.cmd, tty=request.tty, stdin=request.stdin,
            stdout=request.stdout, stderr=request.stderr)
        return pb.ExecResponse(url=self.stream_server.url(req))

    async def Attach(self, request: pb.AttachRequest,
                     context: Context[pb.AttachRequest, pb.AttachResponse]) -> pb.AttachResponse:
        req = self.streams.attach_request(
            request.container_id, tty=request.tty, stdin=request.stdin, stdout=request.stdout,
            stderr=request.stderr)
        return pb.AttachResponse(url=self.stream_server.url(req))

    async def PortForward(
        self, request: pb.PortForwardRequest,
        context: Context[pb.PortForwardRequest, pb.PortForwardResponse],
    ) -> pb.PortForwardResponse:
        req = self.streams.port_forward_request(request.pod_sandbox_id, request.port)
        return pb.PortForwardResponse(url=self.stream_server.url(req))

    async def UpdateContainerResources(
        self, request: pb.UpdateContainerResourcesRequest,
        context: Context[pb.UpdateContainerResourcesRequest, pb.UpdateContainerResourcesResponse],
    ) -> pb.UpdateContainerResourcesResponse:
        await update_resources(
            self.core.containers, request.container_id,
            request.linux if request.HasField("linux") else None)
        return pb.UpdateContainerResourcesResponse()

    async def UpdatePodSandboxResources(
        self, request: pb.UpdatePodSandboxResourcesRequest,
        context: Context[pb.UpdatePodSandboxResourcesRequest, pb.UpdatePodSandboxResourcesResponse],
    ) -> pb.UpdatePodSandboxResourcesResponse:
        await update_pod_resources(
            self.core.pods, request.pod_sandbox_id,
            request.overhead if request.HasField("overhead") else None,
            request.resources if request.HasField("resources") else None)
        return pb.UpdatePodSandboxResourcesResponse()

    async def ReopenContainerLog(
        self, request: pb.ReopenContainerLogRequest,
        context: Context[pb.ReopenContainerLogRequest, pb.ReopenContainerLogResponse],
    ) -> pb.ReopenContainerLogResponse:
        await reopen_log(self.core.containers, request.container_id)
        return pb.ReopenContainerLogResponse()

    async def CheckpointContainer(
        self, request: pb.CheckpointContainerRequest,
        context: Context[pb.CheckpointContainerRequest, pb.CheckpointContainerResponse],
    ) -> pb.CheckpointContainerResponse:
        await checkpoint_container(
            self.core.containers, request.container_id, request.location, request.timeout,
            lambda rec: go_json(convert.container_status_pb(rec)))
        return pb.CheckpointContainerResponse()

    # ---- stats and metrics (answered from the sampler's memory) ---------------------------

    async def ContainerStats(
        self, request: pb.ContainerStatsRequest,
        context: Context[pb.ContainerStatsRequest, pb.ContainerStatsResponse],
    ) -> pb.ContainerStatsResponse:
        view = await self.core.stats.container(request.container_id)
        return pb.ContainerStatsResponse(stats=stats_pb.container_stats_pb(view))

    async def ListContainerStats(
        self, request: pb.ListContainerStatsRequest,
        context: Context[pb.ListContainerStatsRequest, pb.ListContainerStatsResponse],
    ) -> pb.ListContainerStatsResponse:
        flt = request.filter if request.HasField("filter") else None
        views = await self.core.stats.list_containers(flt)
        return pb.ListContainerStatsResponse(
            stats=[stats_pb.container_stats_pb(v) for v in views])

    async def PodSandboxStats(
        self, request: pb.PodSandboxStatsRequest,
        context: Context[pb.PodSandboxStatsRequest, pb.PodSandboxStatsResponse],
    ) -> pb.PodSandboxStatsResponse:
        view = await self.core.stats.pod(request.pod_sandbox_id)
        return pb.PodSandboxStatsResponse(stats=stats_pb.pod_stats_pb(view))

    async def ListPodSandboxStats(
        self, request: pb.ListPodSandboxStatsRequest,
        context: Context[pb.ListPodSandboxStatsRequest, pb.ListPodSandboxStatsResponse],
    ) -> pb.ListPodSandboxStatsResponse:
        flt = request.filter if request.HasField("filter") else None
        views = await self.core.stats.list_pods(flt)
        return pb.ListPodSandboxStatsResponse(stats=[stats_pb.pod_stats_pb(v) for v in views])

    async def ListMetricDescriptors(
        self, request: pb.ListMetricDescriptorsRequest,
        context: Context[pb.ListMetricDescriptorsRequest, pb.ListMetricDescriptorsResponse],
    ) -> pb.ListMetricDescriptorsResponse:
        return pb.ListMetricDescriptorsResponse(
            descriptors=[stats_pb.descriptor_pb(d) for d in self.core.stats.descriptors()])

    async def ListPodSandboxMetrics(
        self, request: pb.ListPodSandboxMetricsRequest,
        context: Context[pb.ListPodSandboxMetricsRequest, pb.ListPodSandboxMetricsResponse],
    ) -> pb.ListPodSandboxMetricsResponse:
        pods = await self.core.stats.pod_metrics()
        return pb.ListPodSandboxMetricsResponse(
            pod_metrics=[stats_pb.pod_metrics_pb(*p) for p in pods])

    async def GetContainerEvents(
        self, request: pb.GetEventsRequest,
        context: Context[pb.GetEventsRequest, pb.ContainerEventResponse],
    ) -> AsyncIterator[pb.ContainerEventResponse]:
        sub = self.core.events.broadcast.subscribe()
        try:
            while (event := await sub.get()) is not None:
                yield convert.container_event_pb(event)
        finally:
            sub.close()


def _selects_all(flt: Message | None) -> bool:
    """No filter, or one with no field set (the kubelet's relist sends an empty one)."""
    return flt is None or not cast("Sequence[object]", flt.ListFields())
