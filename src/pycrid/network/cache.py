"""The CNI result cache: what every successful ADD was, kept on disk until its DEL.

The file layout and fields are libcni's (``results/<network>-<pod id>-<ifname>``,
kind ``cniCacheV1``, the config bytes in base64 as Go encodes ``[]byte``), so CNI
tooling reads them. A DEL replays the cached config, arguments and capabilities
with the cached result as ``prevResult`` (CRI-O's ocicni does the same), which is
what lets StopPodSandbox release a pod's IP after a daemon restart or a change of
the config directory.
"""

from __future__ import annotations

import base64
import contextlib
import json
import logging
import os
from dataclasses import dataclass
from typing import Any

log = logging.getLogger(__name__)

KIND = "cniCacheV1"


@dataclass(frozen=True)
class CachedAttachment:
    network: str
    container_id: str
    ifname: str
    netns: str
    config: bytes
    args: tuple[tuple[str, str], ...]
    capabilities: dict[str, Any]
    result: dict[str, Any]

    def to_json(self) -> dict[str, Any]:
        return {"kind": KIND, "containerId": self.container_id,
                "config": base64.b64encode(self.config).decode(), "ifName": self.ifname,
                "networkName": self.network, "netns": self.netns,
                "cniArgs": [list(a) for a in self.args], "capabilityArgs": self.capabilities,
                "result": self.result}

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> CachedAttachment:
        if doc.get("kind") != KIND:
            raise ValueError(f"cache entry of kind {doc.get('kind')!r}, not {KIND}")
        return cls(network=doc["networkName"], container_id=doc["containerId"],
                   ifname=doc["ifName"], netns=doc.get("netns", ""),
                   config=base64.b64decode(doc["config"]),
                   args=tuple((str(k), str(v)) for k, v in doc.get("cniArgs") or ()),
                   capabilities=dict(doc.get("capabilityArgs") or {}),
                   result=dict(doc.get("result") or {}))


class ResultCache:
    def __init__(self, cache_dir: str) -> None:
        self.dir = os.path.join(cache_dir, "results")

    def _path(self, network: str, container_id: str, ifname: str) -> str:
        return os.path.join(self.dir, f"{network}-{container_id}-{ifname}")

    def put(self, entry: CachedAttachment) -> None:
        """Write atomically (the DEL after a daemon crash depends on it), without fsync.

        An fsync here sat on every pod start's path and bought nothing: after a power loss
        the netns and veth are gone, and host-local's own allocation files, which the DEL
        would release, are not fsynced either. libcni writes its cache the same way."""
        os.makedirs(self.dir, mode=0o700, exist_ok=True)
        path = self._path(entry.network, entry.container_id, entry.ifname)
        tmp = f"{path}.tmp"
        with open(tmp, "w") as f:
            json.dump(entry.to_json(), f)
        os.replace(tmp, path)

    def delete(self, entry: CachedAttachment) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self._path(entry.network, entry.container_id, entry.ifname))

    def of(self, container_id: str) -> list[CachedAttachment]:
        """Every cached attachment of ``container_id``, by interface name.

        A file that cannot be read is skipped with a warning; the caller's DEL then
        falls back to the current config and ``purge`` removes it."""
        try:
            names = os.listdir(self.dir)
        except FileNotFoundError:
            return []
        found: list[CachedAttachment] = []
        marker = f"-{container_id}-"
        for name in names:
            if marker not in name or name.endswith(".tmp"):
                continue
            try:
                with open(os.path.join(self.dir, name)) as f:
                    entry = CachedAttachment.from_json(json.load(f))
            except (OSError, ValueError, KeyError, TypeError) as e:
                log.warning("unreadable CNI cache entry %s: %s", name, e)
                continue
            if entry.container_id == container_id:
                found.append(entry)
        return sorted(found, key=lambda e: e.ifname)

    def owners(self) -> set[str]:
        """The container (pod sandbox) ids that have cached attachments."""
        found: set[str] = set()
        with contextlib.suppress(FileNotFoundError):
            for name in os.listdir(self.dir):
                if name.endswith(".tmp"):
                    continue
                with contextlib.suppress(OSError, ValueError, AttributeError):
                    with open(os.path.join(self.dir, name)) as f:
                        owner = json.load(f).get("containerId")
                    if isinstance(owner, str):
                        found.add(owner)
        return found

    def purge(self, container_id: str) -> None:
        """Remove whatever is left for ``container_id`` (after its DELs succeeded): its
        entries, and unreadable files named for it. Another pod's readable entry whose
        network name merely contains the id is kept."""
        marker = f"-{container_id}-"
        with contextlib.suppress(FileNotFoundError):
            for name in os.listdir(self.dir):
                if marker not in name:
                    continue
                path = os.path.join(self.dir, name)
                try:
                    with open(path) as f:
                        owner = json.load(f).get("containerId")
                except (OSError, ValueError, AttributeError):
                    owner = container_id
                if owner == container_id:
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(path)
