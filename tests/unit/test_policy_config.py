"""containers-policy.json(5) parsing, scope choice and signed-identity rules, without a
daemon. The rules are containers/image's (signature/policy_config.go,
policy_reference_match.go, docker/policyconfiguration/naming.go); the e2e tests compare
whole verdicts with skopeo's."""

from __future__ import annotations

import base64
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from pycrid.errors import InvalidArgument
from pycrid.images.policy.config import PolicyFormatError, parse_policy
from pycrid.images.policy.names import (
    Identity,
    Named,
    matches,
    parse_canonical,
    parse_named,
    policy_namespaces,
    scope_candidates,
)

ACCEPT = [{"type": "insecureAcceptAnything"}]


def policy(doc: Any) -> Any:
    return parse_policy(json.dumps(doc).encode(), "/etc/containers/policy.json")


def bad(doc: Any, needle: str) -> None:
    with pytest.raises(PolicyFormatError) as e:
        parse_policy(doc if isinstance(doc, bytes) else json.dumps(doc).encode(), "/p.json")
    assert "/p.json" in str(e.value)
    assert needle in str(e.value), str(e.value)


def test_minimal_and_defaults() -> None:
    p = policy({"default": ACCEPT})
    assert p.default[0].type == "insecureAcceptAnything" and not p.docker
    p = policy({"default": [{"type": "reject"}], "transports": {
        "docker": {"quay.io/x": [{"type": "sigstoreSigned", "keyPath": "/k.pub"}]},
        "docker-daemon": {"": ACCEPT}}})
    req = p.docker["quay.io/x"][0]
    assert req.keys.paths == ("/k.pub",)
    assert req.identity == Identity("matchRepoDigestOrExact")
    assert p.other_transports == ("docker-daemon",)


@pytest.mark.parametrize(("doc", "needle"), [
    (b"{", "not valid JSON"),
    (b'{"default": [], "default": []}', "duplicate key 'default'"),
    ({}, "key 'default' missing"),
    ({"default": ACCEPT, "extra": 1}, "unknown key 'extra'"),
    ({"default": []}, "must not be empty"),
    ({"default": [{"type": "acceptAll"}]}, "unknown policy requirement type 'acceptAll'"),
    ({"default": [{"type": "reject", "keyPath": "/x"}]}, "default[0]: unknown key 'keyPath'"),
    ({"default": [{"type": "signedBy", "keyType": "GPGKeys"}]}, "exactly one of keyPath"),
    ({"default": [{"type": "signedBy", "keyType": "PGP", "keyPath": "/k"}]},
     "unrecognized keyType"),
    ({"default": [{"type": "signedBy", "keyType": "GPGKeys", "keyPath": "/k",
                   "keyData": "AA=="}]}, "only one of"),
    ({"default": [{"type": "signedBy", "keyType": "GPGKeys", "keyData": "%%%"}]},
     "not valid base64"),
    ({"default": [{"type": "sigstoreSigned"}]}, "exactly one of keyPath"),
    ({"default": [{"type": "sigstoreSigned", "keyPath": "/k", "keyPaths": ["/j"]}]},
     "only one of"),
    ({"default": [{"type": "sigstoreSigned", "keyPaths": []}]}, "contains no entries"),
    ({"default": [{"type": "sigstoreSigned", "keyPath": "/k", "keyPat": "/j"}]},
     "unknown key 'keyPat'"),
    ({"default": [{"type": "sigstoreSigned", "fulcio": {"caPath": "/ca", "oidcIssuer": "i",
                                                         "subjectEmail": "e"}}]},
     "fulcio needs one of rekorPublicKeyPath"),
    ({"default": [{"type": "sigstoreSigned", "rekorPublicKeyPath": "/r",
                   "fulcio": {"caPath": "/ca", "subjectEmail": "e"}}]}, "oidcIssuer"),
    ({"default": [{"type": "sigstoreSigned", "rekorPublicKeyPath": "/r",
                   "fulcio": {"caPath": "/ca", "oidcIssuer": "i", "subjectEmail": "e",
                              "x": 1}}]}, "fulcio: unknown key 'x'"),
    ({"default": [{"type": "sigstoreSigned", "keyPath": "/k",
                   "signedIdentity": {"type": "matchAnything"}}]},
     "unknown policy reference match type"),
    ({"default": [{"type": "sigstoreSigned", "keyPath": "/k",
                   "signedIdentity": {"type": "exactReference",
                                      "dockerReference": "quay.io/x"}}]},
     "neither a tag nor a digest"),
    ({"default": [{"type": "sigstoreSigned", "keyPath": "/k",
                   "signedIdentity": {"type": "exactRepository"}}]}, "dockerRepository"),
    ({"default": [{"type": "sigstoreSigned", "keyPath": "/k",
                   "signedIdentity": {"type": "remapIdentity", "prefix": "Not/Valid!",
                                      "signedPrefix": "quay.io"}}]}, "is not valid"),
    ({"default": [{"type": "sigstoreSigned", "keyPath": "/k",
                   "signedIdentity": {"type": "matchExact", "dockerReference": "a:b"}}]},
     "unknown key 'dockerReference'"),
    ({"default": ACCEPT, "transports": {"docker": {"x": "reject"}}},
     'transports.docker["x"]: a list of requirements expected'),
    ({"default": ACCEPT, "transports": {"docker": []}}, "transports.docker: a JSON object"),
    ({"default": [{"type": "signedBy", "keyType": "GPGKeys", "keyPath": 3}]},
     "keyPath: a string expected"),
])
def test_invalid_policies_name_the_file_and_the_key(doc: Any, needle: str) -> None:
    bad(doc, needle)


