"""Trust material as files: read once per change, and the checks that need them.

Key and CA files named by a policy are read when a requirement is evaluated (so a key
rotated on disk applies to the next pull, as with containers/image, which reads them
each time) but kept while their size, mtime and inode stay the same, so a
CreateContainer check does not re-read them. ``stamps`` tells a cached verdict which
files it depended on.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

from pycrid.images.policy import crypto_keys as ck
from pycrid.images.policy import gpg
from pycrid.images.policy import payload as pl
from pycrid.images.policy.config import Requirement
from pycrid.images.policy.stamps import Stamp, stamp_of

MAX_KEY_FILE = 1 << 20


class FileTrust:
    def __init__(self, gpgv: str | None = None, *, _shared: FileTrust | None = None) -> None:
        self._files: dict[str, tuple[Stamp, bytes]] = (
            _shared._files if _shared is not None else {})
        self._lock: threading.Lock = (
            _shared._lock if _shared is not None else threading.Lock())
        self.gpgv = gpgv
        #: Paths this one read (what a verdict depended on).
        self.reads: set[str] = set()

    def session(self) -> FileTrust:
        """One evaluation's view: the same cache, its own ``reads``."""
        return FileTrust(self.gpgv, _shared=self)

    def read(self, path: str) -> bytes:
        stamp = stamp_of(path)
        self.reads.add(path)
        with self._lock:
            hit = self._files.get(path)
            if hit is not None and stamp is not None and hit[0] == stamp:
                return hit[1]
        with open(path, "rb") as f:
            data = f.read(MAX_KEY_FILE + 1)
        if len(data) > MAX_KEY_FILE:
            raise ck.KeyMaterialError(f"{path} is larger than {MAX_KEY_FILE} bytes: not a key")
        if stamp is not None:
            with self._lock:
                self._files[path] = (stamp, data)
        return data

    def gpg_verify(self, keyrings: Sequence[bytes], blob: bytes) -> bytes:
        return gpg.verify(keyrings, blob, self.gpgv)

    def keyless(self, req: Requirement, sig: pl.Sigstore, b64sig: str) -> ck.PublicKey:
        # Here, not at the top: fulcio and rekor load the cryptography package (about 9 MiB),
        # which a node that verifies no keyless signature need not hold.
        from pycrid.images.policy import fulcio, rekor

        assert req.fulcio is not None
        bundle = sig.annotations.get(pl.BUNDLE_ANNOTATION)
        cert = sig.annotations.get(pl.CERTIFICATE_ANNOTATION)
        if bundle is None:
            raise pl.InvalidSignature(f"missing {pl.BUNDLE_ANNOTATION} annotation")
        if cert is None:
            raise pl.InvalidSignature(f"missing {pl.CERTIFICATE_ANNOTATION} annotation")
        rekor_keys = rekor.load_rekor_keys(
            [self.read(p) for p in req.rekor_keys.paths] + list(req.rekor_keys.datas))
        ca = b"".join([self.read(p) for p in req.fulcio.ca.paths] + list(req.fulcio.ca.datas))
        when = rekor.verify_set(rekor_keys, bundle.encode(), cert.encode(), b64sig, sig.payload)
        chain = sig.annotations.get(pl.CHAIN_ANNOTATION, "").encode()
        return fulcio.verify_fulcio(ca, req.fulcio.oidc_issuer, req.fulcio.subject_email,
                                    cert.encode(), chain, when)
