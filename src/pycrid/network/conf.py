"""CNI network configuration files: find, parse and check them (no plugin runs here).

The rules are the CNI spec's and libcni's, as containerd's go-cni applies them:
``.conflist`` files hold a list of plugins, ``.conf`` and ``.json`` files a single
plugin (turned into a one-plugin list); files are taken in name order, and at most
``max_conf_num`` of them become networks. One invalid file makes the whole
directory invalid (go-cni does the same), so a typo never silently shifts the
pod's network to the next file.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from typing import Any

#: The newest CNI spec version pycrid speaks (it picks from a conflist's ``cniVersions``).
SPEC_VERSION = "1.1.0"
EXTENSIONS = (".conf", ".conflist", ".json")
_VERSION = re.compile(r"^(\d+)\.(\d+)\.(\d+)$")
_NAME = re.compile(r"^[a-zA-Z0-9][a-zA-Z0-9_.\-]*$")


class ConfError(ValueError):
    """A configuration file is not a valid CNI network configuration."""


def version_tuple(v: str) -> tuple[int, int, int]:
    m = _VERSION.match(v)
    if m is None:
        raise ConfError(f"invalid cniVersion {v!r} (want major.minor.patch)")
    return int(m[1]), int(m[2]), int(m[3])


def at_least(v: str, minimum: str) -> bool:
    return version_tuple(v) >= version_tuple(minimum)


@dataclass(frozen=True)
class NetworkConfList:
    """One network: its name, spec version and plugin chain, as read from ``source``."""

    name: str
    cni_version: str
    plugins: tuple[dict[str, Any], ...]
    source: str = ""
    #: The network as a conflist (a single-plugin file is wrapped in one, as libcni does);
    #: cached with each attachment so that DEL uses what ADD used.
    raw: bytes = b""
    disable_check: bool = False
    #: Capabilities any plugin of the chain declares (for status output).
    capabilities: frozenset[str] = field(default=frozenset())

    @property
    def types(self) -> list[str]:
        return [str(p["type"]) for p in self.plugins]


def _bool(raw: dict[str, Any], key: str) -> bool:
    v = raw.get(key, False)
    if isinstance(v, bool):
        return v
    if isinstance(v, str) and v.lower() in ("true", "false"):
        return v.lower() == "true"
    raise ConfError(f"{key} must be a boolean, not {v!r}")


def _pick_version(raw: dict[str, Any]) -> str:
    version = raw.get("cniVersion", "")
    if not isinstance(version, str):
        raise ConfError(f"cniVersion must be a string, not {version!r}")
    candidates = [version] if version else []
    listed = raw.get("cniVersions")
    if listed is not None:
        if not isinstance(listed, list) or not all(isinstance(v, str) for v in listed):
            raise ConfError("cniVersions must be a list of version strings")
        candidates += listed
    usable = [v for v in candidates if version_tuple(v) <= version_tuple(SPEC_VERSION)]
    if not usable:
        if candidates:
            raise ConfError(f"no cniVersion this runtime supports among {candidates} "
                            f"(newest supported: {SPEC_VERSION})")
        return "0.1.0"  # the spec's default for a missing cniVersion
    return max(usable, key=version_tuple)


def _plugin(conf: Any, where: str) -> dict[str, Any]:
    if not isinstance(conf, dict):
        raise ConfError(f"{where} must be a JSON object")
    kind = conf.get("type")
    if not isinstance(kind, str) or not kind:
        raise ConfError(f"{where} has no \"type\"")
    if "/" in kind or kind in (".", ".."):
        raise ConfError(f"{where} has an invalid type {kind!r} (a plugin name, not a path)")
    caps = conf.get("capabilities", {})
    if not isinstance(caps, dict) or not all(isinstance(v, bool) for v in caps.values()):
        raise ConfError(f"{where}: capabilities must map names to booleans")
    return conf


def parse(raw: bytes, source: str = "") -> NetworkConfList:
    """A network from a file's bytes; ``source``'s suffix says list or single plugin."""
    try:
        doc = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as e:
        raise ConfError(f"not valid JSON: {e}") from None
    if not isinstance(doc, dict):
        raise ConfError("must be a JSON object")
    name = doc.get("name")
    if not isinstance(name, str) or not name:
        raise ConfError("has no network \"name\"")
    if not _NAME.match(name):
        raise ConfError(f"invalid network name {name!r} (letters, digits, '_', '.', '-')")
    version = _pick_version(doc)
    if source.endswith(".conflist"):
        plugins = doc.get("plugins")
        if not isinstance(plugins, list) or not plugins:
            raise ConfError("a .conflist needs a non-empty \"plugins\" list")
        chain = tuple(_plugin(p, f"plugin {i}") for i, p in enumerate(plugins))
    else:
        chain = (_plugin(doc, "the network"),)
        wrapped = {"cniVersion": version, "name": name, "plugins": [doc]}
        wrapped.update({k: doc[k] for k in ("disableCheck", "disableGC") if k in doc})
        raw = json.dumps(wrapped).encode()
    _bool(doc, "disableGC")  # checked like libcni; pycrid runs no CNI GC to disable
    caps = frozenset(k for p in chain for k, on in p.get("capabilities", {}).items() if on)
    return NetworkConfList(name=name, cni_version=version, plugins=chain, source=source,
                           raw=raw, disable_check=_bool(doc, "disableCheck"),
                           capabilities=caps)


def conf_files(conf_dir: str) -> list[str]:
    """Configuration files in ``conf_dir``, in the order they are used (by name)."""
    try:
        entries = sorted(os.scandir(conf_dir), key=lambda e: e.name)
    except FileNotFoundError:
        return []
    return [e.path for e in entries
            if e.name.endswith(EXTENSIONS) and not e.name.startswith(".") and e.is_file()]


def load_dir(conf_dir: str, max_conf_num: int) -> list[NetworkConfList]:
    """The first ``max_conf_num`` networks of ``conf_dir`` (0: all of them).

    Raises ConfError naming the file when one is invalid, or saying the directory has
    none."""
    files = conf_files(conf_dir)
    if not files:
        raise ConfError(f"no network config found in {conf_dir}")
    networks: list[NetworkConfList] = []
    for path in files:
        try:
            with open(path, "rb") as f:
                raw = f.read()
            networks.append(parse(raw, path))
        except OSError as e:
            raise ConfError(f"cannot read {path}: {e.strerror}") from None
        except ConfError as e:
            raise ConfError(f"invalid CNI config {path}: {e}") from None
        if len(networks) == max_conf_num:
            break
    return networks
