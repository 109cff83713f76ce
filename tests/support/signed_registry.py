"""A local registry with signed images, made by the real signers, for verdict tests.

- sigstore: upstream skopeo 1.22 (``../shared/interop/bin/skopeo``) makes two key pairs
  and copies busybox to ``signed/app:v1`` (key A), ``signed/other:v1`` (key B),
  ``signed/app:retag`` (key A, identity ``signed/app:v1``), then copies ``signed/app:v1``
  with its signature to ``mirror/app:v1``; attachments ``sha256-<hex>.sig`` beside them.
- GPG: Debian's skopeo 1.9.3 (gpgme) signs ``gpg/app:v1`` with an RSA key into a
  ``file://`` lookaside (upstream skopeo verifies RSA keys only).
- keyless: ``keyless/app:v1`` gets an attachment made here with a test Fulcio CA and Rekor
  key (tests/support/signing.py): no real Fulcio is reachable, but both verifiers read it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from pycrid.images.policy import payload as pl
from tests.support.images import digest_of, load_standard_set
from tests.support.registry import LocalRegistry
from tests.support.signing import Fulcio, GnuPG, SigstoreKey

EMAIL = "dev@example.com"
ISSUER = "https://issuer.example"


@dataclass
class SignedRegistry:
    reg: LocalRegistry
    dir: Path
    skopeo: Path
    #: registries.d with use-sigstore-attachments and the lookaside, for every verifier.
    registries_d: Path
    key_a: Path
    key_b: Path
    gpg_key: Path
    gpg_other: Path
    fulcio_ca: Path
    rekor_key: Path
    #: The manifest digest every copy of busybox has.
    digest: str

    @property
    def host(self) -> str:
        return self.reg.host

    def ref(self, path: str) -> str:
        return f"{self.reg.host}/{path}"

    def skopeo_allows(self, policy: Path, ref: str, out: Path) -> tuple[bool, str]:
        """upstream skopeo's verdict: ``copy docker://REF dir:OUT`` under ``policy``."""
        shutil.rmtree(out, ignore_errors=True)
        proc = subprocess.run(
            [str(self.skopeo), "--policy", str(policy), "--registries.d",
             str(self.registries_d), "copy", "--src-tls-verify=false", f"docker://{ref}",
             f"dir:{out}"], capture_output=True, text=True, timeout=120,
            env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(self.dir)})
        shutil.rmtree(out, ignore_errors=True)
        return proc.returncode == 0, proc.stderr.strip().splitlines()[-1:][0] if (
            proc.stderr.strip()) else ""


def _run(argv: list[str], **kw: object) -> None:
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=300, **kw)  # type: ignore[call-overload]
    if proc.returncode != 0:
        raise AssertionError(f"{argv[0]} failed: {proc.stderr[-2000:]}")


def make(base: Path, skopeo: Path, debian_skopeo: str) -> SignedRegistry:
    """Start a registry under ``base`` and sign into it (see the module)."""
    base.mkdir(parents=True, exist_ok=True)
    reg = LocalRegistry(base / "registry")
    reg.start()
    load_standard_set(reg)
    h = reg.host
    look = base / "lookaside"
    look.mkdir()
    rd = base / "registries.d"
    rd.mkdir()
    (rd / "default.yaml").write_text(
        f"default-docker:\n  use-sigstore-attachments: true\n  lookaside: file://{look}\n"
        f"  sigstore: file://{look}\n  sigstore-staging: file://{look}\n")
    accept = base / "accept.json"
    accept.write_text('{"default": [{"type": "insecureAcceptAnything"}]}')
    (base / "pass").write_text("secret\n")
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(base)}
    for k in ("a", "b"):
        _run([str(skopeo), "generate-sigstore-key", "--output-prefix", str(base / k),
              "--passphrase-file", str(base / "pass")], env=env)

    def copy(src: str, dst: str, *extra: str, tool: str = str(skopeo),
             environ: dict[str, str] = env) -> None:
        _run([tool, "--policy", str(accept), "--registries.d", str(rd), "copy",
              "--src-tls-verify=false", "--dest-tls-verify=false", *extra,
              f"docker://{h}/{src}", f"docker://{h}/{dst}"], env=environ)

    sign = ["--sign-passphrase-file", str(base / "pass"), "--sign-by-sigstore-private-key"]
    copy("busybox:latest", "signed/app:v1", *sign, str(base / "a.private"))
    copy("busybox:latest", "signed/other:v1", *sign, str(base / "b.private"))
    copy("busybox:latest", "signed/app:retag", *sign, str(base / "a.private"),
         "--sign-identity", f"{h}/signed/app:v1")
    copy("signed/app:v1", "mirror/app:v1")
    copy("busybox:latest", "keyless/app:v1")

    signer = GnuPG(base / "gnupg", "signer <signer@example.com>", "rsa2048")
    (base / "gpg.pub").write_bytes(signer.public_key(armor=True))
    other = GnuPG(base / "gnupg-other", "other <other@example.com>", "rsa2048")
    (base / "gpg-other.pub").write_bytes(other.public_key(armor=True))
    try:
        copy("busybox:latest", "gpg/app:v1", "--sign-by", signer.fingerprint,
             tool=debian_skopeo, environ={**env, "GNUPGHOME": str(signer.home)})
    finally:
        signer.close()
        other.close()

    manifest = reg.client(None).request("GET", "/v2/busybox/manifests/latest", headers={
        "Accept": "application/vnd.oci.image.manifest.v1+json"})
    digest = manifest.headers["docker-content-digest"]
    fulcio, rekor, key = Fulcio.new(), SigstoreKey.new(), SigstoreKey.new()
    (base / "fulcio.pem").write_bytes(fulcio.root_pem)
    (base / "rekor.pub").write_bytes(rekor.public_pem)
    push_attachment(reg, "keyless/app", digest, [
        fulcio.signature(key, rekor, digest, f"{h}/keyless/app:v1", email=EMAIL, issuer=ISSUER)])
    return SignedRegistry(reg, base, skopeo, rd, base / "a.pub", base / "b.pub",
                          base / "gpg.pub", base / "gpg-other.pub", base / "fulcio.pem",
                          base / "rekor.pub", digest)


def push_attachment(reg: LocalRegistry, repo: str, digest: str, sigs: list[pl.Sigstore],
                    *, media_type: str = "application/vnd.oci.image.manifest.v1+json") -> None:
    """A cosign-style ``sha256-<hex>.sig`` manifest with ``sigs`` as its layers."""
    client = reg.client(None)
    config = b"{}"
    blobs = [config, *(s.payload for s in sigs)]
    for blob in blobs:
        start = client.request("POST", f"/v2/{repo}/blobs/uploads/")
        loc = start.headers["location"]
        loc = loc[loc.index("/v2/"):]
        sep = "&" if "?" in loc else "?"
        client.request("PUT", f"{loc}{sep}digest={digest_of(blob)}", body=blob,
                       headers={"Content-Type": "application/octet-stream"})
    manifest = {"schemaVersion": 2, "mediaType": media_type, "config": {
        "mediaType": "application/vnd.oci.image.config.v1+json", "digest": digest_of(config),
        "size": len(config)}, "layers": [
        {"mediaType": s.mime_type, "digest": digest_of(s.payload), "size": len(s.payload),
         "annotations": s.annotations} for s in sigs]}
    tag = digest.replace(":", "-") + ".sig"
    resp = client.request("PUT", f"/v2/{repo}/manifests/{tag}",
                          body=json.dumps(manifest).encode(),
                          headers={"Content-Type": media_type})
    assert resp.status == 201, resp.body
