"""Rekor signed entry timestamps (the ``dev.sigstore.cosign/bundle`` annotation), offline.

A SET is Rekor's ECDSA signature over the RFC 8785 canonical JSON of ``{body,
integratedTime, logIndex, logID}``; ``body`` is a ``hashedrekord`` v0.0.1 entry naming
the payload's SHA-256, the signature and the signer's key or certificate. Verifying it
proves the log accepted exactly this signature at ``integratedTime`` (when a Fulcio
certificate must have been valid), without asking Rekor: the checks containers/image's
``VerifyRekorSET`` makes.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
from collections.abc import Sequence
from typing import Any

from cryptography.hazmat.primitives.asymmetric import ec

from pycrid.images.policy import crypto_keys as ck
from pycrid.images.policy import strict_json as sj
from pycrid.images.policy.payload import InvalidSignature


def load_rekor_keys(datas: Sequence[bytes]) -> list[ec.EllipticCurvePublicKey]:
    keys = []
    for i, data in enumerate(datas, 1):
        try:
            key = ck.load_public_key(data)
        except ck.KeyMaterialError as e:
            raise ck.KeyMaterialError(f"parsing Rekor public key {i}: {e}") from None
        if not isinstance(key, ec.EllipticCurvePublicKey):
            raise ck.KeyMaterialError(f"Rekor public key {i} is not an ECDSA key")
        keys.append(key)
    return keys


def canonical_json(value: Any) -> bytes:
    """RFC 8785 for what a Rekor payload holds: objects, strings, integers (an integral
    float is written as an integer, as ECMAScript prints it)."""
    def fix(v: Any) -> Any:
        if isinstance(v, dict):
            return {k: fix(x) for k, x in v.items()}
        if isinstance(v, list):
            return [fix(x) for x in v]
        if isinstance(v, float):
            if not v.is_integer() or abs(v) >= 2 ** 53:
                raise InvalidSignature("canonicalizing Rekor SET JSON: a non-integer number")
            return int(v)
        return v

    return json.dumps(fix(value), sort_keys=True, separators=(",", ":"),
                      ensure_ascii=False).encode()


def _pem_der(data: bytes, what: str) -> bytes:
    """The DER of the one PEM block in ``data``; anything after it is an error."""
    start = data.find(b"-----BEGIN ")
    end = data.find(b"-----END ", start + 1) if start >= 0 else -1
    close = data.find(b"-----", end + 9) if end >= 0 else -1
    if start < 0 or end < 0 or close < 0:
        raise InvalidSignature(f"{what} is not in PEM format")
    if data[close + 5:].strip():
        raise InvalidSignature(f"{what} has trailing data")
    lines = data[data.find(b"\n", start) + 1:end].splitlines()
    body = b"".join(x.strip() for x in lines if b":" not in x)
    try:
        return base64.b64decode(body, validate=True)
    except (binascii.Error, ValueError):
        raise InvalidSignature(f"{what} is not in PEM format") from None


def _b64(value: Any, where: str) -> bytes:
    try:
        return sj.base64_bytes(value, where)
    except sj.StrictJSONError as e:
        raise InvalidSignature(f"Rekor SET: {e}") from None


def verify_set(keys: Sequence[ec.EllipticCurvePublicKey], set_json: bytes, key_or_cert_pem: bytes,
               b64sig: str, payload: bytes) -> int:
    """Check the SET against ``keys`` and the signature it must record; the entry's
    integrated time (Unix seconds)."""
    try:
        doc = sj.obj(sj.loads(set_json), "Rekor SET", known=("SignedEntryTimestamp", "Payload"),
                     required=("SignedEntryTimestamp", "Payload"))
    except sj.StrictJSONError as e:
        raise InvalidSignature(f"invalid Rekor SET: {e}") from None
    set_sig = _b64(doc["SignedEntryTimestamp"], "SignedEntryTimestamp")
    canonical = canonical_json(doc["Payload"])
    if not any(ck.verify(k, set_sig, canonical) for k in keys):
        raise InvalidSignature("cryptographic signature verification of the Rekor SET failed")
    try:
        entry = sj.obj(doc["Payload"], "Rekor SET payload",
                       known=("body", "integratedTime", "logIndex", "logID"),
                       required=("body", "integratedTime", "logIndex", "logID"))
        body = json.loads(_b64(entry["body"], "body"))
        spec = body["spec"]
        version = body.get("apiVersion")
        integrated = entry["integratedTime"]
    except (sj.StrictJSONError, ValueError, KeyError, TypeError) as e:
        raise InvalidSignature(f"invalid Rekor SET payload: {e}") from None
    if version != "0.0.1":
        raise InvalidSignature(f"unsupported Rekor hashedrekord version {version!r}")
    try:
        recorded_key = base64.b64decode(spec["signature"]["publicKey"]["content"])
        recorded_sig = base64.b64decode(spec["signature"]["content"])
        hashed = spec["data"]["hash"]
    except (KeyError, TypeError, binascii.Error, ValueError) as e:
        raise InvalidSignature(f"incomplete hashedrekord in the Rekor SET: {e}") from None
    if _pem_der(recorded_key, "the publicKey in the Rekor SET") != _pem_der(
            key_or_cert_pem, "the key or certificate matched against the Rekor SET"):
        raise InvalidSignature("the publicKey in the Rekor SET does not match")
    try:
        mine = base64.b64decode(b64sig, validate=True)
    except (binascii.Error, ValueError):
        raise InvalidSignature("the signature annotation is not valid base64") from None
    if recorded_sig != mine:
        raise InvalidSignature("the signature in the Rekor SET does not match")
    if not isinstance(hashed, dict) or hashed.get("algorithm") != "sha256":
        raise InvalidSignature("unexpected data.hash.algorithm in the Rekor SET")
    if str(hashed.get("value", "")).lower() != hashlib.sha256(payload).hexdigest():
        raise InvalidSignature("the payload in the Rekor SET does not match")
    if isinstance(integrated, bool) or not isinstance(integrated, int):
        raise InvalidSignature("integratedTime in the Rekor SET is not an integer")
    return integrated
