"""Keyless sigstore signatures: a Fulcio certificate, checked offline.

The checks containers/image makes (``verifyRekorFulcio``): the Rekor SET verifies and
records this certificate and signature; the certificate chains to the configured
Fulcio CA through the signature's ``chain`` annotation (its last certificate, the
root, is not taken from the signature), every certificate valid at the SET's
integrated time, each issuer a CA, the code-signing usage allowed along the chain, no
critical extension left unknown; its OIDC issuer extension (v1 or v2, equal if both)
is ``oidcIssuer`` and its e-mail SANs include ``subjectEmail``. The chain is built
here (cryptography checks each signature); name and path-length constraints, which
Go's verifier also applies, are not checked.
"""

from __future__ import annotations

import datetime
from collections.abc import Sequence

from cryptography import x509
from cryptography.exceptions import InvalidSignature as BadSignature
from cryptography.x509.oid import ExtendedKeyUsageOID, ExtensionOID, ObjectIdentifier

from pycrid.images.policy import crypto_keys as ck
from pycrid.images.policy.payload import InvalidSignature

OID_ISSUER_V1 = ObjectIdentifier("1.3.6.1.4.1.57264.1.1")
OID_ISSUER_V2 = ObjectIdentifier("1.3.6.1.4.1.57264.1.8")
_ANY_EKU = ObjectIdentifier("2.5.29.37.0")
_MAX_DEPTH = 6


def _der_string(value: bytes) -> str:
    """An ASN.1 UTF8String/PrintableString/IA5String, DER (the v2 issuer extension)."""
    if len(value) < 2 or value[0] not in (0x0C, 0x13, 0x16):
        raise InvalidSignature("invalid ASN.1 in the OIDC issuer v2 extension")
    length, at = value[1], 2
    if length & 0x80:
        n = length & 0x7F
        length, at = int.from_bytes(value[2:2 + n], "big"), 2 + n
    if at + length != len(value):
        raise InvalidSignature("invalid ASN.1 in the OIDC issuer v2 extension")
    return value[at:].decode("utf-8", "replace")


def oidc_issuer(cert: x509.Certificate) -> str:
    v1 = v2 = None
    for ext in cert.extensions:
        if not isinstance(ext.value, x509.UnrecognizedExtension):
            continue
        if ext.oid == OID_ISSUER_V1:
            v1 = ext.value.value.decode("utf-8", "replace")
        elif ext.oid == OID_ISSUER_V2:
            v2 = _der_string(ext.value.value)
    if v1 is not None and v2 is not None and v1 != v2:
        raise InvalidSignature(f"inconsistent OIDC issuer extensions: v1 {v1!r}, v2 {v2!r}")
    found = v1 if v1 is not None else v2
    if found is None:
        raise InvalidSignature("the Fulcio certificate has no OIDC issuer extension")
    return found


def _check_one(cert: x509.Certificate, at: datetime.datetime, leaf: bool) -> None:
    if not cert.not_valid_before_utc <= at <= cert.not_valid_after_utc:
        raise InvalidSignature(f"certificate {cert.subject.rfc4514_string()!r} was not valid "
                               f"at {at.isoformat()}")
    for ext in cert.extensions:
        if (ext.critical and isinstance(ext.value, x509.UnrecognizedExtension)
                and ext.oid != ExtensionOID.SUBJECT_ALTERNATIVE_NAME):
            raise InvalidSignature(f"certificate has an unhandled critical extension {ext.oid}")
    try:
        ekus = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    except x509.ExtensionNotFound:
        ekus = None
    if ekus is not None and ExtendedKeyUsageOID.CODE_SIGNING not in ekus and _ANY_EKU not in ekus:
        raise InvalidSignature("certificate chain does not allow code signing")
    if leaf and ekus is None:
        return
    if not leaf:
        try:
            bc = cert.extensions.get_extension_for_class(x509.BasicConstraints).value
        except x509.ExtensionNotFound:
            bc = None
        if bc is None or not bc.ca:
            raise InvalidSignature(f"issuer {cert.subject.rfc4514_string()!r} is not a CA")


def verify_chain(leaf: x509.Certificate, intermediates: Sequence[x509.Certificate],
                 roots: Sequence[x509.Certificate], at: datetime.datetime) -> None:
    """A path from ``leaf`` to one of ``roots`` valid at ``at``, or InvalidSignature."""
    _check_one(leaf, at, leaf=True)
    problems: list[str] = []

    def walk(cert: x509.Certificate, depth: int) -> bool:
        if depth > _MAX_DEPTH:
            return False
        for candidate, trusted in [(r, True) for r in roots] + [(i, False) for i in intermediates]:
            if candidate.subject != cert.issuer:
                continue
            try:
                cert.verify_directly_issued_by(candidate)
                _check_one(candidate, at, leaf=False)
            except BadSignature:
                problems.append(f"bad signature by {candidate.subject.rfc4514_string()!r}")
                continue
            except (ValueError, TypeError, InvalidSignature) as e:
                problems.append(str(e) or type(e).__name__)
                continue
            if trusted or walk(candidate, depth + 1):
                return True
        return False

    if not walk(leaf, 0):
        detail = f" ({'; '.join(problems)})" if problems else ""
        raise InvalidSignature("verifying the leaf certificate failed: no chain to the "
                               f"Fulcio CA{detail}")


def verify_fulcio(ca_pem: bytes, issuer: str, email: str, cert_pem: bytes, chain_pem: bytes,
                  integrated_time: int) -> ck.PublicKey:
    """The signer's key once the certificate passes every check (see the module)."""
    try:
        roots = ck.load_certificates(ca_pem)
    except ck.KeyMaterialError as e:
        raise ck.KeyMaterialError(f"loading the Fulcio CA certificates: {e}") from None
    intermediates: list[x509.Certificate] = []
    if chain_pem:
        try:
            intermediates = ck.load_certificates(chain_pem)[:-1]
        except ck.KeyMaterialError as e:
            raise InvalidSignature(f"loading the certificate chain: {e}") from None
    try:
        leaves = x509.load_pem_x509_certificates(cert_pem)
    except ValueError as e:
        raise InvalidSignature(f"parsing the leaf certificate: {e}") from None
    if len(leaves) != 1:
        raise InvalidSignature(f"{len(leaves)} certificates in the signature's certificate "
                               "data, not one")
    leaf = leaves[0]
    at = datetime.datetime.fromtimestamp(integrated_time, datetime.UTC)
    verify_chain(leaf, intermediates, roots, at)
    found = oidc_issuer(leaf)
    if found != issuer:
        raise InvalidSignature(f"unexpected Fulcio OIDC issuer {found!r}")
    try:
        san = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        emails = san.get_values_for_type(x509.RFC822Name)
    except x509.ExtensionNotFound:
        emails = []
    if email not in emails:
        raise InvalidSignature(f"required email {email!r} not found (got {emails})")
    key = leaf.public_key()
    if not ck.is_public_key(key):
        raise InvalidSignature("the certificate's key type is not supported")
    return key
