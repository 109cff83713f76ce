"""Signers for tests: sigstore payloads signed with a key of our own, a test Fulcio CA and
Rekor key that make keyless signatures, and a GnuPG home that makes simple-signing ones.

These produce what cosign, Fulcio/Rekor and ``skopeo --sign-by`` produce (the formats
containers/image reads); the e2e tests also sign with the real skopeo and compare
verdicts with the real skopeo.
"""

from __future__ import annotations

import base64
import datetime
import hashlib
import json
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from pycrid.images.policy import payload as pl
from pycrid.images.policy.fulcio import OID_ISSUER_V1, OID_ISSUER_V2
from pycrid.images.policy.rekor import canonical_json


def claim(digest: str, ref: str, kind: str = pl.SIGSTORE_TYPE) -> bytes:
    return json.dumps({"critical": {"identity": {"docker-reference": ref},
                                    "image": {"docker-manifest-digest": digest},
                                    "type": kind},
                       "optional": {"creator": "pycrid tests"}}).encode()


@dataclass
class SigstoreKey:
    key: ec.EllipticCurvePrivateKey

    @classmethod
    def new(cls) -> SigstoreKey:
        return cls(ec.generate_private_key(ec.SECP256R1()))

    @property
    def public_pem(self) -> bytes:
        return self.key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)

    def sign(self, data: bytes) -> bytes:
        return self.key.sign(data, ec.ECDSA(hashes.SHA256()))

    def signature(self, digest: str, ref: str, **annotations: str) -> pl.Sigstore:
        body = claim(digest, ref)
        ann = {pl.SIGNATURE_ANNOTATION: base64.b64encode(self.sign(body)).decode(),
               **annotations}
        return pl.Sigstore(pl.SIGSTORE_MIME, body, ann)


def rekor_bundle(rekor: SigstoreKey, key_or_cert_pem: bytes, sig_b64: str, payload: bytes,
                 integrated: int) -> str:
    """A Rekor SET for a hashedrekord entry of this signature."""
    body = {"apiVersion": "0.0.1", "kind": "hashedrekord", "spec": {
        "data": {"hash": {"algorithm": "sha256", "value": hashlib.sha256(payload).hexdigest()}},
        "signature": {"content": sig_b64,
                      "publicKey": {"content": base64.b64encode(key_or_cert_pem).decode()}}}}
    entry = {"body": base64.b64encode(json.dumps(body).encode()).decode(),
             "integratedTime": integrated, "logIndex": 7, "logID": "ab" * 32}
    set_sig = rekor.sign(canonical_json(entry))
    return json.dumps({"SignedEntryTimestamp": base64.b64encode(set_sig).decode(),
                       "Payload": entry})


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


