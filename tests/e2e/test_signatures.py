"""Image signature verification against the real signer and the real verifier.

Every case of the table is judged twice, by pycrid (a pull through its CRI socket) and
by upstream skopeo 1.22 (``skopeo --policy P --registries.d D copy docker://REF
dir:OUT``, containers/image: what CRI-O verifies with), with the same policy.json and
registries.d, and the two verdicts must be equal (and equal to what the case expects).
Signatures are made by skopeo itself (sigstore keys; Debian's skopeo for GPG) and, for
keyless, with a test Fulcio CA and Rekor key (tests/support/signed_registry.py).
Then: a refused pull leaves nothing, errors are UNKNOWN with the kubelet's names,
per-namespace policies at pull and at CreateContainer, bad input.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from cri_api.v1 import api_pb2 as pb

from tests.support import interop
from tests.support.daemon import Daemon, running_daemon
from tests.support.pods import Pods, pod_config
from tests.support.signed_registry import EMAIL, ISSUER, SignedRegistry, make

pytestmark = pytest.mark.e2e

DEBIAN_SKOPEO = "/usr/bin/skopeo"


@pytest.fixture(scope="module")
def signed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SignedRegistry]:
    skopeo = interop.require("skopeo")
    if not os.path.exists(DEBIAN_SKOPEO) or shutil.which("gpg") is None:
        pytest.skip("Debian's skopeo and gpg sign GPG test images (scripts/setup.sh test "
                    "installs them)")
    s = make(tmp_path_factory.mktemp("signed"), skopeo, DEBIAN_SKOPEO)
    try:
        yield s
    finally:
        s.reg.stop()


@pytest.fixture(scope="module")
def node(signed: SignedRegistry, tmp_path_factory: pytest.TempPathFactory
         ) -> Iterator[Daemon]:
    base = tmp_path_factory.mktemp("sig-node")
    policy = base / "policy.json"
    policy.write_text('{"default": [{"type": "insecureAcceptAnything"}]}')
    (base / "policies").mkdir()
    certs = signed.reg.hosts_dir(base / "certs.d")
    config = ("version = 2\n[plugins.\"pycrid.cri.v1.images\"]\n"
              f'sandbox_image = "{signed.ref("pause:3.10")}"\n'
              f'signature_policy = "{policy}"\n'
              f'signature_policy_dir = "{base / "policies"}"\n'
              f'registries_d = "{signed.registries_d}"\n'
              "[plugins.\"pycrid.cri.v1.images\".registry]\n"
              f'config_path = "{certs}"\n')
    with running_daemon(str(base), config) as d:
        d.extra["policy"] = str(policy)
        d.extra["policies"] = str(base / "policies")
        yield d


def sigstore(key: Path, **extra: Any) -> dict[str, Any]:
    return {"type": "sigstoreSigned", "keyPath": str(key), **extra}


def scoped(scope: str, reqs: list[dict[str, Any]], default: str = "insecureAcceptAnything"
           ) -> dict[str, Any]:
    return {"default": [{"type": default}], "transports": {"docker": {scope: reqs}}}


Case = tuple[str, str, Callable[[SignedRegistry], dict[str, Any]], bool]


def _identity(kind: str, **kw: str) -> Callable[[SignedRegistry], dict[str, Any]]:
    def doc(s: SignedRegistry) -> dict[str, Any]:
        ident = {"type": kind, **{k: v.replace("H/", f"{s.host}/") for k, v in kw.items()}}
        return scoped(f"{s.host}/signed", [sigstore(s.key_a, signedIdentity=ident)], "reject")
    return doc


# (case, image path in the signed registry ("@D": its digest), policy, expected verdict)
CASES: list[Case] = [
    ("insecureAcceptAnything, unsigned", "busybox:latest",
     lambda s: {"default": [{"type": "insecureAcceptAnything"}]}, True),
    ("reject (default)", "busybox:latest", lambda s: {"default": [{"type": "reject"}]}, False),
    ("right key, repository scope", "signed/app:v1",
     lambda s: scoped(f"{s.host}/signed/app", [sigstore(s.key_a)], "reject"), True),
    ("other key, namespace scope", "signed/other:v1",
     lambda s: scoped(f"{s.host}/signed", [sigstore(s.key_a)]), False),
    ("no signature, host scope", "busybox:latest",
     lambda s: scoped(s.host, [sigstore(s.key_a)]), False),
    ("no signature, *.0.0.1 wildcard scope", "busybox:latest",
     lambda s: scoped("*.0.0.1", [sigstore(s.key_a)]), False),
    ("right key, *.0.0.1 wildcard scope", "signed/app:v1",
     lambda s: scoped("*.0.0.1", [sigstore(s.key_a)]), True),
    ("full-reference scope (reject) applies", "signed/app:v1",
     lambda s: scoped(f"{s.host}/signed/app:v1", [{"type": "reject"}]), False),
    ("full-reference scope, another tag: default", "signed/app:retag",
     lambda s: scoped(f"{s.host}/signed/app:v1", [{"type": "reject"}]), True),
    ("digest scope (reject) applies", "signed/app@D",
     lambda s: scoped(f"{s.host}/signed/app@{s.digest}", [{"type": "reject"}]), False),
    ("by digest, matchRepoDigestOrExact", "signed/app@D",
     lambda s: scoped(f"{s.host}/signed", [sigstore(s.key_a)], "reject"), True),
    ("identity of another tag, matchRepoDigestOrExact", "signed/app:retag",
     _identity("matchRepoDigestOrExact"), False),
    ("identity of another tag, matchExact", "signed/app:retag", _identity("matchExact"), False),
    ("right identity, matchExact", "signed/app:v1", _identity("matchExact"), True),
    ("identity of another tag, matchRepository", "signed/app:retag",
     _identity("matchRepository"), True),
    ("identity of another tag, exactReference (it)", "signed/app:retag",
     _identity("exactReference", dockerReference="H/signed/app:v1"), True),
    ("identity of another tag, exactReference (v2)", "signed/app:retag",
     _identity("exactReference", dockerReference="H/signed/app:v2"), False),
    ("exactRepository (it)", "signed/app:retag",
     _identity("exactRepository", dockerRepository="H/signed/app"), True),
    ("exactRepository (another)", "signed/app:retag",
     _identity("exactRepository", dockerRepository="H/signed/elsewhere"), False),
    ("mirror, remapIdentity", "mirror/app:v1", lambda s: scoped(
        f"{s.host}/mirror", [sigstore(s.key_a, signedIdentity={
            "type": "remapIdentity", "prefix": f"{s.host}/mirror",
            "signedPrefix": f"{s.host}/signed"})], "reject"), True),
    ("mirror, default identity", "mirror/app:v1",
     lambda s: scoped(f"{s.host}/mirror", [sigstore(s.key_a)], "reject"), False),
    ("every requirement must hold", "signed/app:v1",
     lambda s: scoped(f"{s.host}/signed", [sigstore(s.key_a), {"type": "reject"}]), False),
    ("GPG, right key", "gpg/app:v1", lambda s: scoped(f"{s.host}/gpg", [{
        "type": "signedBy", "keyType": "GPGKeys", "keyPath": str(s.gpg_key)}], "reject"), True),
    ("GPG, other key", "gpg/app:v1", lambda s: scoped(f"{s.host}/gpg", [{
        "type": "signedBy", "keyType": "GPGKeys", "keyPath": str(s.gpg_other)}]), False),
    ("GPG required, sigstore signature only", "signed/app:v1", lambda s: scoped(
        s.host, [{"type": "signedBy", "keyType": "GPGKeys", "keyPath": str(s.gpg_key)}]),
     False),
    ("sigstore required, GPG signature only", "gpg/app:v1",
     lambda s: scoped(s.host, [sigstore(s.key_a)]), False),
    ("keyless, right identity", "keyless/app:v1", lambda s: scoped(s.host, [{
        "type": "sigstoreSigned", "rekorPublicKeyPath": str(s.rekor_key), "fulcio": {
            "caPath": str(s.fulcio_ca), "oidcIssuer": ISSUER, "subjectEmail": EMAIL}}]), True),
    ("keyless, another e-mail", "keyless/app:v1", lambda s: scoped(s.host, [{
        "type": "sigstoreSigned", "rekorPublicKeyPath": str(s.rekor_key), "fulcio": {
            "caPath": str(s.fulcio_ca), "oidcIssuer": ISSUER,
            "subjectEmail": "eve@example.com"}}]), False),
    ("keyless, another issuer", "keyless/app:v1", lambda s: scoped(s.host, [{
        "type": "sigstoreSigned", "rekorPublicKeyPath": str(s.rekor_key), "fulcio": {
            "caPath": str(s.fulcio_ca), "oidcIssuer": "https://other.example",
            "subjectEmail": EMAIL}}]), False),
    ("keyless, another Rekor key", "keyless/app:v1", lambda s: scoped(s.host, [{
        "type": "sigstoreSigned", "rekorPublicKeyPath": str(s.key_b), "fulcio": {
            "caPath": str(s.fulcio_ca), "oidcIssuer": ISSUER, "subjectEmail": EMAIL}}]), False),
]


def pycrid_allows(d: Daemon, ref: str, namespace: str = "") -> tuple[bool, str]:
    req = pb.PullImageRequest(image=pb.ImageSpec(image=ref))
    if namespace:
        req.sandbox_config.metadata.namespace = namespace
    try:
        d.client.images.PullImage(req, timeout=120)
        return True, ""
    except grpc.RpcError as e:
        assert e.code() == grpc.StatusCode.UNKNOWN, (e.code(), e.details())
        assert (e.details() or "").startswith("SignatureValidationFailed: "), e.details()
        return False, e.details() or ""


def clear(d: Daemon) -> None:
    for img in d.client.list():
        d.client.remove(img.id)


def test_verdicts_equal_skopeo(signed: SignedRegistry, node: Daemon, tmp_path: Path) -> None:
    rows, wrong = [], []
    policy = Path(node.extra["policy"])
    for name, path, doc, expected in CASES:
        ref = signed.ref(path.replace("@D", f"@{signed.digest}"))
        policy.write_text(json.dumps(doc(signed)))
        theirs, their_why = signed.skopeo_allows(policy, ref, tmp_path / "out")
        ours, our_why = pycrid_allows(node, ref)
        clear(node)
        rows.append(f"| {name} | `{path}` | {'allow' if ours else 'refuse'} | "
                    f"{'allow' if theirs else 'refuse'} |")
        if not (ours == theirs == expected):
            wrong.append(f"{name}: pycrid {ours} ({our_why}), skopeo {theirs} ({their_why}), "
                         f"expected {expected}")
    print("\n| case | image | pycrid | skopeo |\n|---|---|---|---|\n" + "\n".join(rows))
    assert not wrong, "\n".join(wrong)


def test_refused_pull_leaves_nothing_and_says_why(signed: SignedRegistry, node: Daemon) -> None:
    policy = Path(node.extra["policy"])
    policy.write_text(json.dumps(scoped(signed.host, [sigstore(signed.key_a)])))
    ok, why = pycrid_allows(node, signed.ref("signed/other:v1"))
    assert not ok
    assert signed.ref("signed/other:v1") in why and str(policy) in why
    assert f'transports.docker["{signed.host}"]' in why
    assert "verification failed" in why
    ok, why = pycrid_allows(node, signed.ref("busybox:1.36"))
    assert not ok and "no signature exists" in why
    assert node.client.list() == []
    blobs = os.path.join(node.root, "content", "blobs", "sha256")
    assert not os.path.isdir(blobs) or os.listdir(blobs) == []
    snaps = os.path.join(node.root, "snapshots", "overlayfs", "snapshots")
    assert not os.path.isdir(snaps) or os.listdir(snaps) == []


def test_broken_policy_refuses_and_is_reread(signed: SignedRegistry, node: Daemon) -> None:
    policy = Path(node.extra["policy"])
    policy.write_text('{"default": [{"type": "insecureAcceptAnything"}], "defualt": []}')
    ok, why = pycrid_allows(node, signed.ref("busybox:latest"))
    assert not ok and str(policy) in why and "unknown key 'defualt'" in why
    policy.write_text('{"default": [{"type": "insecureAcceptAnything"}')
    ok, why = pycrid_allows(node, signed.ref("busybox:latest"))
    assert not ok and "not valid JSON" in why
    policy.write_text('{"default": [{"type": "insecureAcceptAnything"}]}')
    assert pycrid_allows(node, signed.ref("busybox:latest"))[0]
    clear(node)


def test_namespace_policy_at_pull_and_at_create(signed: SignedRegistry, node: Daemon) -> None:
    """``<signature_policy_dir>/<namespace>.json`` replaces the global policy for pulls of
    that namespace; an image already present runs in that namespace only if that policy
    accepts it (checked with the signatures kept from the pull, CRI-O's create check)."""
    policy = Path(node.extra["policy"])
    policy.write_text('{"default": [{"type": "insecureAcceptAnything"}]}')
    strict = Path(node.extra["policies"]) / "strict.json"
    strict.write_text(json.dumps(scoped(signed.host, [sigstore(signed.key_a)], "reject")))
    unsigned, good = signed.ref("busybox:latest"), signed.ref("signed/app:v1")
    try:
        assert not pycrid_allows(node, unsigned, "strict")[0]
        assert pycrid_allows(node, unsigned, "relaxed")[0]  # the global policy
        assert pycrid_allows(node, good, "strict")[0]
        pods = Pods(node.client)
        for ns, image, ok in [("strict", unsigned, False), ("strict", good, True),
                              ("relaxed", unsigned, True)]:
            cfg = pod_config(namespace=ns)
            sid = pods.run(cfg)
            try:
                ctr = pb.ContainerConfig(
                    metadata=pb.ContainerMetadata(name="c"),
                    image=pb.ImageSpec(image=node.client.status(image).image.id,
                                       user_specified_image=image),
                    command=["sleep", "60"])
                if ok:
                    pods.create(sid, ctr, cfg)
                else:
                    with pytest.raises(grpc.RpcError) as e:
                        pods.create(sid, ctr, cfg)
                    assert e.value.code() == grpc.StatusCode.UNKNOWN
                    assert (e.value.details() or "").startswith("SignatureValidationFailed: ")
                    assert str(strict) in (e.value.details() or "")
            finally:
                pods.stop_pod(sid)
                pods.remove_pod(sid)
    finally:
        strict.unlink()
        clear(node)


def test_bad_signatures_are_refused_clearly(signed: SignedRegistry, node: Daemon,
                                            tmp_path: Path) -> None:
    from pycrid.images.policy import payload as pl
    from tests.support.signed_registry import push_attachment
    from tests.support.signing import SigstoreKey

    policy = Path(node.extra["policy"])
    policy.write_text(json.dumps(scoped(f"{signed.host}/bad", [sigstore(signed.key_a)])))
    key = SigstoreKey.new()
    node.client.pull(signed.ref("busybox:latest"))  # the image blobs to copy
    push = signed.reg.client(None)
    man = push.request("GET", "/v2/busybox/manifests/latest",
                       headers={"Accept": "application/vnd.oci.image.manifest.v1+json"})
    clear(node)
    cases = {
        "corrupt": [pl.Sigstore(pl.SIGSTORE_MIME, b"\x00garbage", {
            pl.SIGNATURE_ANNOTATION: "bm90IGEgc2lnbmF0dXJl"})],
        "another-digest": [key.signature("sha256:" + "e" * 64, signed.ref("bad/x:v1"))],
    }
    for repo, sigs in cases.items():
        _copy_manifest(push, "busybox", f"bad/{repo}", man.body)
        push_attachment(signed.reg, f"bad/{repo}", signed.digest, sigs)
        ok, why = pycrid_allows(node, signed.ref(f"bad/{repo}:v1"))
        theirs, _ = signed.skopeo_allows(policy, signed.ref(f"bad/{repo}:v1"), tmp_path / "o")
        assert not ok and not theirs, why
    assert node.client.list() == []


def _copy_manifest(client: Any, src: str, dst: str, body: bytes) -> None:
    doc = json.loads(body)
    for desc in [doc["config"], *doc["layers"]]:
        r = client.request("POST", f"/v2/{dst}/blobs/uploads/?mount={desc['digest']}&from={src}")
        assert r.status in (201, 202), r.status
    r = client.request("PUT", f"/v2/{dst}/manifests/v1", body=body,
                       headers={"Content-Type": doc["mediaType"]})
    assert r.status == 201


def static_pod(name: str, image: str) -> str:
    return f"""apiVersion: v1
kind: Pod
metadata: {{name: {name}, namespace: default}}
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - name: app
    image: {image}
    imagePullPolicy: Always
    command: ["sleep", "3600"]
"""


def test_kubelet_shows_the_reasons(signed: SignedRegistry, node: Daemon,
                                   tmp_path: Path) -> None:
    """The real kubelet (standalone, static pods): a pod whose image the policy refuses
    waits with reason SignatureValidationFailed, one from an unreachable registry with
    RegistryUnavailable (the kubelet reads both names only from UNKNOWN answers)."""
    from tests.e2e.test_kubelet import remove_pods
    from tests.support.kubelet import running_kubelet
    from tests.support.pods import wait_for

    kubelet = interop.require("kubelet")
    policy = Path(node.extra["policy"])
    policy.write_text(json.dumps({"default": [{"type": "insecureAcceptAnything"}],
                                  "transports": {"docker": {
                                      signed.host: [sigstore(signed.key_a)],
                                      f"{signed.host}/pause": [
                                          {"type": "insecureAcceptAnything"}]}}}))
    seen: dict[str, set[str]] = {"unsigned": set(), "unreachable": set()}
    pods = {"unsigned.yaml": static_pod("unsigned", signed.ref("busybox:latest")),
            "unreachable.yaml": static_pod("unreachable", "127.0.0.1:1/nothing/here:v1")}
    with running_kubelet(str(kubelet), str(tmp_path / "kubelet"), runtime_socket=node.address,
                         manifests=pods, cleanup=remove_pods(node)) as k:
        def reasons() -> bool:
            for p in json.loads(k.get("/pods")).get("items") or []:
                name = p["metadata"]["name"].split("-pycrid-test-node")[0]
                for c in (p.get("status") or {}).get("containerStatuses") or []:
                    waiting = (c.get("state") or {}).get("waiting") or {}
                    if name in seen and waiting.get("reason"):
                        seen[name].add(waiting["reason"])
            return ("SignatureValidationFailed" in seen["unsigned"]
                    and "RegistryUnavailable" in seen["unreachable"])

        try:
            wait_for(reasons, 120, "the pods' waiting reasons")
        except AssertionError:
            raise AssertionError(f"waiting reasons seen: {seen}\n{k.log()[-4000:]}") from None
    clear(node)


def test_status_shows_the_policy_in_force(signed: SignedRegistry, node: Daemon) -> None:
    import subprocess
    import sys

    Path(node.extra["policy"]).write_text('{"default": [{"type": "insecureAcceptAnything"}]}')
    (Path(node.extra["policies"]) / "team-a.json").write_text(
        '{"default": [{"type": "reject"}]}')
    try:
        st = node.client.runtime.Status(pb.StatusRequest(verbose=True), timeout=10)
        sp = json.loads(st.info["images"])["signature_policy"]
        assert sp["signature_policy"] == node.extra["policy"] and sp["state"] == "in force"
        assert sp["namespaces"] == ["team-a"]
        assert sp["registries_d"] == str(signed.registries_d)
        out = subprocess.run([sys.executable, "-m", "pycrid", "status", "--address",
                              node.address], capture_output=True, text=True, timeout=60).stdout
        line = next(x for x in out.splitlines() if x.startswith("Signature policy"))
        assert node.extra["policy"] in line and "in force" in line and "team-a" in line
    finally:
        (Path(node.extra["policies"]) / "team-a.json").unlink()
