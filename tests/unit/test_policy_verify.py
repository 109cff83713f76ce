"""Signature verification against policies, offline: sigstore keys, Rekor SETs, Fulcio
certificates and GPG simple signing (gpgv), with the refusal reasons containers/image
gives. Whole verdicts are compared with skopeo's in tests/e2e/test_signatures.py."""

from __future__ import annotations

import base64
import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from pycrid.images.policy import payload as pl
from pycrid.images.policy.config import parse_policy
from pycrid.images.policy.evaluate import evaluate
from pycrid.images.policy.names import parse_named
from pycrid.images.policy.trust import FileTrust
from pycrid.images.policy.verdict import Verdict, needs_signatures
from tests.support.signing import Fulcio, GnuPG, SigstoreKey, claim

D = "sha256:" + "c" * 64
OTHER = "sha256:" + "d" * 64
REF = "quay.io/ns/app:v1"


def verdict(doc: dict[str, Any], sigs: list[pl.Signature], ref: str = REF,
            digest: str = D) -> Verdict:
    p = parse_policy(json.dumps(doc).encode(), "/p.json")
    return evaluate(p, parse_named(ref), digest, sigs, FileTrust())


def keyed(path: Path, **extra: Any) -> dict[str, Any]:
    return {"default": [{"type": "reject"}], "transports": {"docker": {
        "quay.io/ns": [{"type": "sigstoreSigned", "keyPath": str(path), **extra}]}}}


@pytest.fixture(scope="module")
def key() -> SigstoreKey:
    return SigstoreKey.new()


@pytest.fixture
def key_file(tmp_path: Path, key: SigstoreKey) -> Path:
    f = tmp_path / "key.pub"
    f.write_bytes(key.public_pem)
    return f


def test_right_key_accepted(key: SigstoreKey, key_file: Path) -> None:
    v = verdict(keyed(key_file), [key.signature(D, REF)])
    assert v.allowed and v.scope == "quay.io/ns"


def test_refusals(key: SigstoreKey, key_file: Path) -> None:
    other = SigstoreKey.new()
    cases = {
        "no signature exists": [],
        "cryptographic signature verification failed": [other.signature(D, REF)],
        f"signature for digest {OTHER} does not match": [key.signature(OTHER, REF)],
        "signature for identity 'quay.io/ns/app:v2' is not accepted":
            [key.signature(D, "quay.io/ns/app:v2")],
        "missing dev.cosignproject.cosign/signature": [pl.Sigstore(pl.SIGSTORE_MIME, b"{}")],
        "none of the signatures were accepted": [other.signature(D, REF),
                                                 key.signature(OTHER, REF)],
        "(1 of another kind)": [pl.SimpleSigning(b"\xa3x")],
    }
    for needle, sigs in cases.items():
        v = verdict(keyed(key_file), list(sigs))
        assert not v.allowed and needle in v.reason, (needle, v.reason)
    # A layer of another media type in the attachment is not a signature.
    s = key.signature(D, REF)
    v = verdict(keyed(key_file), [pl.Sigstore("application/octet-stream", s.payload,
                                              s.annotations)])
    assert "no signature exists (1 of another kind)" in v.reason
    # One good signature among bad ones is enough.
    assert verdict(keyed(key_file), [other.signature(D, REF), key.signature(D, REF)]).allowed


def test_reject_and_accept_and_default() -> None:
    doc = {"default": [{"type": "insecureAcceptAnything"}],
           "transports": {"docker": {"quay.io/bad": [{"type": "reject"}]}}}
    assert verdict(doc, [], ref="quay.io/good:1").allowed
    v = verdict(doc, [], ref="quay.io/bad:1")
    assert not v.allowed and "rejected by policy" in v.reason
    assert v.scope_text == 'transports.docker["quay.io/bad"]'


def test_every_requirement_must_hold(key: SigstoreKey, key_file: Path) -> None:
    doc = keyed(key_file)
    doc["transports"]["docker"]["quay.io/ns"].append({"type": "reject"})
    assert not verdict(doc, [key.signature(D, REF)]).allowed


