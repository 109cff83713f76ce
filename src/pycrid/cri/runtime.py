"""runtime.v1.RuntimeService: protobuf in, core call, protobuf out. No behaviour here."""

from __future__ import annotations

from typing import Any

from cri_api.v1 import api_pb2 as pb

from pycrid.core.service import KUBE_API_VERSION, CRIService


class RuntimeServicer:
    """The RuntimeService methods pycrid implements; the rest answer UNIMPLEMENTED."""

    def __init__(self, core: CRIService) -> None:
        self.core = core

    async def Version(self, request: Any, context: Any) -> Any:
        name, version, api = self.core.version()
        return pb.VersionResponse(version=KUBE_API_VERSION, runtime_name=name,
                                  runtime_version=version, runtime_api_version=api)

    async def Status(self, request: Any, context: Any) -> Any:
        conds = [pb.RuntimeCondition(type=c.type, status=c.status, reason=c.reason,
                                     message=c.message) for c in self.core.conditions()]
        info = self.core.status_info() if request.verbose else {}
        return pb.StatusResponse(status=pb.RuntimeStatus(conditions=conds), info=info)

    async def RuntimeConfig(self, request: Any, context: Any) -> Any:
        driver = (pb.CgroupDriver.SYSTEMD if self.core.cgroup_driver() == "systemd"
                  else pb.CgroupDriver.CGROUPFS)
        return pb.RuntimeConfigResponse(linux=pb.LinuxRuntimeConfiguration(cgroup_driver=driver))
