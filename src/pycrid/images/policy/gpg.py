"""GPG "simple signing" signatures, checked by Debian's ``gpgv``.

containers/image hands the keys of a ``signedBy`` requirement to gpgme, which imports
them into a throw-away GnuPG home and asks ``gpg`` to verify. ``gpgv`` is the part of
GnuPG made for exactly this (verify against a given keyring, trust every key in it, no
agent, no trust database): the keys are written, de-armored, to a keyring in a
temporary directory, and its status lines decide. A signature made by a subkey of a
given key counts as that key's (containers/image looks the primary key up too); an
expired or revoked key, a bad or second signature is refused.
"""

from __future__ import annotations

import base64
import binascii
import os
import shutil
import subprocess
import tempfile
from collections.abc import Sequence

from pycrid.images.policy.crypto_keys import KeyMaterialError
from pycrid.images.policy.payload import InvalidSignature

#: Refusals gpgv reports in its status lines, in words.
_BAD = {"BADSIG": "a bad signature", "ERRSIG": "a signature that cannot be checked",
        "EXPSIG": "an expired signature", "EXPKEYSIG": "a signature by an expired key",
        "REVKEYSIG": "a signature by a revoked key"}
TIMEOUT = 10.0


def dearmor(data: bytes) -> bytes:
    """Binary OpenPGP packets from ``data``: armored blocks decoded, binary kept."""
    if b"-----BEGIN PGP" not in data:
        return data
    out = b""
    for block in data.split(b"-----BEGIN PGP")[1:]:
        lines = block.split(b"\n")[1:]
        while lines and b":" in lines[0]:
            lines.pop(0)  # armor headers (Version:, Comment:)
        body = []
        for line in lines:
            line = line.strip()
            if line.startswith(b"-----END") or line.startswith(b"="):
                break
            body.append(line)
        try:
            out += base64.b64decode(b"".join(body), validate=True)
        except (binascii.Error, ValueError):
            raise KeyMaterialError("an armored OpenPGP block is not valid base64") from None
    return out


def _is_public_key(packets: bytes) -> bool:
    """Whether the first OpenPGP packet is a public key (tag 6, old or new format)."""
    if not packets:
        return False
    first = packets[0]
    if first & 0xC0 == 0xC0:
        return first & 0x3F == 6
    return first & 0x80 == 0x80 and (first >> 2) & 0x0F == 6


def verify(keyrings: Sequence[bytes], blob: bytes, gpgv: str | None = None) -> bytes:
    """The signed plaintext of ``blob`` if one key of ``keyrings`` made it."""
    rings = [dearmor(k) for k in keyrings]
    if not any(_is_public_key(r) for r in rings):
        raise KeyMaterialError("no public keys imported: the key data holds no OpenPGP "
                               "public key")
    binary = gpgv or shutil.which("gpgv")
    if binary is None:
        raise KeyMaterialError("gpgv is not installed: GPG signatures cannot be checked "
                               "(Debian package gpgv)")
    with tempfile.TemporaryDirectory(prefix="pycrid-gpgv-") as tmp:
        ring, sig, out = (os.path.join(tmp, n) for n in ("keys.gpg", "sig", "out"))
        with open(ring, "wb") as f:
            f.write(b"".join(r for r in rings if _is_public_key(r)))
        with open(sig, "wb") as f:
            f.write(blob)
        try:
            proc = subprocess.run(
                [binary, "--homedir", tmp, "--keyring", ring, "--status-fd", "1",
                 "--output", out, sig],
                stdin=subprocess.DEVNULL, capture_output=True, timeout=TIMEOUT, check=False)
        except subprocess.TimeoutExpired:
            raise InvalidSignature(f"gpgv did not finish within {TIMEOUT:g}s") from None
        status = [line.split()[1:] for line in proc.stdout.decode("utf-8", "replace").splitlines()
                  if line.startswith("[GNUPG:] ") and len(line.split()) > 1]
        names = [s[0] for s in status]
        if "NO_PUBKEY" in names:
            key = next(s[1] for s in status if s[0] == "NO_PUBKEY" and len(s) > 1)
            raise InvalidSignature(f"signature by key {key} is not accepted")
        for name, words in _BAD.items():
            if name in names:
                raise InvalidSignature(f"invalid GPG signature: {words}")
        count = names.count("NEWSIG")
        if count != 1:
            raise InvalidSignature(f"unexpected GPG signature count {count}"
                                   + ("" if count else f": {_last_words(proc.stderr)}"))
        if proc.returncode != 0 or "GOODSIG" not in names or "VALIDSIG" not in names:
            raise InvalidSignature(f"invalid GPG signature: {_last_words(proc.stderr)}")
        with open(out, "rb") as f:
            return f.read()


def _last_words(stderr: bytes) -> str:
    lines = [x for x in stderr.decode("utf-8", "replace").splitlines() if x.strip()]
    return lines[-1].removeprefix("gpgv: ") if lines else "gpgv refused it"