def test_key_file_problems_refuse_with_the_path(key: SigstoreKey, tmp_path: Path) -> None:
    v = verdict(keyed(tmp_path / "missing.pub"), [key.signature(D, REF)])
    assert not v.allowed and "missing.pub" in v.reason
    junk = tmp_path / "junk.pub"
    junk.write_text("this is not a key\n")
    v = verdict(keyed(junk), [key.signature(D, REF)])
    assert "parsing public key" in v.reason and "junk.pub" in v.reason


def test_corrupt_payload_and_signature(key: SigstoreKey, key_file: Path) -> None:
    body = b'{"critical": {}, "optional": {}}'
    sig = pl.Sigstore(pl.SIGSTORE_MIME, body, {
        pl.SIGNATURE_ANNOTATION: base64.b64encode(key.sign(body)).decode()})
    assert "invalid signature payload" in verdict(keyed(key_file), [sig]).reason
    good = key.signature(D, REF)
    truncated = pl.Sigstore(pl.SIGSTORE_MIME, good.payload[:-3], good.annotations)
    assert "verification failed" in verdict(keyed(key_file), [truncated]).reason
    garbled = pl.Sigstore(pl.SIGSTORE_MIME, good.payload, {pl.SIGNATURE_ANNOTATION: "%%"})
    assert "base64" in verdict(keyed(key_file), [garbled]).reason


def test_claim_parsing_is_strict() -> None:
    ok = claim(D, REF)
    assert pl.parse_claim(ok, pl.SIGSTORE_TYPE) == pl.Claim(D, REF)
    with pytest.raises(pl.InvalidSignature, match="unrecognized signature type"):
        pl.parse_claim(ok, pl.SIMPLE_SIGNING_TYPE)
    doc = json.loads(ok)
    doc["critical"]["extra"] = 1
    with pytest.raises(pl.InvalidSignature, match="unknown key 'extra'"):
        pl.parse_claim(json.dumps(doc).encode(), pl.SIGSTORE_TYPE)
    doc = json.loads(ok)
    doc["optional"] = {"timestamp": 1.5}
    with pytest.raises(pl.InvalidSignature, match="timestamp"):
        pl.parse_claim(json.dumps(doc).encode(), pl.SIGSTORE_TYPE)
    doc["optional"] = None
    assert pl.parse_claim(json.dumps(doc).encode(), pl.SIGSTORE_TYPE).manifest_digest == D
    doc["critical"]["image"]["docker-manifest-digest"] = "sha256:abc"
    with pytest.raises(pl.InvalidSignature, match="docker-manifest-digest"):
        pl.parse_claim(json.dumps(doc).encode(), pl.SIGSTORE_TYPE)


def test_blob_round_trip(key: SigstoreKey) -> None:
    s = key.signature(D, REF, extra="x")
    assert pl.from_blob(pl.to_blob(s)) == s
    assert pl.from_blob(b"\xa3abc") == pl.SimpleSigning(b"\xa3abc")
    with pytest.raises(pl.InvalidSignature):
        pl.from_blob(b"garbage")


def test_rekor_with_keys(key: SigstoreKey, key_file: Path, tmp_path: Path) -> None:
    from tests.support.signing import rekor_bundle
    rekor = SigstoreKey.new()
    rekor_file = tmp_path / "rekor.pub"
    rekor_file.write_bytes(rekor.public_pem)
    doc = keyed(key_file, rekorPublicKeyPath=str(rekor_file))
    s = key.signature(D, REF)
    b64 = s.annotations[pl.SIGNATURE_ANNOTATION]
    assert "missing dev.sigstore.cosign/bundle" in verdict(doc, [s]).reason
    bundle = rekor_bundle(rekor, key.public_pem, b64, s.payload, 1_700_000_000)
    good = pl.Sigstore(s.mime_type, s.payload, {**s.annotations, pl.BUNDLE_ANNOTATION: bundle})
    assert verdict(doc, [good]).allowed
    forged = rekor_bundle(SigstoreKey.new(), key.public_pem, b64, s.payload, 1_700_000_000)
    v = verdict(doc, [pl.Sigstore(s.mime_type, s.payload,
                                  {**s.annotations, pl.BUNDLE_ANNOTATION: forged})])
    assert "Rekor SET failed" in v.reason


