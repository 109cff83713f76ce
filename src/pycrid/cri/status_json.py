"""The verbose ``Status`` info map: the core's StatusInfo as one JSON string per key.

The keys and shapes are what ``pycrid status`` (and crictl info) read: ``config``,
``cniconfig`` (containerd's shape) and ``warnings`` as containerd names them, the rest
pycrid's own. The bytes are part of the interface: a test compares them.
"""

from __future__ import annotations

import dataclasses
import inspect
import json
from collections.abc import Mapping
from typing import cast

from pycrid.core.status_info import StatusInfo


def status_info_map(info: StatusInfo, streaming_url: str) -> dict[str, str]:
    sec = info.host_security
    security: dict[str, bool] = {
        "seccomp": sec.seccomp, "apparmor": sec.apparmor, "selinux": sec.selinux}
    streaming: dict[str, str] = {"url": streaming_url}
    return {
        "config": json.dumps(_jsonable(info.config), sort_keys=True),
        "cniconfig": json.dumps(info.cni),
        "warnings": json.dumps(info.warnings),
        # What security-context fields can be honoured here.
        "hostSecurity": json.dumps(security),
        "pods": json.dumps(info.pods),
        "containers": json.dumps(info.containers),
        "nri": json.dumps(_jsonable(info.nri)),
        "daemon": json.dumps(_jsonable(info.daemon)),
        "images": json.dumps(_jsonable(info.images)),
        "checkpoint": json.dumps(_jsonable(info.checkpoint)),
        "streaming": json.dumps(streaming),
        # Each runtime handler (RuntimeClass) by name, with what it can do: an object, so
        # `crictl info` shows it parsed (it parses objects only), under a key of its own
        # (crictl prints the CRI's own handler list as "runtimeHandlers").
        "handlers": json.dumps(_by_name(info)),
    }


def _by_name(info: StatusInfo) -> dict[str, object]:
    return {h.name: _jsonable(h) for h in info.handlers}


def _jsonable(obj: object) -> object:
    """Dataclasses as objects (fields in order), tuples as lists, all the way down."""
    if dataclasses.is_dataclass(obj) and not inspect.isclass(obj):
        fields = cast("tuple[dataclasses.Field[object], ...]", dataclasses.fields(obj))
        return {f.name: _jsonable(cast(object, getattr(obj, f.name))) for f in fields}
    if isinstance(obj, dict):
        return {k: _jsonable(v) for k, v in cast("Mapping[object, object]", obj).items()}
    if isinstance(obj, list | tuple):
        return [_jsonable(v) for v in cast("list[object] | tuple[object, ...]", obj)]
    return obj
