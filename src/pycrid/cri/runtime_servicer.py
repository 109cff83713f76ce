"""runtime.v1.RuntimeService: protobuf in, core call, protobuf out. No behaviour here."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from typing import Any

from cri_api.v1 import api_pb2 as pb

from pycrid.core.containers.create import create_container
from pycrid.core.containers.exec import exec_sync
from pycrid.core.containers.remove import remove_container
from pycrid.core.containers.reopen_log import reopen_log
from pycrid.core.containers.start import start_container
from pycrid.core.containers.status import container_details, list_containers
from pycrid.core.containers.stop import stop_container
from pycrid.core.containers.update import update_resources
from pycrid.core.cri_service import KUBE_API_VERSION, CRIService
from pycrid.core.streams import ContainerStreams
from pycrid.cri import record_messages as convert
from pycrid.cri import stats_messages as stats_pb
from pycrid.streaming.server import StreamServer


class RuntimeServicer:
    """The RuntimeService methods pycrid implements; the rest answer UNIMPLEMENTED."""

    def __init__(self, core: CRIService, streams: ContainerStreams,
                 stream_server: StreamServer) -> None:
        self.core = core
        self.streams = streams
        self.stream_server = stream_server
        self._pod_msgs = convert.MessageCache(convert.sandbox_pb)
        self._container_msgs = convert.MessageCache(convert.container_pb)

    async def Version(self, request: Any, context: Any) -> Any:
        name, version, api = self.core.version()
        return pb.VersionResponse(version=KUBE_API_VERSION, runtime_name=name,
                                  runtime_version=version, runtime_api_version=api)

    async def Status(self, request: Any, context: Any) -> Any:
        conds = [pb.RuntimeCondition(type=c.type, status=c.status, reason=c.reason,
                                     message=c.message) for c in await self.core.conditions()]
        info = self.core.status_info() if request.verbose else {}
        if request.verbose:
            info["streaming"] = json.dumps({"url": self.stream_server.base_url})
        handlers = [pb.RuntimeHandler(name=name, features=pb.RuntimeHandlerFeatures(
            recursive_read_only_mounts=f.recursive_read_only_mounts,
            user_namespaces=f.user_namespaces)) for name, f in self.core.runtime_handlers()]
        return pb.StatusResponse(
            status=pb.RuntimeStatus(conditions=conds), info=info, runtime_handlers=handlers,
            features=pb.RuntimeFeatures(supplemental_groups_policy=True))

    async def RuntimeConfig(self, request: Any, context: Any) -> Any:
        driver = (pb.CgroupDriver.SYSTEMD if self.core.cgroup_driver() == "systemd"
                  else pb.CgroupDriver.CGROUPFS)
        return pb.RuntimeConfigResponse(linux=pb.LinuxRuntimeConfiguration(cgroup_driver=driver))

    async def UpdateRuntimeConfig(self, request: Any, context: Any) -> Any:
        await self.core.update_runtime_config(
            request.runtime_config.network_config.pod_cidr)
        return pb.UpdateRuntimeConfigResponse()

    # ---- pod sandboxes -----------------------------------------------------------------

    async def RunPodSandbox(self, request: Any, context: Any) -> Any:
        sid = await self.core.pods.run(request.config, request.runtime_handler)
        return pb.RunPodSandboxResponse(pod_sandbox_id=sid)

    async def StopPodSandbox(self, request: Any, context: Any) -> Any:
        await self.core.pods.stop(request.pod_sandbox_id)
        return pb.StopPodSandboxResponse()

    async def RemovePodSandbox(self, request: Any, context: Any) -> Any:
        await self.core.pods.remove(request.pod_sandbox_id)
        return pb.RemovePodSandboxResponse()

    async def PodSandboxStatus(self, request: Any, context: Any) -> Any:
        rec = self.core.pods.find(request.pod_sandbox_id, visible=True)
        resp = pb.PodSandboxStatusResponse(status=convert.sandbox_status_pb(rec),
                                           timestamp=time.time_ns())
        if request.verbose:
            resp.info.update(convert.verbose_info(rec, await self.core.pods.details(rec)))
            resp.containers_statuses.extend(
                convert.container_status_pb(c) for c in self.core.containers.of_sandbox(rec.id))
        return resp

    async def ListPodSandbox(self, request: Any, context: Any) -> Any:
        flt = request.filter if request.HasField("filter") else None
        return pb.ListPodSandboxResponse(items=self._pod_msgs.messages(
            self.core.pods.list(flt), complete=_selects_all(flt)))

    # ---- containers --------------------------------------------------------------------

    async def CreateContainer(self, request: Any, context: Any) -> Any:
        sandbox_config = request.sandbox_config if request.HasField("sandbox_config") else None
        cid = await create_container(self.core.containers, request.pod_sandbox_id,
                                     request.config, sandbox_config)
        return pb.CreateContainerResponse(container_id=cid)

    async def StartContainer(self, request: Any, context: Any) -> Any:
        await start_container(self.core.containers, request.container_id)
        return pb.StartContainerResponse()

    async def StopContainer(self, request: Any, context: Any) -> Any:
        await stop_container(self.core.containers, request.container_id, request.timeout)
        return pb.StopContainerResponse()

    async def RemoveContainer(self, request: Any, context: Any) -> Any:
        await remove_container(self.core.containers, request.container_id)
        return pb.RemoveContainerResponse()

    async def ListContainers(self, request: Any, context: Any) -> Any:
        flt = request.filter if request.HasField("filter") else None
        return pb.ListContainersResponse(containers=self._container_msgs.messages(
            list_containers(self.core.containers, flt), complete=_selects_all(flt)))

    async def ContainerStatus(self, request: Any, context: Any) -> Any:
        rec = self.core.containers.find(request.container_id, visible=True)
        resp = pb.ContainerStatusResponse(status=convert.container_status_pb(rec))
        if request.verbose:
            resp.info.update(convert.verbose_info(
                rec, container_details(self.core.containers, rec)))
        return resp

    async def ExecSync(self, request: Any, context: Any) -> Any:
        code, out, err = await exec_sync(
            self.core.containers, request.container_id, request.cmd, request.timeout)
        return pb.ExecSyncResponse(stdout=out, stderr=err, exit_code=code)

    async def Exec(self, request: Any, context: Any) -> Any:
        req = self.streams.exec_request(
            request.container_id, request.cmd, tty=request.tty, stdin=request.stdin,
            stdout=request.stdout, stderr=request.stderr)
        return pb.ExecResponse(url=self.stream_server.url(req))

    async def Attach(self, request: Any, context: Any) -> Any:
        req = self.streams.attach_request(
            request.container_id, tty=request.tty, stdin=request.stdin, stdout=request.stdout,
            stderr=request.stderr)
        return pb.AttachResponse(url=self.stream_server.url(req))

    async def PortForward(self, request: Any, context: Any) -> Any:
        req = self.streams.port_forward_request(request.pod_sandbox_id, request.port)
        return pb.PortForwardResponse(url=self.stream_server.url(req))

    async def UpdateContainerResources(self, request: Any, context: Any) -> Any:
        await update_resources(
            self.core.containers, request.container_id,
            request.linux if request.HasField("linux") else None)
        return pb.UpdateContainerResourcesResponse()

    async def UpdatePodSandboxResources(self, request: Any, context: Any) -> Any:
        await self.core.pods.update_resources(
            request.pod_sandbox_id,
            request.overhead if request.HasField("overhead") else None,
            request.resources if request.HasField("resources") else None)
        return pb.UpdatePodSandboxResourcesResponse()

    async def ReopenContainerLog(self, request: Any, context: Any) -> Any:
        await reopen_log(self.core.containers, request.container_id)
        return pb.ReopenContainerLogResponse()

    # ---- stats and metrics (answered from the sampler's memory) ---------------------------

    async def ContainerStats(self, request: Any, context: Any) -> Any:
        view = await self.core.stats.container(request.container_id)
        return pb.ContainerStatsResponse(stats=stats_pb.container_stats_pb(view))

    async def ListContainerStats(self, request: Any, context: Any) -> Any:
        flt = request.filter if request.HasField("filter") else None
        views = await self.core.stats.list_containers(flt)
        return pb.ListContainerStatsResponse(
            stats=[stats_pb.container_stats_pb(v) for v in views])

    async def PodSandboxStats(self, request: Any, context: Any) -> Any:
        view = await self.core.stats.pod(request.pod_sandbox_id)
        return pb.PodSandboxStatsResponse(stats=stats_pb.pod_stats_pb(view))

    async def ListPodSandboxStats(self, request: Any, context: Any) -> Any:
        flt = request.filter if request.HasField("filter") else None
        views = await self.core.stats.list_pods(flt)
        return pb.ListPodSandboxStatsResponse(stats=[stats_pb.pod_stats_pb(v) for v in views])

    async def ListMetricDescriptors(self, request: Any, context: Any) -> Any:
        return pb.ListMetricDescriptorsResponse(
            descriptors=[stats_pb.descriptor_pb(d) for d in self.core.stats.descriptors()])

    async def ListPodSandboxMetrics(self, request: Any, context: Any) -> Any:
        pods = await self.core.stats.pod_metrics()
        return pb.ListPodSandboxMetricsResponse(
            pod_metrics=[stats_pb.pod_metrics_pb(*p) for p in pods])

    async def GetContainerEvents(self, request: Any, context: Any) -> AsyncIterator[Any]:
        sub = self.core.events.broadcast.subscribe()
        try:
            while (event := await sub.get()) is not None:
                yield convert.container_event_pb(event)
        finally:
            sub.close()


def _selects_all(flt: Any) -> bool:
    """No filter, or one with no field set (the kubelet's relist sends an empty one)."""
    return flt is None or not flt.ListFields()