def test_inline_key_data_is_base64() -> None:
    data = base64.b64encode(b"-----BEGIN PUBLIC KEY-----").decode()
    p = policy({"default": [{"type": "sigstoreSigned", "keyDatas": [data, data]}]})
    assert p.default[0].keys.datas == (b"-----BEGIN PUBLIC KEY-----",) * 2


def test_namespaces_of_a_name() -> None:
    assert policy_namespaces("quay.io/ns/sub/repo") == [
        "quay.io/ns/sub/repo", "quay.io/ns/sub", "quay.io/ns", "quay.io", "*.io"]
    assert policy_namespaces("a.b.example.com:5000/r") == [
        "a.b.example.com:5000/r", "a.b.example.com:5000", "*.b.example.com", "*.example.com",
        "*.com"]
    assert policy_namespaces("localhost/r") == ["localhost/r", "localhost"]


def test_most_specific_scope_wins() -> None:
    reqs = {s: [{"type": "reject"}] for s in [
        "quay.io/ns/repo:v1", "quay.io/ns/repo", "quay.io/ns", "quay.io", "*.io", ""]}
    p = policy({"default": ACCEPT, "transports": {"docker": reqs}})
    order = ["quay.io/ns/repo:v1", "quay.io/ns/repo", "quay.io/ns", "quay.io", "*.io", ""]
    ref = parse_named("quay.io/ns/repo:v1")
    for scope in order:
        assert p.requirements_for(ref)[0] == scope
        del p.docker[scope]  # type: ignore[attr-defined]
    assert p.requirements_for(ref)[0] is None  # default
    digest = "sha256:" + "a" * 64
    assert scope_candidates(parse_named(f"quay.io/r@{digest}"))[0] == f"quay.io/r@{digest}"


def test_scopes_compare_normalised_names() -> None:
    # A scope is compared as written: docker.io/busybox never matches library images.
    p = policy({"default": ACCEPT, "transports": {"docker": {
        "docker.io/busybox": [{"type": "reject"}],
        "docker.io/library/busybox": [{"type": "reject"}]}}})
    assert p.requirements_for(parse_named("busybox:1"))[0] == "docker.io/library/busybox"


def test_parse_named_keeps_no_tag() -> None:
    assert parse_named("busybox") == Named("docker.io/library/busybox")
    assert parse_named("busybox").name_only
    assert parse_named("q.io/a:1").tag == "1"
    assert parse_canonical("docker.io/library/busybox:1").tag == "1"
    with pytest.raises(InvalidArgument):
        parse_canonical("busybox:1")


D = "sha256:" + "b" * 64
TAGGED = parse_named("quay.io/ns/app:v1")
DIGESTED = parse_named(f"quay.io/ns/app@{D}")