@dataclass
class Fulcio:
    """A test Fulcio: root CA -> intermediate -> short-lived leaf per signature."""

    root_key: ec.EllipticCurvePrivateKey
    root: x509.Certificate
    inter_key: ec.EllipticCurvePrivateKey
    inter: x509.Certificate

    @classmethod
    def new(cls) -> Fulcio:
        now = datetime.datetime.now(datetime.UTC)
        rk = ec.generate_private_key(ec.SECP256R1())
        root = (x509.CertificateBuilder().subject_name(_name("test fulcio root"))
                .issuer_name(_name("test fulcio root")).public_key(rk.public_key())
                .serial_number(1).not_valid_before(now - datetime.timedelta(days=1))
                .not_valid_after(now + datetime.timedelta(days=30))
                .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
                .sign(rk, hashes.SHA256()))
        ik = ec.generate_private_key(ec.SECP256R1())
        inter = (x509.CertificateBuilder().subject_name(_name("test fulcio intermediate"))
                 .issuer_name(root.subject).public_key(ik.public_key()).serial_number(2)
                 .not_valid_before(now - datetime.timedelta(days=1))
                 .not_valid_after(now + datetime.timedelta(days=30))
                 .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
                 .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CODE_SIGNING]),
                                critical=False)
                 .sign(rk, hashes.SHA256()))
        return cls(rk, root, ik, inter)

    @property
    def root_pem(self) -> bytes:
        return self.root.public_bytes(serialization.Encoding.PEM)

    @property
    def chain_pem(self) -> bytes:
        return b"".join(c.public_bytes(serialization.Encoding.PEM)
                        for c in (self.inter, self.root))

    def leaf(self, key: SigstoreKey, email: str, issuer: str, *, minutes: int = 10,
             v2: bool = False) -> bytes:
        now = datetime.datetime.now(datetime.UTC)
        ext = (x509.UnrecognizedExtension(OID_ISSUER_V2, b"\x0c" + bytes([len(issuer)])
                                          + issuer.encode()) if v2 else
               x509.UnrecognizedExtension(OID_ISSUER_V1, issuer.encode()))
        cert = (x509.CertificateBuilder().subject_name(x509.Name([]))
                .issuer_name(self.inter.subject).public_key(key.key.public_key())
                .serial_number(x509.random_serial_number())
                .not_valid_before(now - datetime.timedelta(minutes=1))
                .not_valid_after(now + datetime.timedelta(minutes=minutes))
                .add_extension(x509.SubjectAlternativeName([x509.RFC822Name(email)]),
                               critical=True)
                .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CODE_SIGNING]),
                               critical=False)
                .add_extension(ext, critical=False)
                .sign(self.inter_key, hashes.SHA256()))
        return cert.public_bytes(serialization.Encoding.PEM)

    def signature(self, key: SigstoreKey, rekor: SigstoreKey, digest: str, ref: str, *,
                  email: str = "dev@example.com", issuer: str = "https://issuer.example",
                  when: int | None = None) -> pl.Sigstore:
        sig = key.signature(digest, ref)
        cert = self.leaf(key, email, issuer)
        b64 = sig.annotations[pl.SIGNATURE_ANNOTATION]
        stamp = when if when is not None else int(
            datetime.datetime.now(datetime.UTC).timestamp())
        bundle = rekor_bundle(rekor, cert, b64, sig.payload, stamp)
        return pl.Sigstore(sig.mime_type, sig.payload, {
            **sig.annotations, pl.CERTIFICATE_ANNOTATION: cert.decode(),
            pl.CHAIN_ANNOTATION: self.chain_pem.decode(), pl.BUNDLE_ANNOTATION: bundle})


class GnuPG:
    """A GnuPG home with one signing key (no passphrase)."""

    def __init__(self, home: Path, uid: str = "pycrid test <test@example.com>",
                 algo: str = "ed25519") -> None:
        self.home = home
        home.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.run("--quick-gen-key", "--passphrase", "", uid, algo, "sign", "never")
        out = self.run("--with-colons", "--list-keys", uid).decode()
        self.fingerprint = next(line.split(":")[9] for line in out.splitlines()
                                if line.startswith("fpr:"))

    def run(self, *args: str, data: bytes | None = None) -> bytes:
        env = {**os.environ, "GNUPGHOME": str(self.home)}
        return subprocess.run(["gpg", "--batch", "--yes", "--pinentry-mode", "loopback",
                               *args], input=data, env=env, capture_output=True, check=True,
                              timeout=120).stdout

    def close(self) -> None:
        """Stop the gpg-agent that key generation and signing started for this home."""
        subprocess.run(["gpgconf", "--homedir", str(self.home), "--kill", "gpg-agent"],
                       capture_output=True, timeout=30, check=False)

    def __enter__(self) -> GnuPG:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def public_key(self, armor: bool = False) -> bytes:
        return self.run(*(["--armor"] if armor else []), "--export", self.fingerprint)

    def sign(self, data: bytes) -> bytes:
        return self.run("--local-user", self.fingerprint, "--sign", data=data)
