"""Public keys in PEM and the signature check sigstore uses: SHA-256, ECDSA (ASN.1),
RSA PKCS#1 v1.5 or Ed25519, as sigstore's ``LoadVerifier`` picks by key type."""

from __future__ import annotations

from typing import TYPE_CHECKING, TypeGuard

if TYPE_CHECKING:
    # Imported where a key is used: the cryptography package costs the daemon about 9 MiB,
    # which a node that checks no signature should not pay.
    from cryptography import x509
    from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa

    PublicKey = ec.EllipticCurvePublicKey | rsa.RSAPublicKey | ed25519.Ed25519PublicKey


class KeyMaterialError(ValueError):
    """Key material that is not a usable public key."""


def _first_pem(data: bytes) -> tuple[str, bytes]:
    """The type and bytes of the first PEM block (what Go's ``pem.Decode`` returns)."""
    start = data.find(b"-----BEGIN ")
    if start < 0:
        raise KeyMaterialError("PEM decoding failed (no PEM block)")
    head_end = data.find(b"-----", start + 11)
    end_marker = data.find(b"-----END ", head_end)
    end = data.find(b"-----", end_marker + 9) if end_marker >= 0 else -1
    if head_end < 0 or end < 0:
        raise KeyMaterialError("PEM decoding failed (an unterminated block)")
    label = data[start + 11:head_end].decode("ascii", "replace")
    return label, data[start:end + 5]


def load_public_key(data: bytes) -> PublicKey:
    """The public key in ``data`` (``PUBLIC KEY`` or ``RSA PUBLIC KEY`` PEM)."""
    from cryptography.exceptions import UnsupportedAlgorithm
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa

    label, block = _first_pem(data)
    try:
        if label in ("PUBLIC KEY", "RSA PUBLIC KEY"):
            key = serialization.load_pem_public_key(block)
        else:
            raise KeyMaterialError(f"PEM block of type {label!r} is not a public key")
    except (ValueError, UnsupportedAlgorithm) as e:
        raise KeyMaterialError(f"not a public key: {e}") from None
    if not isinstance(key, ec.EllipticCurvePublicKey | rsa.RSAPublicKey
                      | ed25519.Ed25519PublicKey):
        raise KeyMaterialError(f"unsupported public key type {type(key).__name__}")
    return key


def load_certificates(data: bytes) -> list[x509.Certificate]:
    """Every certificate in a PEM bundle; KeyMaterialError when there is none or one is bad."""
    from cryptography import x509

    try:
        certs = x509.load_pem_x509_certificates(data)
    except ValueError as e:
        raise KeyMaterialError(f"not PEM certificates: {e}") from None
    if not certs:
        raise KeyMaterialError("no certificate found")
    return certs


def verify(key: PublicKey, signature: bytes, message: bytes) -> bool:
    """Whether ``signature`` is ``key``'s over ``message`` (SHA-256)."""
    from cryptography.exceptions import InvalidSignature as CryptoInvalid
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import ec, padding, rsa

    try:
        if isinstance(key, ec.EllipticCurvePublicKey):
            key.verify(signature, message, ec.ECDSA(hashes.SHA256()))
        elif isinstance(key, rsa.RSAPublicKey):
            key.verify(signature, message, padding.PKCS1v15(), hashes.SHA256())
        else:
            key.verify(signature, message)
    except (CryptoInvalid, ValueError):
        return False
    return True


def is_public_key(key: object) -> TypeGuard[PublicKey]:
    """Whether ``key`` is of a type :func:`verify` handles."""
    from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa

    return isinstance(key, ec.EllipticCurvePublicKey | rsa.RSAPublicKey
                      | ed25519.Ed25519PublicKey)


def pem_of(key: PublicKey) -> bytes:
    from cryptography.hazmat.primitives import serialization

    return key.public_bytes(serialization.Encoding.PEM,
                            serialization.PublicFormat.SubjectPublicKeyInfo)
