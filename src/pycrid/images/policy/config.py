"""containers-policy.json(5), parsed as strictly as containers/image parses it.

Every object takes only its own keys, every requirement exactly one key source; an
unknown requirement type, identity type or key is an error naming the file and where
in it. Key files are not read here but when a requirement is evaluated (as
containers/image does), so a missing key refuses the images of its scope only.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from pycrid.errors import InvalidArgument
from pycrid.images.policy import strict_json as sj
from pycrid.images.policy.names import Identity, Named, parse_named, scope_candidates
from pycrid.images.reference import _DOMAIN_RE, _PATH_RE

INSECURE = "insecureAcceptAnything"
REJECT = "reject"
SIGNED_BY = "signedBy"
SIGSTORE = "sigstoreSigned"
BASE_LAYER = "signedBaseLayer"
GPG_KEYS = "GPGKeys"
#: keyType values containers/image parses but refuses to evaluate.
_UNIMPLEMENTED_KEY_TYPES = ("signedByGPGKeys", "X509Certificates", "signedByX509CAs")


class PolicyFormatError(InvalidArgument):
    """A policy file that breaks containers-policy.json(5)."""


@dataclass(frozen=True)
class Material:
    """Where trusted keys or certificates come from: files (read at evaluation) or
    inline data (``…Data``/``…Datas``, base64 in the file)."""

    paths: tuple[str, ...] = ()
    datas: tuple[bytes, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.paths or self.datas)


@dataclass(frozen=True)
class Fulcio:
    ca: Material
    oidc_issuer: str
    subject_email: str


@dataclass(frozen=True)
class PKI:
    ca_roots: Material
    ca_intermediates: Material
    subject_email: str
    subject_hostname: str


@dataclass(frozen=True)
class Requirement:
    type: str
    identity: Identity = Identity()
    key_type: str = ""
    keys: Material = Material()
    fulcio: Fulcio | None = None
    rekor_keys: Material = Material()
    pki: PKI | None = None
    #: Where it was written, for messages: ``transports.docker["x"][0]``.
    where: str = ""


@dataclass(frozen=True)
class Policy:
    path: str
    default: tuple[Requirement, ...]
    #: ``transports.docker``: scope -> requirements.
    docker: Mapping[str, tuple[Requirement, ...]] = field(default_factory=dict)
    #: Other transports, parsed and kept but never asked (pycrid pulls over docker only).
    other_transports: tuple[str, ...] = ()

    def requirements_for(self, ref: Named) -> tuple[str | None, tuple[Requirement, ...]]:
        """The scope that applies to ``ref`` (None: ``default``) and its requirements."""
        for scope in scope_candidates(ref):
            if scope in self.docker:
                return scope, self.docker[scope]
        return None, self.default


def parse_policy(data: bytes, path: str) -> Policy:
    """The policy in ``data`` (the contents of ``path``); PolicyFormatError says what and
    where when it is not a valid policy."""
    try:
        return _policy(sj.loads(data), path)
    except sj.StrictJSONError as e:
        raise PolicyFormatError(f"invalid policy in {path}: {e}") from None


def _policy(doc: Any, path: str) -> Policy:
    sj.obj(doc, "the top level", known=("default", "transports"), required=("default",))
    default = _requirements(doc["default"], "default")
    docker: dict[str, tuple[Requirement, ...]] = {}
    others: list[str] = []
    transports = doc.get("transports") or {}
    if not isinstance(transports, dict):
        raise sj.StrictJSONError("transports: a JSON object expected")
    for name, scopes in transports.items():
        where = f"transports.{name}"
        if not isinstance(scopes, dict):
            raise sj.StrictJSONError(f"{where}: a JSON object expected")
        parsed = {scope: _requirements(reqs, f'{where}["{scope}"]')
                  for scope, reqs in scopes.items()}
        if name == "docker":
            docker = parsed
        else:
            others.append(name)
    return Policy(path=path, default=default, docker=docker, other_transports=tuple(others))


def _requirements(value: Any, where: str) -> tuple[Requirement, ...]:
    if not isinstance(value, list):
        raise sj.StrictJSONError(f"{where}: a list of requirements expected")
    if not value:
        raise sj.StrictJSONError(f"{where}: the list of requirements must not be empty")
    return tuple(_requirement(v, f"{where}[{i}]") for i, v in enumerate(value))


def _requirement(value: Any, where: str) -> Requirement:
    kind = sj.string(sj.obj(value, where, known=value if isinstance(value, dict) else (),
                            required=("type",))["type"], f"{where}.type")
    if kind in (INSECURE, REJECT):
        sj.obj(value, where, known=("type",))
        return Requirement(kind, where=where)
    if kind == SIGNED_BY:
        return _signed_by(value, where)
    if kind == SIGSTORE:
        return _sigstore(value, where)
    if kind == BASE_LAYER:
        sj.obj(value, where, known=("type", "baseLayerIdentity"),
               required=("baseLayerIdentity",))
        return Requirement(kind, _identity(value["baseLayerIdentity"],
                                           f"{where}.baseLayerIdentity"), where=where)
    raise sj.StrictJSONError(f"{where}: unknown policy requirement type {kind!r}")


def _material(value: dict[str, Any], where: str, one: str, many: str, data: str,
              datas: str | None = None) -> Material:
    """The one source of ``one``/``many`` (paths) and ``data``/``datas`` (inline) used."""
    found = [k for k in (one, many, data, datas) if k is not None and k in value]
    if len(found) > 1:
        raise sj.StrictJSONError(f"{where}: only one of {', '.join(found)} may be used")
    if not found:
        return Material()
    key = found[0]
    here = f"{where}.{key}"
    if key == one:
        return Material(paths=(sj.string(value[key], here),)) if value[key] else Material()
    if key == many:
        paths = sj.strings(value[key], here)
        if not paths:
            raise sj.StrictJSONError(f"{here}: contains no entries")
        return Material(paths=paths)
    if key == data:
        return Material(datas=(sj.base64_bytes(value[key], here),))
    entries = sj.base64_list(value[key], here)
    if not entries:
        raise sj.StrictJSONError(f"{here}: contains no entries")
    return Material(datas=entries)


def _signed_by(value: dict[str, Any], where: str) -> Requirement:
    sj.obj(value, where, known=("type", "keyType", "keyPath", "keyPaths", "keyData",
                                "signedIdentity"), required=("keyType",))
    key_type = sj.string(value["keyType"], f"{where}.keyType")
    if key_type != GPG_KEYS and key_type not in _UNIMPLEMENTED_KEY_TYPES:
        raise sj.StrictJSONError(f"{where}.keyType: unrecognized keyType value {key_type!r}")
    keys = _material(value, where, "keyPath", "keyPaths", "keyData")
    if not keys and "keyData" not in value:
        raise sj.StrictJSONError(f"{where}: exactly one of keyPath, keyPaths and keyData "
                                 "must be specified")
    return Requirement(SIGNED_BY, _identity_of(value, where), key_type=key_type, keys=keys,
                       where=where)


def _sigstore(value: dict[str, Any], where: str) -> Requirement:
    sj.obj(value, where, known=("type", "keyPath", "keyPaths", "keyData", "keyDatas", "fulcio",
                                "rekorPublicKeyPath", "rekorPublicKeyPaths",
                                "rekorPublicKeyData", "rekorPublicKeyDatas", "pki",
                                "signedIdentity"))
    keys = _material(value, where, "keyPath", "keyPaths", "keyData", "keyDatas")
    sources = [k for k in ("keyPath", "keyPaths", "keyData", "keyDatas", "fulcio", "pki")
               if k in value and not (k == "keyPath" and value[k] == "")]
    if len(sources) != 1:
        raise sj.StrictJSONError(f"{where}: exactly one of keyPath, keyPaths, keyData, "
                                 "keyDatas, fulcio and pki must be specified")
    rekor = _material(value, where, "rekorPublicKeyPath", "rekorPublicKeyPaths",
                      "rekorPublicKeyData", "rekorPublicKeyDatas")
    fulcio = _fulcio(value["fulcio"], f"{where}.fulcio") if "fulcio" in value else None
    pki = _pki(value["pki"], f"{where}.pki") if "pki" in value else None
    if fulcio is not None and not rekor:
        raise sj.StrictJSONError(f"{where}: fulcio needs one of rekorPublicKeyPath, "
                                 "rekorPublicKeyPaths, rekorPublicKeyData, rekorPublicKeyDatas")
    if pki is not None and rekor:
        raise sj.StrictJSONError(f"{where}: a Rekor public key is not supported with pki")
    return Requirement(SIGSTORE, _identity_of(value, where), keys=keys, fulcio=fulcio,
                       rekor_keys=rekor, pki=pki, where=where)


def _fulcio(value: Any, where: str) -> Fulcio:
    sj.obj(value, where, known=("caPath", "caData", "oidcIssuer", "subjectEmail"))
    ca = _material(value, where, "caPath", "", "caData")
    if not ca:
        raise sj.StrictJSONError(f"{where}: one of caPath and caData must be specified")
    issuer = sj.string(value.get("oidcIssuer", ""), f"{where}.oidcIssuer")
    email = sj.string(value.get("subjectEmail", ""), f"{where}.subjectEmail")
    if not issuer:
        raise sj.StrictJSONError(f"{where}: oidcIssuer not specified")
    if not email:
        raise sj.StrictJSONError(f"{where}: subjectEmail not specified")
    return Fulcio(ca, issuer, email)


def _pki(value: Any, where: str) -> PKI:
    sj.obj(value, where, known=("caRootsPath", "caRootsData", "caIntermediatesPath",
                                "caIntermediatesData", "subjectEmail", "subjectHostname"))
    roots = _material(value, where, "caRootsPath", "", "caRootsData")
    if not roots:
        raise sj.StrictJSONError(f"{where}: one of caRootsPath and caRootsData must be "
                                 "specified")
    inter = _material(value, where, "caIntermediatesPath", "", "caIntermediatesData")
    email = sj.string(value.get("subjectEmail", ""), f"{where}.subjectEmail")
    host = sj.string(value.get("subjectHostname", ""), f"{where}.subjectHostname")
    if not email and not host:
        raise sj.StrictJSONError(f"{where}: one of subjectEmail and subjectHostname must be "
                                 "specified")
    return PKI(roots, inter, email, host)


def _identity_of(value: dict[str, Any], where: str) -> Identity:
    if "signedIdentity" not in value:
        return Identity()
    return _identity(value["signedIdentity"], f"{where}.signedIdentity")


def _identity(value: Any, where: str) -> Identity:
    kind = sj.string(sj.obj(value, where, known=value if isinstance(value, dict) else (),
                            required=("type",))["type"], f"{where}.type")
    if kind in ("matchExact", "matchRepoDigestOrExact", "matchRepository"):
        sj.obj(value, where, known=("type",))
        return Identity(kind)
    if kind == "exactReference":
        sj.obj(value, where, known=("type", "dockerReference"), required=("dockerReference",))
        ref = sj.string(value["dockerReference"], f"{where}.dockerReference")
        named = _named(ref, f"{where}.dockerReference")
        if named.name_only:
            raise sj.StrictJSONError(f"{where}.dockerReference: {ref!r} contains neither a tag "
                                     "nor a digest")
        return Identity(kind, ref)
    if kind == "exactRepository":
        sj.obj(value, where, known=("type", "dockerRepository"), required=("dockerRepository",))
        repo = sj.string(value["dockerRepository"], f"{where}.dockerRepository")
        _named(repo, f"{where}.dockerRepository")
        return Identity(kind, repo)
    if kind == "remapIdentity":
        sj.obj(value, where, known=("type", "prefix", "signedPrefix"),
               required=("prefix", "signedPrefix"))
        prefix = _prefix(value["prefix"], f"{where}.prefix")
        signed = _prefix(value["signedPrefix"], f"{where}.signedPrefix")
        return Identity(kind, prefix, signed)
    raise sj.StrictJSONError(f"{where}: unknown policy reference match type {kind!r}")


def _named(text: str, where: str) -> Named:
    try:
        return parse_named(text)
    except InvalidArgument as e:
        raise sj.StrictJSONError(f"{where}: {e}") from None


def _prefix(value: Any, where: str) -> str:
    """A remapping prefix: a host[:port], or host[:port]/namespace..."""
    text = sj.string(value, where)
    host, slash, path = text.partition("/")
    if _DOMAIN_RE.match(host) and (not slash or _PATH_RE.match(path)):
        return text
    raise sj.StrictJSONError(f"{where}: prefix {text!r} is not valid")