def keyless_doc(tmp_path: Path, fulcio: Fulcio, rekor: SigstoreKey,
                email: str = "dev@example.com") -> dict[str, Any]:
    (tmp_path / "fulcio.pem").write_bytes(fulcio.root_pem)
    (tmp_path / "rekor.pub").write_bytes(rekor.public_pem)
    return {"default": [{"type": "sigstoreSigned", "fulcio": {
        "caPath": str(tmp_path / "fulcio.pem"), "oidcIssuer": "https://issuer.example",
        "subjectEmail": email}, "rekorPublicKeyPath": str(tmp_path / "rekor.pub")}]}


def test_keyless(tmp_path: Path, key: SigstoreKey) -> None:
    fulcio, rekor = Fulcio.new(), SigstoreKey.new()
    doc = keyless_doc(tmp_path, fulcio, rekor)
    assert verdict(doc, [fulcio.signature(key, rekor, D, REF)]).allowed
    cases = {
        "required email 'dev@example.com' not found":
            fulcio.signature(key, rekor, D, REF, email="eve@example.com"),
        "unexpected Fulcio OIDC issuer":
            fulcio.signature(key, rekor, D, REF, issuer="https://evil.example"),
        "was not valid at": fulcio.signature(key, rekor, D, REF, when=1_000_000_000),
        "Rekor SET failed": fulcio.signature(key, SigstoreKey.new(), D, REF),
        "no chain to the Fulcio CA": Fulcio.new().signature(key, rekor, D, REF),
    }
    for needle, sig in cases.items():
        v = verdict(doc, [sig])
        assert not v.allowed and needle in v.reason, (needle, v.reason)


def test_keyless_v2_issuer_extension(tmp_path: Path, key: SigstoreKey) -> None:
    from cryptography import x509

    from pycrid.images.policy.fulcio import oidc_issuer
    fulcio = Fulcio.new()
    cert = x509.load_pem_x509_certificate(fulcio.leaf(key, "a@b", "https://i.example", v2=True))
    assert oidc_issuer(cert) == "https://i.example"


@pytest.mark.skipif(shutil.which("gpg") is None or shutil.which("gpgv") is None,
                    reason="GnuPG (gpg, gpgv) is not installed")
def test_gpg_simple_signing(tmp_path: Path) -> None:
    with GnuPG(tmp_path / "a") as signer, GnuPG(tmp_path / "b", "other <o@example.com>") as s2:
        _gpg_cases(tmp_path, signer, s2)


def _gpg_cases(tmp_path: Path, signer: GnuPG, stranger: GnuPG) -> None:
    (tmp_path / "key.gpg").write_bytes(signer.public_key(armor=True))
    doc = {"default": [{"type": "signedBy", "keyType": "GPGKeys",
                        "keyPath": str(tmp_path / "key.gpg")}]}
    good = pl.SimpleSigning(signer.sign(claim(D, REF, pl.SIMPLE_SIGNING_TYPE)))
    assert verdict(doc, [good]).allowed
    v = verdict(doc, [pl.SimpleSigning(stranger.sign(claim(D, REF, pl.SIMPLE_SIGNING_TYPE)))])
    assert "is not accepted" in v.reason
    v = verdict(doc, [pl.SimpleSigning(signer.sign(claim(D, REF)))])  # a sigstore claim
    assert "unrecognized signature type" in v.reason
    v = verdict(doc, [pl.SimpleSigning(good.blob[:-20])])
    assert not v.allowed
    binary = {"default": [{"type": "signedBy", "keyType": "GPGKeys",
                           "keyData": base64.b64encode(signer.public_key()).decode()}]}
    assert verdict(binary, [good]).allowed
    (tmp_path / "junk.gpg").write_text("not a key")
    junk = {"default": [{"type": "signedBy", "keyType": "GPGKeys",
                         "keyPath": str(tmp_path / "junk.gpg")}]}
    assert "no public keys imported" in verdict(junk, [good]).reason


def test_needs_signatures() -> None:
    p = parse_policy(json.dumps({"default": [{"type": "insecureAcceptAnything"}],
                                 "transports": {"docker": {"q.io": [{
                                     "type": "sigstoreSigned", "keyPath": "/k"}]}}}).encode(),
                     "/p")
    assert not needs_signatures(p, parse_named("docker.io/x:1"))
    assert needs_signatures(p, parse_named("q.io/x:1"))