@pytest.mark.parametrize(("identity", "intended", "signed", "ok"), [
    (Identity("matchExact"), TAGGED, "quay.io/ns/app:v1", True),
    (Identity("matchExact"), TAGGED, "quay.io/ns/app:v2", False),
    (Identity("matchExact"), DIGESTED, f"quay.io/ns/app@{D}", True),
    (Identity("matchExact"), DIGESTED, "quay.io/ns/app:v1", False),
    (Identity("matchExact"), TAGGED, "quay.io/ns/app", False),
    (Identity("matchRepoDigestOrExact"), TAGGED, "quay.io/ns/app:v1", True),
    (Identity("matchRepoDigestOrExact"), TAGGED, "quay.io/ns/app:v2", False),
    (Identity("matchRepoDigestOrExact"), DIGESTED, "quay.io/ns/app:anything", True),
    (Identity("matchRepoDigestOrExact"), DIGESTED, "quay.io/ns/other:v1", False),
    (Identity("matchRepoDigestOrExact"), DIGESTED, "quay.io/ns/app", False),
    (Identity("matchRepository"), TAGGED, "quay.io/ns/app:v9", True),
    (Identity("matchRepository"), TAGGED, "quay.io/ns/app", True),
    (Identity("matchRepository"), TAGGED, "quay.io/ns/other:v1", False),
    (Identity("exactReference", "quay.io/ns/signed:v1"), TAGGED, "quay.io/ns/signed:v1", True),
    (Identity("exactReference", "quay.io/ns/signed:v1"), TAGGED, "quay.io/ns/app:v1", False),
    (Identity("exactRepository", "quay.io/ns/signed"), TAGGED, "quay.io/ns/signed:v7", True),
    (Identity("exactRepository", "quay.io/ns/signed"), TAGGED, "quay.io/ns/app:v1", False),
    (Identity("remapIdentity", "mirror.local/ns", "quay.io/ns"),
     parse_named("mirror.local/ns/app:v1"), "quay.io/ns/app:v1", True),
    (Identity("remapIdentity", "mirror.local/ns", "quay.io/ns"),
     parse_named("mirror.local/ns/app:v1"), "mirror.local/ns/app:v1", False),
    (Identity("remapIdentity", "mirror.local/n", "quay.io/ns"),
     parse_named("mirror.local/ns/app:v1"), "mirror.local/ns/app:v1", True),  # not a prefix
    (Identity("remapIdentity", "mirror.local", "quay.io"),
     parse_named(f"mirror.local/ns/app@{D}"), "quay.io/ns/app:v3", True),
    (Identity("matchExact"), TAGGED, "Not A Reference", False),
    (Identity("matchRepoDigestOrExact"), parse_named("busybox:1"), "busybox:1", True),
])
def test_signed_identity(identity: Identity, intended: Named, signed: str, ok: bool) -> None:
    assert matches(identity, intended, signed) is ok


def test_names_a_container_is_checked_under() -> None:
    from pycrid.images.policy.enforcer import check_names, intended
    from pycrid.images.reference import parse_reference

    digest = "sha256:" + "f" * 64
    # Image ids are not names (sha256:<hex> would parse as a repository "sha256").
    assert check_names(["", digest, "f" * 64, "Bad Name", "busybox:1"]) == ["busybox:1"]
    both = parse_reference(f"q.io/app:v1@{digest}")
    assert intended(both) == Named("q.io/app", None, digest)
    assert intended(parse_reference("q.io/app")) == Named("q.io/app", "latest", None)


_NO_CRYPTO = """
import asyncio, sys
from pycrid.images.policy.enforcer import PolicySettings, SignaturePolicy
from pycrid.images.reference import parse_reference
import pycrid.builtins, pycrid.images.image_service

class Source:
    async def fetch(self, *a):
        raise AssertionError("insecureAcceptAnything reads no signature")

open(sys.argv[1], "w").write('{"default": [{"type": "insecureAcceptAnything"}]}')
p = SignaturePolicy(PolicySettings(policy_path=sys.argv[1], optional=False), Source())
asyncio.run(p.check_pull(parse_reference("example.com/a:1"), "sha256:" + "a" * 64, None))
print(sorted(m for m in sys.modules if m.split(".")[0] == "cryptography"))
"""


def test_no_cryptography_until_a_signature_is_checked(tmp_path: Path) -> None:
    # A fresh interpreter (this one has loaded it elsewhere): the cryptography behind the
    # checks costs the daemon about 9 MiB, paid only when a signature is checked.
    out = subprocess.run([sys.executable, "-c", _NO_CRYPTO, str(tmp_path / "policy.json")],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "[]"
