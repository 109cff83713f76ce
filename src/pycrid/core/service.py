"""CRIService: the core that the CRI servicers call. Pods and containers join it next.

It holds the parts (the image service now; sandbox controller, runtime,
network and NRI later) and answers the runtime-wide questions: version,
readiness conditions, runtime config.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import Any

from pycrid import __version__
from pycrid.config.schema import Config, RuntimeConfig
from pycrid.images.service import ImageService

RUNTIME_NAME = "pycrid"
CRI_API_VERSION = "v1"
#: VersionResponse.version: the kubelet API version, a constant in containerd and CRI-O too.
KUBE_API_VERSION = "0.1.0"


@dataclass(frozen=True)
class Condition:
    type: str
    status: bool
    reason: str = ""
    message: str = ""


class CRIService:
    def __init__(
        self,
        *,
        images: ImageService,
        runtime_config: RuntimeConfig,
        config: Config,
        warnings: list[str],
    ) -> None:
        self.images = images
        self.runtime_config = runtime_config
        self.config = config
        self.warnings = list(warnings)

    def version(self) -> tuple[str, str, str]:
        """(runtime name, runtime version, CRI API version)."""
        return RUNTIME_NAME, __version__, CRI_API_VERSION

    def conditions(self) -> list[Condition]:
        return [
            Condition("RuntimeReady", True),
            # Pod networking (CNI) is not part of pycrid yet; say so rather than claim it.
            Condition("NetworkReady", False, "NetworkPluginNotReady",
                      "pycrid has no pod network (CNI) support yet"),
        ]

    def status_info(self) -> dict[str, str]:
        """Status verbose info: the effective config and the start-up warnings, as JSON."""
        return {
            "config": json.dumps(_jsonable(self.config), sort_keys=True),
            "warnings": json.dumps(self.warnings),
        }

    def cgroup_driver(self) -> str:
        return self.runtime_config.cgroup_driver


def _jsonable(obj: Any) -> Any:
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: _jsonable(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, dict):
        return {k: _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_jsonable(v) for v in obj]
    return obj
