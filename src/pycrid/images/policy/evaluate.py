"""Whether an image may run: every requirement of the scope that applies must hold.

This follows containers/image's ``IsRunningImageAllowed``: a ``signedBy`` or
``sigstoreSigned`` requirement holds when one signature of its kind is accepted (right
key, claim naming this manifest digest, signed identity accepted by ``signedIdentity``);
its refusal reason is the one rejected signature's, or all of them, or "no signature".
Synchronous and pure but for key files read through ``Trust`` and ``gpgv`` run by it:
callers run it in a thread.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Sequence
from typing import Protocol

from pycrid.images.policy import crypto_keys as ck
from pycrid.images.policy import payload as pl
from pycrid.images.policy.config import (
    BASE_LAYER,
    GPG_KEYS,
    INSECURE,
    REJECT,
    SIGNED_BY,
    Material,
    Policy,
    Requirement,
)
from pycrid.images.policy.names import Named, matches
from pycrid.images.policy.verdict import Verdict


class Trust(Protocol):
    """Reads trust material; the daemon's caches file contents by their stat."""

    def read(self, path: str) -> bytes: ...

    def gpg_verify(self, keyrings: Sequence[bytes], blob: bytes) -> bytes:
        """The signed plaintext of an OpenPGP message signed by one of ``keyrings``' keys;
        raises InvalidSignature (or KeyMaterialError when no key is in them)."""
        ...

    def keyless(self, req: Requirement, sig: pl.Sigstore, b64sig: str) -> ck.PublicKey:
        """The signer's key from a Fulcio certificate whose Rekor SET verifies."""
        ...


def evaluate(policy: Policy, ref: Named, digest: str, sigs: Sequence[pl.Signature],
             trust: Trust) -> Verdict:
    """The verdict of ``policy`` on image ``ref`` whose manifest (or index) is ``digest``."""
    scope, reqs = policy.requirements_for(ref)
    for req in reqs:
        reason = _refusal(req, ref, digest, sigs, trust)
        if reason:
            return Verdict(False, policy.path, scope, reason)
    return Verdict(True, policy.path, scope)


def _refusal(req: Requirement, ref: Named, digest: str, sigs: Sequence[pl.Signature],
             trust: Trust) -> str:
    """Why ``req`` refuses the image; "" when it allows it."""
    if req.type == INSECURE:
        return ""
    if req.type == REJECT:
        return f"running image docker://{ref} is rejected by policy"
    if req.type == BASE_LAYER:
        return "signedBaseLayer is not implemented (containers/image refuses it too)"
    if req.type == SIGNED_BY:
        mine: list[pl.Signature] = [s for s in sigs if isinstance(s, pl.SimpleSigning)]
        others = len(sigs) - len(mine)
        check = _simple_signing
    else:
        mine = [s for s in sigs if isinstance(s, pl.Sigstore) and s.mime_type == pl.SIGSTORE_MIME]
        others = len(sigs) - len(mine)
        check = _sigstore
    reasons = []
    for sig in mine:
        try:
            check(req, ref, digest, sig, trust)
            return ""
        except (pl.InvalidSignature, ck.KeyMaterialError, OSError) as e:
            reasons.append(_text(e))
    if not reasons:
        extra = f" ({others} of another kind)" if others else ""
        return f"a signature was required, but no signature exists{extra}"
    if len(reasons) == 1:
        return reasons[0]
    return "none of the signatures were accepted, reasons: " + "; ".join(reasons)


def _text(e: BaseException) -> str:
    if isinstance(e, OSError):
        return f"cannot read {e.filename}: {e.strerror or e}"
    return str(e)


def _check_claim(claim: pl.Claim, req: Requirement, ref: Named, digest: str) -> None:
    if claim.manifest_digest != digest:
        raise pl.InvalidSignature(f"signature for digest {claim.manifest_digest} does not "
                                  f"match (the image is {digest})")
    if not matches(req.identity, ref, claim.docker_reference):
        raise pl.InvalidSignature(f"signature for identity {claim.docker_reference!r} is not "
                                  f"accepted (signedIdentity {req.identity.type})")


def _material(m: Material, trust: Trust) -> list[bytes]:
    return [trust.read(p) for p in m.paths] + list(m.datas)


def _simple_signing(req: Requirement, ref: Named, digest: str, sig: pl.Signature,
                    trust: Trust) -> None:
    assert isinstance(sig, pl.SimpleSigning)
    if req.key_type != GPG_KEYS:
        raise pl.InvalidSignature(f"keyType {req.key_type!r} is not implemented "
                                  "(containers/image refuses it too)")
    plaintext = trust.gpg_verify(_material(req.keys, trust), sig.blob)
    _check_claim(pl.parse_claim(plaintext, pl.SIMPLE_SIGNING_TYPE), req, ref, digest)


def _sigstore(req: Requirement, ref: Named, digest: str, sig: pl.Signature,
              trust: Trust) -> None:
    assert isinstance(sig, pl.Sigstore)
    b64sig = sig.annotations.get(pl.SIGNATURE_ANNOTATION)
    if b64sig is None:
        raise pl.InvalidSignature(f"missing {pl.SIGNATURE_ANNOTATION} annotation")
    if req.fulcio is not None:
        keys = [trust.keyless(req, sig, b64sig)]
    elif req.pki is not None:
        raise pl.InvalidSignature("sigstoreSigned with pki is not supported by pycrid")
    else:
        keys = []
        for i, data in enumerate(_material(req.keys, trust), 1):
            try:
                keys.append(ck.load_public_key(data))
            except ck.KeyMaterialError as e:
                where = req.keys.paths[i - 1] if i <= len(req.keys.paths) else f"keyData {i}"
                raise ck.KeyMaterialError(f"parsing public key {where}: {e}") from None
        if req.rekor_keys:
            keys = [_rekor_accepted(req, sig, b64sig, keys, trust)]
    try:
        raw = base64.b64decode(b64sig, validate=True)
    except (binascii.Error, ValueError):
        raise pl.InvalidSignature("the signature annotation is not valid base64") from None
    if not any(ck.verify(k, raw, sig.payload) for k in keys):
        raise pl.InvalidSignature("cryptographic signature verification failed (signed by "
                                  "another key, or the payload was changed)")
    _check_claim(pl.parse_claim(sig.payload, pl.SIGSTORE_TYPE), req, ref, digest)


def _rekor_accepted(req: Requirement, sig: pl.Sigstore, b64sig: str,
                    keys: list[ck.PublicKey], trust: Trust) -> ck.PublicKey:
    """The one key of ``keys`` the signature's Rekor SET records."""
    from pycrid.images.policy import rekor

    bundle = sig.annotations.get(pl.BUNDLE_ANNOTATION)
    if bundle is None:
        raise pl.InvalidSignature(f"missing {pl.BUNDLE_ANNOTATION} annotation")
    rekor_keys = rekor.load_rekor_keys(_material(req.rekor_keys, trust))
    failures = []
    for key in keys:
        try:
            rekor.verify_set(rekor_keys, bundle.encode(), ck.pem_of(key), b64sig, sig.payload)
            return key
        except pl.InvalidSignature as e:
            failures.append(str(e))
    raise pl.InvalidSignature("no public key verified against the Rekor SET: "
                              + ", ".join(failures))
