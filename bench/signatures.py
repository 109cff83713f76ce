"""What signature verification adds: to a 50 MiB pull, and to CreateContainer of a present
image. Not a test; run as root from the repository root::

    .venv/bin/python -m bench.signatures [--pull-mb 50] [--rounds 5] [--creates 20]

A local registry gets a 50 MiB image of 5 incompressible layers and a sigstore
attachment (an ECDSA P-256 signature, cosign's format) plus a GPG simple-signing
signature in a ``file://`` lookaside; one ``pycrid serve`` pulls it under three policies
in turn, alternating (the policy file is re-read at each pull): ``insecureAcceptAnything``
(the floor: nothing fetched, nothing checked), ``sigstoreSigned`` with the key, and
``signedBy`` (gpgv). Then CreateContainer of that present image in a pod, under the
floor policy and under the sigstore one (kept signatures, the remembered verdict), and
the check alone in-process: with the verdict remembered, and evaluated afresh (ECDSA,
and gpgv). Medians are printed; the machine is shared, so rerun on a quiet one.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

from cri_api.v1 import api_pb2 as pb
from tests.support.daemon import running_daemon
from tests.support.images import (
    big_layer,
    build_image,
    busybox_rootfs_tar,
    load_standard_set,
    push,
)
from tests.support.pods import Pods, pod_config
from tests.support.registry import LocalRegistry
from tests.support.signed_registry import push_attachment
from tests.support.signing import GnuPG, SigstoreKey, claim

from pycrid.images.policy import payload as pl
from pycrid.images.policy.enforcer import PolicySettings, SignaturePolicy
from pycrid.images.policy.sources import SignatureSource

REPO = "bench/signed"


def median_ms(xs: list[float]) -> float:
    return round(statistics.median(xs) * 1000, 2)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pull-mb", type=int, default=50)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--creates", type=int, default=20)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-signatures-") as tmp:
        base = Path(tmp)
        reg = LocalRegistry(base / "registry")
        reg.start()
        try:
            report = run(base, reg, args)
        finally:
            reg.stop()
    print(json.dumps(report, indent=1))
    return 0


def _policies(base: Path, key: SigstoreKey, gpg: GnuPG, host: str) -> dict[str, str]:
    (base / "key.pub").write_bytes(key.public_pem)
    (base / "gpg.pub").write_bytes(gpg.public_key(armor=True))
    floor = {"default": [{"type": "insecureAcceptAnything"}]}
    sig = {"default": [{"type": "reject"}], "transports": {"docker": {host: [
        {"type": "sigstoreSigned", "keyPath": str(base / "key.pub")}]}}}
    gpg_doc = {"default": [{"type": "reject"}], "transports": {"docker": {host: [
        {"type": "signedBy", "keyType": "GPGKeys", "keyPath": str(base / "gpg.pub")}]}}}
    return {"floor": json.dumps(floor), "sigstore": json.dumps(sig), "gpg": json.dumps(gpg_doc)}


def run(base: Path, reg: LocalRegistry, args: argparse.Namespace) -> dict[str, object]:
    n = 5
    sizes = [args.pull_mb // n + (1 if i < args.pull_mb % n else 0) for i in range(n)]
    print(f"building a {args.pull_mb} MiB image ...", file=sys.stderr)
    # busybox first (CreateContainer runs its sleep), then the incompressible layers.
    build = build_image([busybox_rootfs_tar(), *(big_layer(mb, name=f"l{i}.bin", seed=77 + i)
                                                 for i, mb in enumerate(sizes))])
    digest = push(reg, REPO, "v1", build)
    ref = f"{reg.host}/{REPO}:v1"
    key, gpg = SigstoreKey.new(), GnuPG(base / "gnupg", "bench <b@example.com>", "rsa2048")
    push_attachment(reg, REPO, digest, [key.signature(digest, ref)])
    look = base / "lookaside"
    sig_dir = look / f"{REPO}@sha256={digest.split(':')[1]}"
    sig_dir.mkdir(parents=True)
    (sig_dir / "signature-1").write_bytes(gpg.sign(claim(digest, ref, pl.SIMPLE_SIGNING_TYPE)))
    rd = base / "registries.d"
    rd.mkdir()
    (rd / "d.yaml").write_text(f"default-docker:\n  use-sigstore-attachments: true\n"
                               f"  lookaside: file://{look}\n")
    policies = _policies(base, key, gpg, reg.host)
    policy = base / "policy.json"
    policy.write_text(policies["floor"])
    certs = reg.hosts_dir(base / "certs.d")
    load_standard_set(reg)  # the pause image
    config = ("version = 2\n[plugins.\"pycrid.cri.v1.images\"]\n"
              f'sandbox_image = "{reg.host}/pause:3.10"\n'
              f'signature_policy = "{policy}"\nregistries_d = "{rd}"\n'
              "[plugins.\"pycrid.cri.v1.images\".registry]\n"
              f'config_path = "{certs}"\n')
    pulls: dict[str, list[float]] = {k: [] for k in policies}
    creates: dict[str, list[float]] = {"floor": [], "sigstore": []}
    with running_daemon(str(base / "daemon"), config) as d:
        for i in range(args.rounds):
            order = list(policies) if i % 2 == 0 else list(reversed(policies))
            for name in order:
                policy.write_text(policies[name])
                t = time.perf_counter()
                d.client.pull(ref, timeout=600)
                pulls[name].append(time.perf_counter() - t)
                d.client.remove(ref)
        # CreateContainer of the present image, under each policy in turn.
        policy.write_text(policies["floor"])
        image_id = d.client.pull(ref, timeout=600)
        pods = Pods(d.client)
        cfg = pod_config()
        sid = pods.run(cfg)
        try:
            for i in range(args.creates):
                for name in (("floor", "sigstore") if i % 2 == 0 else ("sigstore", "floor")):
                    policy.write_text(policies[name])
                    ctr = pb.ContainerConfig(
                        metadata=pb.ContainerMetadata(name=f"c{i}{name}"),
                        image=pb.ImageSpec(image=image_id, user_specified_image=ref),
                        command=["sleep", "1"])
                    t = time.perf_counter()
                    cid = pods.create(sid, ctr, cfg)
                    creates[name].append(time.perf_counter() - t)
                    pods.remove(cid)
        finally:
            pods.stop_pod(sid)
            pods.remove_pod(sid)
    try:
        checks = asyncio.run(_check_costs(base, policies, rd, ref, digest, key, gpg))
    finally:
        gpg.close()
    floor = statistics.median(pulls["floor"])
    return {
        "pull_mb": args.pull_mb, "rounds": args.rounds,
        "pull_median_ms": {k: median_ms(v) for k, v in pulls.items()},
        "pull_added_percent": {k: round((statistics.median(v) / floor - 1) * 100, 1)
                               for k, v in pulls.items() if k != "floor"},
        "create_median_ms": {k: median_ms(v) for k, v in creates.items()},
        "check_run_ms": checks,
    }


async def _check_costs(base: Path, policies: dict[str, str], rd: Path, ref: str, digest: str,
                       key: SigstoreKey, gpg: GnuPG) -> dict[str, float]:
    """The CreateContainer check alone (SignaturePolicy.check_run), in-process, with the
    signatures kept as a pull keeps them."""
    from pycrid.images.distribution import RegistryClient
    from pycrid.images.hosts import RegistryHosts
    from pycrid.store.db import Database
    from pycrid.store.signature_records import SignatureStore

    out: dict[str, float] = {}
    store = SignatureStore(Database(str(base / "check.db")))
    store.put(digest, [pl.to_blob(key.signature(digest, ref)), pl.to_blob(pl.SimpleSigning(
        gpg.sign(claim(digest, ref, pl.SIMPLE_SIGNING_TYPE))))])
    for name in ("floor", "sigstore", "gpg"):
        path = base / f"check-{name}.json"
        path.write_text(policies[name])
        sp = SignaturePolicy(PolicySettings(str(path), False, "", str(rd)),
                             SignatureSource(RegistryClient(RegistryHosts(None)), None), store)
        await sp.check_run(ref, digest, "default")
        times = []
        for _ in range(200):
            t = time.perf_counter()
            await sp.check_run(ref, digest, "default")
            times.append(time.perf_counter() - t)
        out[f"{name}_remembered"] = median_ms(times)
        times = []
        for _ in range(20 if name == "gpg" else 100):
            sp._verdicts.clear()
            t = time.perf_counter()
            await sp.check_run(ref, digest, "default")
            times.append(time.perf_counter() - t)
        out[f"{name}_afresh"] = median_ms(times)
        await sp.close()
    return out


if __name__ == "__main__":
    sys.exit(main())
