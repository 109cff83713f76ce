"""containers-registries.d(5): where an image's signatures live.

Every ``*.yaml`` file of the directory is read and merged; ``default-docker`` or one
``docker`` namespace defined in two files is an error naming both. For an image the
most specific ``docker`` namespace (the same scopes as the policy: ``name:tag``, the
repository, its parents, the host, ``*.domain``) that sets a key wins, then
``default-docker``. ``lookaside`` (or the older ``sigstore``) is the base URL of a
simple-signing store, ``file://`` or ``http(s)://``, read at
``<base>/<repository>@sha256=<hex>/signature-N`` from 1 until the first missing one;
without one, containers/image's built-in ``file:///var/lib/containers/sigstore``.
``use-sigstore-attachments`` asks the registry for the ``sha256-<hex>.sig`` artifact.
Write-only keys (``lookaside-staging``, ``sigstore-staging``) are accepted and unused;
unknown keys are logged and ignored, as containers/image ignores them.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import yaml

from pycrid.errors import InvalidArgument
from pycrid.images.policy.names import Named, policy_identity, policy_namespaces

log = logging.getLogger(__name__)

DEFAULT_LOOKASIDE = "file:///var/lib/containers/sigstore"
_NS_KEYS = frozenset({"lookaside", "lookaside-staging", "sigstore", "sigstore-staging",
                      "use-sigstore-attachments"})


class RegistriesDError(InvalidArgument):
    """A registries.d file that cannot be used."""


@dataclass(frozen=True)
class Namespace:
    lookaside: str = ""
    use_sigstore_attachments: bool | None = None
    source: str = ""


@dataclass(frozen=True)
class RegistriesD:
    default: Namespace | None = None
    docker: Mapping[str, Namespace] = field(default_factory=dict)

    def _chain(self, ref: Named) -> list[Namespace]:
        found = [self.docker[s] for s in [policy_identity(ref), *policy_namespaces(ref.name)]
                 if s in self.docker]
        return found + ([self.default] if self.default is not None else [])

    def lookaside(self, ref: Named) -> str:
        """The base URL of ``ref``'s repository in its signature store."""
        base = next((ns.lookaside for ns in self._chain(ref) if ns.lookaside),
                    DEFAULT_LOOKASIDE)
        return base.rstrip("/") + "/" + ref.path

    def use_sigstore_attachments(self, ref: Named) -> bool:
        return next((ns.use_sigstore_attachments for ns in self._chain(ref)
                     if ns.use_sigstore_attachments is not None), False)


def signature_url(base: str, digest: str, index: int) -> str:
    """The URL of signature ``index`` (from 1) of the manifest ``digest``."""
    algo, _, hexpart = digest.partition(":")
    return f"{base}@{algo}={hexpart}/signature-{index}"


def _namespace(value: Any, where: str, path: str) -> Namespace:
    if value is None:
        return Namespace(source=path)
    if not isinstance(value, dict):
        raise RegistriesDError(f"parsing {path}: {where} must be a mapping")
    for key in value:
        if key not in _NS_KEYS:
            log.warning("%s: unknown key %r in %s is ignored", path, key, where)
    lookaside = value.get("lookaside") or value.get("sigstore") or ""
    use = value.get("use-sigstore-attachments")
    if not isinstance(lookaside, str) or (use is not None and not isinstance(use, bool)):
        raise RegistriesDError(f"parsing {path}: {where}: lookaside must be a string and "
                               "use-sigstore-attachments a boolean")
    if lookaside and urlsplit(lookaside).scheme not in ("file", "http", "https"):
        raise RegistriesDError(f"{path}: {where}: unsupported lookaside scheme in "
                               f"{lookaside!r} (file, http and https are)")
    return Namespace(lookaside, use, path)


def parse_files(files: Mapping[str, bytes]) -> RegistriesD:
    """Merge the contents of registries.d files (path -> bytes), in name order."""
    default: Namespace | None = None
    docker: dict[str, Namespace] = {}
    for path in sorted(files):
        try:
            doc = yaml.safe_load(files[path]) or {}
        except yaml.YAMLError as e:
            raise RegistriesDError(f"parsing {path}: {e}") from None
        if not isinstance(doc, dict):
            raise RegistriesDError(f"parsing {path}: the top level must be a mapping")
        for key in doc:
            if key not in ("default-docker", "docker"):
                log.warning("%s: unknown key %r is ignored", path, key)
        if doc.get("default-docker") is not None:
            if default is not None:
                raise RegistriesDError(f'"default-docker" is defined both in {default.source} '
                                       f"and {path}")
            default = _namespace(doc["default-docker"], "default-docker", path)
        namespaces = doc.get("docker") or {}
        if not isinstance(namespaces, dict):
            raise RegistriesDError(f"parsing {path}: docker must be a mapping")
        for name, value in namespaces.items():
            if name in docker:
                raise RegistriesDError(f'"docker" namespace {name!r} is defined both in '
                                       f"{docker[name].source} and {path}")
            docker[str(name)] = _namespace(value, f'docker["{name}"]', path)
    return RegistriesD(default, docker)


def yaml_files(path: str) -> list[str]:
    """The ``*.yaml`` files of directory ``path``, sorted (none when it does not exist; a
    path that cannot be listed is an error, as in containers/image: signatures would
    otherwise be looked for in the wrong place without a word)."""
    try:
        names = os.listdir(path)
    except FileNotFoundError:
        return []
    except OSError as e:
        raise RegistriesDError(f"cannot list {path}: {e.strerror}") from None
    return sorted(os.path.join(path, n) for n in names if n.endswith(".yaml"))


def read_files(paths: list[str]) -> dict[str, bytes]:
    """The contents of ``paths`` (one removed meanwhile, or a directory, is left out, as
    containers/image leaves out directories)."""
    out = {}
    for path in paths:
        try:
            with open(path, "rb") as f:
                out[path] = f.read()
        except (FileNotFoundError, IsADirectoryError):
            continue
        except OSError as e:
            raise RegistriesDError(f"cannot read {path}: {e.strerror}") from None
    return out
