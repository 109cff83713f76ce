"""Image references: parse what the kubelet sends and normalise it the way Docker does.

``busybox`` means ``docker.io/library/busybox:latest``; every name the image store
keeps and every name the CRI reports back is the normalised form, so two spellings
of one image meet in one record.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from pycrid.errors import InvalidArgument

DEFAULT_DOMAIN = "docker.io"
#: Older spellings of Docker Hub that mean the same registry.
_LEGACY_DOMAINS = frozenset({"index.docker.io", "registry-1.docker.io"})
OFFICIAL_NAMESPACE = "library"
DEFAULT_TAG = "latest"
NAME_MAX = 255
TAG_MAX = 128

# Grammar of the distribution reference format, written out piece by piece.
_ALNUM = r"[a-z0-9]+"
_SEPARATOR = r"(?:[._]|__|[-]+)"
_PATH_COMPONENT = rf"{_ALNUM}(?:{_SEPARATOR}{_ALNUM})*"
_DOMAIN_LABEL = r"(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])"
_DOMAIN_NAME = rf"{_DOMAIN_LABEL}(?:\.{_DOMAIN_LABEL})*"
_IPV6 = r"\[[a-fA-F0-9:]+\]"
_DOMAIN = rf"(?:{_DOMAIN_NAME}|{_IPV6})(?::[0-9]+)?"

_PATH_RE = re.compile(rf"^{_PATH_COMPONENT}(?:/{_PATH_COMPONENT})*$")
_DOMAIN_RE = re.compile(rf"^{_DOMAIN}$")
_TAG_RE = re.compile(r"^[\w][\w.-]*$", re.ASCII)
_ANY_DIGEST_RE = re.compile(
    r"^[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,}$")
_SHA256_RE = re.compile(r"^sha256:[a-f0-9]{64}$")
_HEX64_RE = re.compile(r"^[a-f0-9]{64}$")


@dataclass(frozen=True)
class Reference:
    """A normalised reference; at least one of ``tag`` and ``digest`` is set."""

    domain: str
    path: str
    tag: str | None = None
    digest: str | None = None

    @property
    def name(self) -> str:
        return f"{self.domain}/{self.path}"

    @property
    def object(self) -> str:
        """What the registry is asked for: the digest when there is one (it pins), else the tag."""
        return self.digest or self.tag or DEFAULT_TAG

    def __str__(self) -> str:
        s = self.name
        if self.tag is not None:
            s += f":{self.tag}"
        if self.digest is not None:
            s += f"@{self.digest}"
        return s


def _q(s: str) -> str:
    """Quote user input for a message, shortened so a huge input does not flood the log."""
    return repr(s) if len(s) <= 160 else repr(s[:150]) + f"... ({len(s)} characters)"


def _split_domain(name: str) -> tuple[str, str]:
    """Docker's rule: the first component is a registry host only if it looks like one."""
    first, sep, rest = name.partition("/")
    if sep and ("." in first or ":" in first or first == "localhost" or first != first.lower()):
        domain, path = first, rest
    else:
        domain, path = DEFAULT_DOMAIN, name
    if domain in _LEGACY_DOMAINS:
        domain = DEFAULT_DOMAIN
    if domain == DEFAULT_DOMAIN and "/" not in path:
        path = f"{OFFICIAL_NAMESPACE}/{path}"
    return domain, path


def parse_reference(s: str) -> Reference:
    """Parse and normalise ``s``; InvalidArgument says what is wrong with a bad one."""
    if not isinstance(s, str) or not s:
        raise InvalidArgument("image reference is empty")
    if s != s.strip() or any(c.isspace() for c in s):
        raise InvalidArgument(f"invalid image reference {_q(s)}: contains whitespace")

    rest, at, digest = s.partition("@")
    if at:
        if not digest:
            raise InvalidArgument(f"invalid image reference {_q(s)}: empty digest after '@'")
        if not _ANY_DIGEST_RE.match(digest):
            raise InvalidArgument(f"invalid image reference {_q(s)}: malformed digest {_q(digest)}")
        if not _SHA256_RE.match(digest):
            raise InvalidArgument(
                f"invalid image reference {_q(s)}: unsupported digest {_q(digest)} "
                "(only sha256:<64 lowercase hex> is supported)")

    # A tag follows the last ':' that comes after the last '/' (a ':' before it is a port).
    tag: str | None = None
    colon = rest.rfind(":")
    if colon > rest.rfind("/"):
        rest, tag = rest[:colon], rest[colon + 1:]
        if not tag:
            raise InvalidArgument(f"invalid image reference {_q(s)}: empty tag after ':'")
        if len(tag) > TAG_MAX:
            raise InvalidArgument(
                f"invalid image reference {_q(s)}: tag is {len(tag)} characters, "
                f"at most {TAG_MAX} allowed")
        if not _TAG_RE.match(tag):
            raise InvalidArgument(
                f"invalid image reference {_q(s)}: tag {tag!r} may only contain letters, "
                "digits, '_', '.' and '-', and must not start with '.' or '-'")

    if not rest:
        raise InvalidArgument(f"invalid image reference {_q(s)}: repository name is empty")
    if _HEX64_RE.match(rest) and tag is None and not at:
        raise InvalidArgument(
            f"invalid image reference {_q(s)}: a 64-character hex string is an image id, "
            "not a repository name")

    domain, path = _split_domain(rest)
    if domain != DEFAULT_DOMAIN and not _DOMAIN_RE.match(domain):
        raise InvalidArgument(
            f"invalid image reference {_q(s)}: malformed registry host {domain!r}")
    if not _PATH_RE.match(path):
        if path != path.lower() and _PATH_RE.match(path.lower()):
            raise InvalidArgument(
                f"invalid image reference {_q(s)}: repository name must be lowercase")
        raise InvalidArgument(
            f"invalid image reference {_q(s)}: malformed repository name {_q(rest)} "
            "(components are lowercase letters and digits joined by '.', '_', '__' or '-', "
            "separated by '/')")
    name_len = len(domain) + 1 + len(path)
    if name_len > NAME_MAX:
        raise InvalidArgument(
            f"invalid image reference {_q(s)}: repository name is {name_len} characters, "
            f"at most {NAME_MAX} allowed")
    if tag is None and digest == "":
        tag = DEFAULT_TAG
    return Reference(domain=domain, path=path, tag=tag, digest=digest or None)
