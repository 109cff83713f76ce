"""The streaming server's TLS context: the operator's key pair, or a self-signed one
made at start (containerd does the same when ``enable_tls_streaming`` is set without
``x509_key_pair_streaming``); the kubelet and crictl do not verify it."""

from __future__ import annotations

import datetime
import ipaddress
import os
import socket
import ssl

from pycrid.config.decode import ConfigError


def server_context(cert_file: str, key_file: str, *, state_dir: str, address: str,
                   section: str) -> ssl.SSLContext:
    if bool(cert_file) != bool(key_file):
        raise ConfigError(f"{section}.x509_key_pair_streaming",
                          "set both tls_cert_file and tls_key_file, or neither")
    if not cert_file:
        cert_file, key_file = _self_signed(state_dir, address)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        context.load_cert_chain(cert_file, key_file)
    except (OSError, ssl.SSLError) as e:
        raise ConfigError(f"{section}.x509_key_pair_streaming",
                          f"cannot load {cert_file} and {key_file}: {e}") from None
    return context


def _self_signed(state_dir: str, address: str) -> tuple[str, str]:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, socket.gethostname())])
    alt: list[x509.GeneralName] = [x509.DNSName(socket.gethostname())]
    try:
        alt.append(x509.IPAddress(ipaddress.ip_address(address)))
    except ValueError:
        alt.append(x509.DNSName(address))
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=365))
            .add_extension(x509.SubjectAlternativeName(alt), critical=False)
            .sign(key, hashes.SHA256()))
    directory = os.path.join(state_dir, "streaming")
    os.makedirs(directory, mode=0o700, exist_ok=True)
    cert_path, key_path = os.path.join(directory, "tls.crt"), os.path.join(directory, "tls.key")
    fd = os.open(key_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(key.private_bytes(serialization.Encoding.PEM,
                                  serialization.PrivateFormat.PKCS8,
                                  serialization.NoEncryption()))
    with open(cert_path, "wb") as f:
        f.write(cert.public_bytes(serialization.Encoding.PEM))
    return cert_path, key_path
