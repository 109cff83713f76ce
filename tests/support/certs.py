"""A throw-away PKI for the registry tests, made with ``cryptography``.

One test CA signs the registry's server certificate (127.0.0.1 and localhost) and
the token server's signing certificate; a separate client CA signs the client
certificate, so a test can tell "server trusted" apart from "client trusted".
Keys are P-256: generating them takes milliseconds, which keeps session set-up fast.
"""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


@dataclass(frozen=True)
class TestPKI:
    """Paths of the PEM files written by :func:`make_pki`."""

    __test__ = False  # not a pytest test class, despite the name

    ca_cert: str
    ca_key: str
    server_cert: str
    server_key: str
    client_ca_cert: str
    client_ca_key: str
    client_cert: str
    client_key: str
    token_cert: str
    token_key: str


def _name(cn: str) -> x509.Name:
    return x509.Name([
        x509.NameAttribute(NameOID.ORGANIZATION_NAME, "pycrid tests"),
        x509.NameAttribute(NameOID.COMMON_NAME, cn),
    ])


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _builder(
    subject: str, key: ec.EllipticCurvePrivateKey, issuer: x509.Name
) -> x509.CertificateBuilder:
    now = datetime.datetime.now(datetime.UTC)
    return (
        x509.CertificateBuilder()
        .subject_name(_name(subject))
        .issuer_name(issuer)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        # Back-dated a little so a clock that is slightly behind still accepts it.
        .not_valid_before(now - datetime.timedelta(hours=1))
        .not_valid_after(now + datetime.timedelta(days=30))
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
    )


def _ca(cn: str) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    key = _key()
    cert = (
        _builder(cn, key, _name(cn))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True, content_commitment=False, key_encipherment=False,
                data_encipherment=False, key_agreement=False, key_cert_sign=True,
                crl_sign=True, encipher_only=False, decipher_only=False,
            ),
            critical=True,
        )
        .sign(key, hashes.SHA256())
    )
    return cert, key


def _leaf(
    cn: str,
    ca: tuple[x509.Certificate, ec.EllipticCurvePrivateKey],
    usage: list[x509.ObjectIdentifier],
    sans: list[x509.GeneralName] | None = None,
) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    ca_cert, ca_key = ca
    key = _key()
    builder = (
        _builder(cn, key, ca_cert.subject)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True, content_commitment=False, key_encipherment=False,
                data_encipherment=False, key_agreement=False, key_cert_sign=False,
                crl_sign=False, encipher_only=False, decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.ExtendedKeyUsage(usage), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False
        )
    )
    if sans:
        builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    return builder.sign(ca_key, hashes.SHA256()), key


def _write(
    directory: Path, stem: str, pair: tuple[x509.Certificate, ec.EllipticCurvePrivateKey]
) -> tuple[str, str]:
    cert, key = pair
    cert_path, key_path = directory / f"{stem}.pem", directory / f"{stem}-key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    ))
    key_path.chmod(0o600)
    return str(cert_path), str(key_path)


def make_pki(directory: str | Path) -> TestPKI:
    """Generate every certificate the registry variants need and write them into ``directory``."""
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    ca = _ca("pycrid test CA")
    client_ca = _ca("pycrid test client CA")
    server = _leaf(
        "127.0.0.1", ca, [ExtendedKeyUsageOID.SERVER_AUTH],
        [x509.IPAddress(ipaddress.IPv4Address("127.0.0.1")), x509.DNSName("localhost")],
    )
    client = _leaf("pycrid-test-client", client_ca, [ExtendedKeyUsageOID.CLIENT_AUTH])
    # The registry only checks that the token's x5c chain reaches a root in its bundle;
    # any usage is accepted, but say what the key is for.
    token = _leaf("pycrid test token issuer", ca, [ExtendedKeyUsageOID.CODE_SIGNING])
    ca_cert, ca_key = _write(d, "ca", ca)
    client_ca_cert, client_ca_key = _write(d, "client-ca", client_ca)
    server_cert, server_key = _write(d, "server", server)
    client_cert, client_key = _write(d, "client", client)
    token_cert, token_key = _write(d, "token", token)
    return TestPKI(
        ca_cert=ca_cert, ca_key=ca_key,
        server_cert=server_cert, server_key=server_key,
        client_ca_cert=client_ca_cert, client_ca_key=client_ca_key,
        client_cert=client_cert, client_key=client_key,
        token_cert=token_cert, token_key=token_key,
    )
