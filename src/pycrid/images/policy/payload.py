"""What a signature says, and the signatures an image carries, as plain data.

Both formats sign the same JSON claim: ``{"critical": {"type", "image":
{"docker-manifest-digest"}, "identity": {"docker-reference"}}, "optional": {...}}``;
only ``type`` differs ("atomic container signature" for GPG simple signing, "cosign
container image signature" for sigstore). It is read only after its signature has been
verified, and strictly: an unknown key in ``critical`` is an invalid signature.
"""

from __future__ import annotations

import base64
import json
import re
from dataclasses import dataclass, field
from typing import Any

from pycrid.images.policy import strict_json as sj

SIMPLE_SIGNING_TYPE = "atomic container signature"
SIGSTORE_TYPE = "cosign container image signature"
#: The media type of a sigstore signature layer in a ``sha256-<hex>.sig`` attachment.
SIGSTORE_MIME = "application/vnd.dev.cosign.simplesigning.v1+json"
SIGNATURE_ANNOTATION = "dev.cosignproject.cosign/signature"
BUNDLE_ANNOTATION = "dev.sigstore.cosign/bundle"
CERTIFICATE_ANNOTATION = "dev.sigstore.cosign/certificate"
CHAIN_ANNOTATION = "dev.sigstore.cosign/chain"

_DIGEST = re.compile(r"^[a-z0-9]+(?:[.+_-][a-z0-9]+)*:[a-zA-Z0-9=_-]+$")
_SHA256 = re.compile(r"^sha256:[a-f0-9]{64}$")


class InvalidSignature(ValueError):
    """A signature that cannot be accepted; the message says why."""


@dataclass(frozen=True)
class Claim:
    manifest_digest: str
    docker_reference: str


@dataclass(frozen=True)
class SimpleSigning:
    """An OpenPGP-signed claim (GPG "simple signing"), as stored in a lookaside."""

    blob: bytes


@dataclass(frozen=True)
class Sigstore:
    """A sigstore signature: one layer of a ``.sig`` attachment (or a stored copy)."""

    mime_type: str
    payload: bytes
    annotations: dict[str, str] = field(default_factory=dict)


Signature = SimpleSigning | Sigstore


def parse_claim(payload: bytes, expected_type: str) -> Claim:
    """The claim in ``payload``, which must be of ``expected_type``."""
    try:
        doc = sj.loads(payload)
        sj.obj(doc, "signature", known=("critical", "optional"),
               required=("critical", "optional"))
        _optional(doc["optional"], expected_type)
        critical = sj.obj(doc["critical"], "critical", known=("type", "image", "identity"),
                          required=("type", "image", "identity"))
        kind = sj.string(critical["type"], "critical.type")
        if kind != expected_type:
            raise InvalidSignature(f"unrecognized signature type {kind!r}")
        image = sj.obj(critical["image"], "critical.image", known=("docker-manifest-digest",),
                       required=("docker-manifest-digest",))
        digest = sj.string(image["docker-manifest-digest"],
                           "critical.image.docker-manifest-digest")
        if not _DIGEST.match(digest) or (digest.startswith("sha256:")
                                         and not _SHA256.match(digest)):
            raise InvalidSignature(f"invalid docker-manifest-digest value {digest!r}")
        identity = sj.obj(critical["identity"], "critical.identity",
                          known=("docker-reference",), required=("docker-reference",))
        ref = sj.string(identity["docker-reference"], "critical.identity.docker-reference")
    except sj.StrictJSONError as e:
        raise InvalidSignature(f"invalid signature payload: {e}") from None
    return Claim(digest, ref)


def _optional(value: Any, expected_type: str) -> None:
    """``optional`` may hold anything, but ``creator`` is a string and ``timestamp`` an
    integer; sigstore payloads may have ``null`` there."""
    if value is None and expected_type == SIGSTORE_TYPE:
        return
    if not isinstance(value, dict):
        raise sj.StrictJSONError("optional: a JSON object expected")
    if "creator" in value:
        sj.string(value["creator"], "optional.creator")
    stamp = value.get("timestamp")
    if "timestamp" in value and (isinstance(stamp, bool) or not isinstance(stamp, int | float)
                                 or int(stamp) != stamp):
        raise InvalidSignature("field optional.timestamp is not an integer")


# ---- the blob format containers/image stores signatures in -------------------------------


def to_blob(sig: Signature) -> bytes:
    """containers/image's signature blob: simple signing as is, sigstore as a zero byte,
    ``sigstore-json``, a newline and ``{"mimeType", "payload", "annotations"}``."""
    if isinstance(sig, SimpleSigning):
        return sig.blob
    body = {"mimeType": sig.mime_type, "payload": base64.b64encode(sig.payload).decode(),
            "annotations": sig.annotations}
    return b"\x00sigstore-json\n" + json.dumps(body, sort_keys=True).encode()


#: First bytes of an OpenPGP message (compressed data, one-pass signature or signature
#: packet, old or new format): what containers/image takes for simple signing.
_OPENPGP_FIRST = frozenset({0xA0, 0xA1, 0xA2, 0xA3, 0xC8, 0x90, 0x91, 0x92, 0x3D, 0xC4,
                            0x88, 0x89, 0x8A, 0x8B, 0xC2})


def from_blob(blob: bytes) -> Signature:
    """The signature in a stored blob (a lookaside file, a record of ours)."""
    if not blob:
        raise InvalidSignature("empty signature blob")
    if blob[0] in _OPENPGP_FIRST:
        return SimpleSigning(blob)
    if blob[0] != 0:
        raise InvalidSignature(f"unrecognized signature format, starting with byte "
                               f"{blob[0]:#x}")
    fmt, newline, chunk = blob[1:].partition(b"\n")
    if not newline or any(b < 32 or b >= 0x7F for b in fmt):
        raise InvalidSignature("invalid signature format header")
    if fmt == b"simple-signing":
        return SimpleSigning(chunk)
    if fmt != b"sigstore-json":
        raise InvalidSignature(f"unrecognized signature format {fmt.decode()!r}")
    try:
        doc = json.loads(chunk)
        annotations = doc.get("annotations") or {}
        if not isinstance(annotations, dict) or not all(
                isinstance(k, str) and isinstance(v, str) for k, v in annotations.items()):
            raise ValueError("annotations")
        return Sigstore(str(doc.get("mimeType") or ""),
                        base64.b64decode(doc.get("payload") or ""), annotations)
    except (ValueError, TypeError, AttributeError) as e:
        raise InvalidSignature(f"invalid sigstore signature blob: {e}") from None
