"""The signature policy in force: which file applies, and the two questions asked of it.

A pull asks ``check_pull`` once the reference is resolved to a digest and before
anything is fetched: the signatures are read from where registries.d says (only when
the scope's requirements look at any), evaluated, and kept with the image when it is
accepted. CreateContainer asks ``check_run`` with the pod namespace's policy: the kept
signatures first (no registry round trip, and a verdict remembered while the policy,
its key files and the signatures stay the same), the registry only when they do not
suffice. Files are re-read when they change (a stat per question); a broken policy
refuses with its error, never falls open. ``<signature_policy_dir>/<namespace>.json``
replaces the global policy for that namespace (CRI-O's ``signature_policy_dir``).
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pycrid.config.images_schema import (
    DEFAULT_POLICY,
    DEFAULT_POLICY_DIR,
    DEFAULT_REGISTRIES_D,
)
from pycrid.errors import InvalidArgument, PycridError, RegistryUnavailable
from pycrid.errors import SignatureValidationFailed as Refused
from pycrid.images.auth import Credentials
from pycrid.images.policy import payload as pl
from pycrid.images.policy import registries_d as rd
from pycrid.images.policy.config import Policy, parse_policy
from pycrid.images.policy.names import Named, parse_named
from pycrid.images.policy.sources import SignatureSource
from pycrid.images.policy.stamps import Stamp, stamp_of
from pycrid.images.policy.verdict import Verdict, needs_signatures
from pycrid.images.reference import Reference, parse_reference
from pycrid.store.signature_records import SignatureStore

if TYPE_CHECKING:
    from pycrid.images.policy.trust import FileTrust

log = logging.getLogger(__name__)

_NAMESPACE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_MAX_POLICY = 4 << 20
_VERDICTS = 4096


@dataclass(frozen=True)
class PolicySettings:
    #: "" turns verification off.
    policy_path: str = DEFAULT_POLICY
    #: When the global file may be missing (the default path): then nothing is verified.
    optional: bool = True
    policy_dir: str = DEFAULT_POLICY_DIR
    registries_d: str = DEFAULT_REGISTRIES_D


def intended(ref: Reference) -> Named:
    """What a policy judges: a reference with both tag and digest is its digest (what was
    pulled; containers/image's docker transport has no such references)."""
    return Named(ref.name, None if ref.digest else ref.tag, ref.digest)


class SignaturePolicy:
    def __init__(self, settings: PolicySettings, source: SignatureSource,
                 store: SignatureStore | None = None, trust: FileTrust | None = None) -> None:
        self.settings = settings
        self.source = source
        self.store = store
        #: Made at the first evaluation: the cryptography behind it costs the daemon about
        #: 9 MiB, which a node without a policy (or with none that checks a signature)
        #: should not pay.
        self.trust = trust
        self._files: dict[str, tuple[Stamp, Policy]] = {}
        self._regd: tuple[tuple[tuple[str, Stamp | None], ...], rd.RegistriesD] | None = None
        self._verdicts: dict[tuple[Any, ...], tuple[Verdict, tuple[tuple[str, Stamp | None],
                                                                   ...]]] = {}

    async def close(self) -> None:
        await self.source.close()

    # ---- which policy ------------------------------------------------------------------

    def policy_for(self, namespace: str = "") -> Policy | None:
        """The policy for pulls of ``namespace`` (None: nothing is verified)."""
        s = self.settings
        if namespace and s.policy_dir and _NAMESPACE.match(namespace):
            path = os.path.join(s.policy_dir, f"{namespace}.json")
            if os.path.exists(path):
                return self._load(path)
        if not s.policy_path or (s.optional and not os.path.exists(s.policy_path)):
            return None
        return self._load(s.policy_path)

    def _load(self, path: str) -> Policy:
        stamp = stamp_of(path)
        hit = self._files.get(path)
        if hit is not None and stamp is not None and hit[0] == stamp:
            return hit[1]
        try:
            with open(path, "rb") as f:
                data = f.read(_MAX_POLICY + 1)
        except OSError as e:
            raise Refused(f"cannot read the signature policy {path}: "
                          f"{e.strerror or e}") from None
        if len(data) > _MAX_POLICY:
            raise Refused(f"the signature policy {path} is larger than {_MAX_POLICY} bytes")
        try:
            policy = parse_policy(data, path)
        except InvalidArgument as e:
            raise Refused(str(e)) from None
        if stamp is not None:
            self._files[path] = (stamp, policy)
        return policy

    def registries(self) -> rd.RegistriesD:
        """registries.d, re-read when a file of it changed (or came or went)."""
        d = self.settings.registries_d
        try:
            paths = rd.yaml_files(d)
            stamps = tuple((p, stamp_of(p)) for p in paths)
            if self._regd is not None and self._regd[0] == stamps:
                return self._regd[1]
            parsed = rd.parse_files(rd.read_files(paths))
        except InvalidArgument as e:
            raise Refused(f"signature storage configuration ({d}): {e}") from None
        self._regd = (stamps, parsed)
        return parsed

    # ---- the questions -----------------------------------------------------------------

    async def check_pull(self, ref: Reference, digest: str, creds: Credentials | None,
                         namespace: str = "") -> list[bytes]:
        """Refuse (SignatureValidationFailed) unless the policy allows ``ref`` at ``digest``;
        the accepted signatures, for ``keep`` once the image is stored (a pull that fails
        later keeps none)."""
        policy = self.policy_for(namespace)
        if policy is None:
            return []
        named = intended(ref)
        sigs: list[pl.Signature] = []
        if needs_signatures(policy, named):
            sigs = await self._fetch(ref, digest, creds)
        verdict = await self._judge(policy, named, digest, sigs)
        if not verdict.allowed:
            raise Refused(_message(ref, digest, verdict))
        return [pl.to_blob(s) for s in sigs]

    def keep(self, digest: str, blobs: list[bytes]) -> None:
        """Keep the signatures a pull of ``digest`` was accepted with, beside its image."""
        if blobs and self.store is not None:
            self.store.put(digest, blobs)

    async def check_run(self, name: str, digest: str, namespace: str,
                        creds: Credentials | None = None) -> None:
        """Refuse unless the policy of ``namespace`` allows the present image of ``digest``
        under ``name``: the kept signatures first, the registry when they do not do."""
        policy = self.policy_for(namespace)
        if policy is None:
            return
        ref = parse_reference(name)
        named = intended(ref)
        signed = named.digest or digest
        kept = self.store.get(digest) if self.store is not None else ()
        sigs = _parsed(kept)
        verdict = await self._judge(policy, named, signed, sigs, kept)
        if not verdict.allowed and needs_signatures(policy, named):
            fresh = await self._fetch(ref, signed, creds)
            if fresh != sigs:
                verdict = await self._judge(policy, named, signed, fresh)
                if verdict.allowed and self.store is not None:
                    self.store.put(digest, [pl.to_blob(s) for s in fresh])
        if not verdict.allowed:
            raise Refused(_message(ref, digest, verdict))

    async def _fetch(self, ref: Reference, digest: str, creds: Credentials | None
                     ) -> list[pl.Signature]:
        try:
            return await self.source.fetch(ref, digest, creds, self.registries())
        except (RegistryUnavailable, Refused):
            raise
        except PycridError as e:
            raise Refused(f"image '{ref}': cannot read its signatures: {e}") from None

    async def _judge(self, policy: Policy, named: Named, digest: str,
                     sigs: Sequence[pl.Signature], kept: tuple[bytes, ...] | None = None
                     ) -> Verdict:
        """The verdict, remembered (when ``kept`` names the signatures) while the policy
        file and every file it read stay the same."""
        key = None
        if kept is not None:
            key = (policy.path, stamp_of(policy.path), str(named), digest, kept)
            hit = self._verdicts.get(key)
            if hit is not None and all(stamp_of(p) == s for p, s in hit[1]):
                return hit[0]
        from pycrid.images.policy.evaluate import evaluate
        if self.trust is None:
            from pycrid.images.policy.trust import FileTrust
            self.trust = FileTrust()
        trust = self.trust.session()
        if not needs_signatures(policy, named):
            # insecureAcceptAnything and reject read no file: nothing for a thread to do.
            return evaluate(policy, named, digest, sigs, trust)
        verdict = await asyncio.to_thread(evaluate, policy, named, digest, sigs, trust)
        if key is not None:
            if len(self._verdicts) >= _VERDICTS:
                self._verdicts.clear()
            self._verdicts[key] = (verdict, tuple((p, stamp_of(p)) for p in trust.reads))
        return verdict

    def forget(self, keep: set[str]) -> None:
        """Drop kept signatures of digests no image has any more."""
        if self.store is not None:
            self.store.prune(keep)

    # ---- what is in force --------------------------------------------------------------

    def describe(self) -> dict[str, object]:
        s = self.settings
        state = "in force"
        if not s.policy_path:
            state = "off (signature_policy is empty): images are not verified"
        elif not os.path.exists(s.policy_path):
            state = ("absent: images are not verified" if s.optional
                     else "missing: every pull is refused")
        else:
            try:
                self._load(s.policy_path)
            except Refused as e:
                state = f"invalid, every pull is refused: {e}"
        try:
            namespaces = sorted(n[:-5] for n in os.listdir(s.policy_dir) if n.endswith(".json"))
        except OSError:
            namespaces = []
        return {"signature_policy": s.policy_path, "state": state,
                "signature_policy_dir": s.policy_dir, "namespaces": namespaces,
                "registries_d": s.registries_d}


def _parsed(blobs: tuple[bytes, ...]) -> list[pl.Signature]:
    out = []
    for b in blobs:
        try:
            out.append(pl.from_blob(b))
        except pl.InvalidSignature:
            continue
    return out


def _message(ref: Reference, digest: str, verdict: Verdict) -> str:
    return (f"image '{ref}' ({digest}) is refused by the signature policy {verdict.policy} "
            f"({verdict.scope_text}): {verdict.reason}")


_IMAGE_ID = re.compile(r"^(sha256:)?[a-f0-9]{64}$")


def check_names(names: Sequence[str]) -> list[str]:
    """The references among ``names``: image ids (``sha256:<hex>``, which would parse as
    a repository named ``sha256``) and empty or malformed names dropped."""
    out = []
    for n in names:
        if not n or _IMAGE_ID.match(n):
            continue
        try:
            parse_named(n)
        except InvalidArgument:
            continue
        out.append(n)
    return out
