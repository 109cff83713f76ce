"""Docker references as the policy sees them: scopes to search, and signed identities.

Unlike ``images.reference.parse_reference`` (what a pull asks for, so a bare name means
``:latest``), a name read from a signature or a policy keeps "no tag": containers/image's
``ParseNormalizedNamed``, whose name-only results never match an exact identity.
"""

from __future__ import annotations

from dataclasses import dataclass

from pycrid.errors import InvalidArgument
from pycrid.images.reference import Reference, parse_reference


@dataclass(frozen=True)
class Named:
    """A normalised reference: ``name`` is ``domain/path``; either suffix may be absent."""

    name: str
    tag: str | None = None
    digest: str | None = None

    @property
    def name_only(self) -> bool:
        return self.tag is None and self.digest is None

    @property
    def domain(self) -> str:
        return self.name.split("/", 1)[0]

    @property
    def path(self) -> str:
        return self.name.split("/", 1)[1]

    def __str__(self) -> str:
        return (self.name + (f":{self.tag}" if self.tag is not None else "")
                + (f"@{self.digest}" if self.digest is not None else ""))

    @classmethod
    def of(cls, ref: Reference) -> Named:
        return cls(ref.name, ref.tag, ref.digest)


def parse_named(text: str) -> Named:
    """``text`` normalised (``busybox`` -> ``docker.io/library/busybox``), keeping no tag
    when it has none; InvalidArgument when it is not a reference."""
    ref = parse_reference(text)
    rest = text.partition("@")[0]
    has_tag = rest.rfind(":") > rest.rfind("/")
    return Named(ref.name, ref.tag if has_tag else None, ref.digest)


def parse_canonical(text: str) -> Named:
    """Like ``parse_named``, but ``text`` must already be in normalised form (Go's
    ``reference.ParseNamed``: ``docker.io/library/busybox``, not ``busybox``)."""
    named = parse_named(text)
    if str(named) != text:
        raise InvalidArgument(f"{text!r} is not a normalised reference (it means {named})")
    return named


def policy_identity(ref: Named) -> str:
    """The most specific scope of an image: ``name:tag`` or ``name@digest``."""
    if ref.digest is not None:
        return f"{ref.name}@{ref.digest}"
    return f"{ref.name}:{ref.tag}"


def policy_namespaces(name: str) -> list[str]:
    """Less specific scopes, most specific first: the repository, each parent namespace,
    the host, then ``*.domain`` wildcards of the host without its port."""
    out = []
    while True:
        out.append(name)
        cut = name.rfind("/")
        if cut < 0:
            break
        name = name[:cut]
    host = name.split(":", 1)[0] if not name.startswith("[") else name
    while "." in host:
        host = host.split(".", 1)[1]
        out.append("*." + host)
    return out


def scope_candidates(ref: Named) -> list[str]:
    """Every scope that can apply to ``ref``, most specific first (``""`` last)."""
    return [policy_identity(ref), *policy_namespaces(ref.name), ""]


# ---- signedIdentity ---------------------------------------------------------------------


def _parse_or_none(text: str) -> Named | None:
    try:
        return parse_named(text)
    except InvalidArgument:
        return None


def repo_digest_or_exact(intended: Named, signed: Named) -> bool:
    """A tag must be signed exactly; a digest reference accepts any tag of its repository."""
    if signed.name_only:
        return False
    if intended.tag is not None:
        return str(signed) == str(intended)
    if intended.digest is not None:
        return signed.name == intended.name
    return False


def matches(identity: Identity, intended: Named, signed_text: str) -> bool:
    """Whether a signature claiming ``signed_text`` is acceptable for ``intended``."""
    signed = _parse_or_none(signed_text)
    if signed is None:
        return False
    kind = identity.type
    if kind == "matchExact":
        return not intended.name_only and not signed.name_only and str(signed) == str(intended)
    if kind == "matchRepoDigestOrExact":
        return repo_digest_or_exact(intended, signed)
    if kind == "matchRepository":
        return signed.name == intended.name
    if kind == "exactReference":
        want = _parse_or_none(identity.value)
        return (want is not None and not want.name_only and not signed.name_only
                and str(signed) == str(want))
    if kind == "exactRepository":
        want = _parse_or_none(identity.value)
        return want is not None and signed.name == want.name
    if kind == "remapIdentity":
        remapped = remap(intended, identity.value, identity.signed_prefix)
        return remapped is not None and repo_digest_or_exact(remapped, signed)
    return False


def remap(ref: Named, prefix: str, signed_prefix: str) -> Named | None:
    """``ref`` with ``prefix`` replaced by ``signed_prefix`` when its name starts with it
    (whole components only); None when the result is not a normalised reference."""
    name = ref.name
    if not (name == prefix or (name.startswith(prefix) and name[len(prefix)] == "/")):
        return ref
    text = str(ref).replace(prefix, signed_prefix, 1)
    try:
        return parse_canonical(text)
    except InvalidArgument:
        return None


@dataclass(frozen=True)
class Identity:
    """A ``signedIdentity``: ``value`` is the ``dockerReference``, ``dockerRepository`` or
    remapping ``prefix`` of the types that have one."""

    type: str = "matchRepoDigestOrExact"
    value: str = ""
    signed_prefix: str = ""
