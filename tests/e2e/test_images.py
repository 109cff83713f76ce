"""ImageService end to end: a real pycrid pulling from real local registries over its socket."""

from __future__ import annotations

import base64
import json
import os
import re
import secrets
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from cri_api.v1 import api_pb2 as pb

from tests.support.badregistry import BadRegistry
from tests.support.daemon import Daemon, mounts_under, running_daemon
from tests.support.images import (
    LAYERED_EXPECTED,
    ImageBuild,
    TestImages,
    big_layer,
    build_image,
    busybox_rootfs_tar,
    layered_layers,
    push,
)
from tests.support.layers import Entry, tar_bytes
from tests.support.pods import Pods, busybox_daemon, container_config, pod_config
from tests.support.registry import LocalRegistry

pytestmark = pytest.mark.e2e


def config_for(hosts_dir: str, sandbox: str, extra: str = "") -> str:
    return (
        "version = 2\n"
        '[plugins."pycrid.cri.v1.images"]\n'
        f'sandbox_image = "{sandbox}"\n'
        f"{extra}"
        '[plugins."pycrid.cri.v1.images".registry]\n'
        f'config_path = "{hosts_dir}"\n'
    )


def registry_requests(reg: LocalRegistry | str, since: int = 0) -> list[str]:
    """``METHOD /path`` of every request pycrid made to a registry (from its access log)."""
    path = reg if isinstance(reg, str) else reg.log_path
    with open(path, errors="replace") as f:
        lines = f.readlines()[since:]
    return [f"{m.group(1)} {m.group(2)}" for line in lines
            if (m := re.search(r'"(GET|HEAD|POST|PUT) (\S+) HTTP/1\.1" .*"pycrid', line))]


def log_len(reg: LocalRegistry) -> int:
    with open(reg.log_path, errors="replace") as f:
        return len(f.readlines())


def files_under(path: str) -> list[str]:
    out = []
    for dirpath, dirnames, filenames in os.walk(path):
        out.extend(os.path.join(dirpath, n) for n in filenames + dirnames)
    return out


def image_state(d: Daemon) -> tuple[list[str], list[str]]:
    """Content blobs and snapshot dirs in the daemon's root."""
    blobs_dir = os.path.join(d.root, "content", "blobs", "sha256")
    snaps_dir = os.path.join(d.root, "snapshots", "overlayfs", "snapshots")
    blobs = sorted(os.listdir(blobs_dir)) if os.path.isdir(blobs_dir) else []
    snaps = sorted(os.listdir(snaps_dir)) if os.path.isdir(snaps_dir) else []
    return blobs, snaps


def assert_nothing_left(d: Daemon) -> None:
    blobs, snaps = image_state(d)
    assert blobs == [], f"content left behind: {blobs}"
    assert snaps == [], f"snapshots left behind: {snaps}"
    assert os.listdir(os.path.join(d.root, "content", "ingest")) == []
    assert mounts_under(d.root) == [] and mounts_under(d.state) == []
    assert d.client.list() == []


@pytest.fixture(scope="module")
def hosts(tmp_path_factory: pytest.TempPathFactory, registry: LocalRegistry,
          registry_tls: LocalRegistry, registry_basic: LocalRegistry,
          registry_token: LocalRegistry) -> str:
    d = tmp_path_factory.mktemp("certs.d")
    for reg in (registry, registry_tls, registry_basic, registry_token):
        reg.hosts_dir(d)
    return str(d)


@pytest.fixture
def daemon(tmp_path: Path, hosts: str, registry: LocalRegistry,
           test_images: TestImages) -> Iterator[Daemon]:
    with running_daemon(str(tmp_path),
                        config_for(hosts, test_images.pause.ref(registry))) as d:
        yield d


def rpc_error(fn: object, *args: object) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as e:
        fn(*args)  # type: ignore[operator]
    return e.value


# ---- pulls -------------------------------------------------------------------------------


def test_pull_by_tag_then_status_list_and_again(daemon: Daemon, registry: LocalRegistry,
                                                test_images: TestImages) -> None:
    img = test_images.busybox
    ref = img.ref(registry)
    image_id = daemon.client.pull(ref)
    assert image_id == img.build.config_digest
    st = daemon.client.status(ref, verbose=True)
    assert st.image.id == image_id
    assert list(st.image.repo_tags) == [ref]
    assert list(st.image.repo_digests) == [f"{registry.host}/{img.repo}@{img.digest}"]
    assert st.image.size == (len(img.build.manifest) + len(img.build.config)
                             + sum(len(img.build.blobs[d]) for d in img.build.layer_digests))
    assert not st.image.pinned
    info = json.loads(st.info["info"])
    assert info["imageSpec"]["rootfs"]["diff_ids"] == list(img.build.diff_ids)
    assert info["chainID"].startswith("sha256:")
    # Found by id, by digest reference and by list filter too.
    assert daemon.client.status(image_id).image.id == image_id
    assert daemon.client.status(f"{registry.host}/{img.repo}@{img.digest}").image.id == image_id
    assert [i.id for i in daemon.client.list(ref)] == [image_id]
    assert image_id in [i.id for i in daemon.client.list()]
    # A second pull of a present image costs one manifest request and nothing else.
    mark = log_len(registry)
    assert daemon.client.pull(ref) == image_id
    again = registry_requests(registry, mark)
    assert again == [f"HEAD /v2/{img.repo}/manifests/{img.tag}"]
    # The unpacked root holds busybox.
    fs = ImageFs(daemon, info["chainID"])
    assert fs.has("bin/busybox") and os.readlink(fs.path("bin/sh")) == "busybox"


class ImageFs:
    """Find files of an image's top snapshot chain on disk (by looking in every layer)."""

    def __init__(self, d: Daemon, chain_id: str) -> None:
        self.layers = sorted(
            Path(d.root, "snapshots", "overlayfs", "snapshots").glob("*/fs"))

    def path(self, rel: str) -> str:
        for layer in self.layers:
            p = layer / rel
            if p.exists() or p.is_symlink():
                return str(p)
        raise FileNotFoundError(rel)

    def has(self, rel: str) -> bool:
        try:
            self.path(rel)
        except FileNotFoundError:
            return False
        return True


def test_pull_by_digest_docker_schema2_zstd_and_multiarch(
        daemon: Daemon, registry: LocalRegistry, test_images: TestImages) -> None:
    by_digest = test_images.busybox_136.digest_ref(registry)
    image_id = daemon.client.pull(by_digest)
    st = daemon.client.status(by_digest).image
    assert st.id == image_id and list(st.repo_tags) == [] and list(st.repo_digests) == [by_digest]
    mark = log_len(registry)
    daemon.client.pull(by_digest)  # content addressed and present: no request at all
    assert registry_requests(registry, mark) == []

    docker = test_images.docker_busybox
    assert daemon.client.pull(docker.ref(registry)) == docker.build.config_digest
    zstd = test_images.zstd
    assert daemon.client.pull(zstd.ref(registry)) == zstd.build.config_digest

    multi = test_images.multi
    picked = daemon.client.pull(multi.ref(registry))
    (amd64,) = [c for c in multi.build.children
                if c.manifest_digest == test_images.multi_children["linux/amd64"]]
    assert picked == amd64.config_digest
    env = json.loads(daemon.client.status(multi.ref(registry), verbose=True).info["info"])
    assert "PLATFORM=linux/amd64" in env["imageSpec"]["config"]["Env"]


def test_sandbox_image_is_pinned(daemon: Daemon, registry: LocalRegistry,
                                 test_images: TestImages) -> None:
    ref = test_images.pause.ref(registry)
    daemon.client.pull(ref)
    assert daemon.client.status(ref).image.pinned
    daemon.client.pull(test_images.busybox.ref(registry))
    assert not daemon.client.status(test_images.busybox.ref(registry)).image.pinned


def test_image_user_is_reported(daemon: Daemon, registry: LocalRegistry) -> None:
    tar = busybox_rootfs_tar()
    for repo, user, uid, name in (("user/num", "1000:1000", 1000, ""),
                                  ("user/name", "app", None, "app")):
        push(registry, repo, "latest", build_image([tar], config={"User": user}))
        daemon.client.pull(f"{registry.host}/{repo}:latest")
        img = daemon.client.status(f"{registry.host}/{repo}:latest").image
        assert (img.uid.value if img.HasField("uid") else None) == uid
        assert img.username == name


def test_tls_with_client_certs_basic_and_token_auth(
        daemon: Daemon, registry_tls: LocalRegistry, registry_basic: LocalRegistry,
        registry_token: LocalRegistry, test_images: TestImages) -> None:
    img = test_images.busybox
    assert daemon.client.pull(img.ref(registry_tls)) == img.build.config_digest
    good = pb.AuthConfig(username="alice", password="wonderland")
    for reg in (registry_basic, registry_token):
        err = rpc_error(daemon.client.pull, img.ref(reg))
        assert err.code() == grpc.StatusCode.UNAUTHENTICATED, err.details()
        bad = rpc_error(daemon.client.pull, img.ref(reg),
                        pb.AuthConfig(username="alice", password="wrong"))
        assert bad.code() == grpc.StatusCode.UNAUTHENTICATED, bad.details()
        assert "wrong" not in bad.details()  # no secret in the message
        assert reg.host in bad.details()
        assert daemon.client.pull(img.ref(reg), good) == img.build.config_digest
    # The CRI's base64 "auth" form works as well.
    daemon.client.remove(img.ref(registry_token))
    auth = pb.AuthConfig(auth=base64.b64encode(b"alice:wonderland").decode())
    assert daemon.client.pull(img.ref(registry_token), auth) == img.build.config_digest


def test_layered_images_run_from_gzip_and_zstd_layers(tmp_path: Path, registry: LocalRegistry,
                                                      test_images: TestImages) -> None:
    """The same three layers (a whiteout, an opaque dir, files written through a symlinked
    dir of a lower layer), compressed with gzip and with zstd (containerd pulls both):
    a container of each sees exactly the assembled tree."""
    shell = {"Env": ["PATH=/bin"], "Cmd": ["sleep", "3600"]}
    with busybox_daemon(tmp_path, registry, test_images) as d:
        pods = Pods(d.client)
        try:
            for compression in ("gzip", "zstd"):
                build = build_image(layered_layers(), compression=compression, config=shell)
                push(registry, f"layered-{compression}", "latest", build)
                ref = f"{registry.host}/layered-{compression}:latest"
                assert d.client.pull(ref) == build.config_digest
                pod = pod_config()
                sid = pods.run(pod)
                cid = pods.run_container(sid, container_config(ref, compression), pod)
                pods.wait_state(cid, pb.CONTAINER_RUNNING)
                for rel, want in LAYERED_EXPECTED.items():
                    if want is None:
                        r = pods.exec(cid, ["sh", "-c", f"test ! -e /{rel} && test ! -L /{rel}"])
                        assert r.exit_code == 0, (compression, rel)
                    elif isinstance(want, str):
                        r = pods.exec(cid, ["readlink", f"/{rel}"])
                        assert r.stdout.decode().strip() == want[2:], (compression, rel)
                    else:
                        assert pods.exec(cid, ["cat", f"/{rel}"]).stdout == want, (compression, rel)
                pods.remove_pod(sid)
                d.client.remove(ref)
        finally:
            pods.cleanup()


def test_concurrent_pulls_share_a_layer_download(daemon: Daemon, registry: LocalRegistry) -> None:
    shared = big_layer(8, seed=7)
    one = build_image([shared, tar_bytes([Entry("one.txt", data=b"1")])])
    two = build_image([shared, tar_bytes([Entry("two.txt", data=b"2")])])
    tag = secrets.token_hex(4)
    push(registry, "share/one", tag, one)
    push(registry, "share/two", tag, two)
    mark = log_len(registry)
    errors: list[BaseException] = []

    def pull(repo: str) -> None:
        try:
            daemon.client.pull(f"{registry.host}/{repo}:{tag}")
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=pull, args=(r,)) for r in ("share/one", "share/two")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors
    shared_digest = one.layer_digests[0]
    fetched = [r for r in registry_requests(registry, mark)
               if r.startswith("GET ") and r.endswith(f"/blobs/{shared_digest}")]
    assert len(fetched) == 1, fetched


# ---- remove and garbage collection -----------------------------------------------------


def test_remove_by_tag_digest_and_id_collects_garbage(daemon: Daemon, registry: LocalRegistry,
                                                      test_images: TestImages) -> None:
    bb, layered = test_images.busybox, test_images.layered
    for how in ("tag", "digest", "id"):
        image_id = daemon.client.pull(bb.ref(registry))
        daemon.client.pull(layered.ref(registry))
        target = {"tag": bb.ref(registry), "digest": bb.digest_ref(registry), "id": image_id}[how]
        daemon.client.remove(target)
        assert daemon.client.status(bb.ref(registry)).HasField("image") is False
        assert daemon.client.status(image_id).HasField("image") is False
        # layered is untouched and its content still complete
        assert daemon.client.status(layered.ref(registry)).image.id == layered.build.config_digest
        daemon.client.remove(layered.ref(registry))
        assert_nothing_left(daemon)
    # Removing what is not there succeeds (the CRI's idempotence).
    daemon.client.remove(bb.ref(registry))
    daemon.client.remove("sha256:" + "0" * 64)


def test_images_survive_a_restart(tmp_path: Path, hosts: str, registry: LocalRegistry,
                                  test_images: TestImages) -> None:
    config = config_for(hosts, test_images.pause.ref(registry))
    with running_daemon(str(tmp_path), config) as d:
        image_id = d.client.pull(test_images.busybox.ref(registry))
    with running_daemon(str(tmp_path), config) as d:
        st = d.client.status(test_images.busybox.ref(registry)).image
        assert st.id == image_id
        mark = log_len(registry)
        d.client.pull(test_images.busybox.ref(registry))
        assert len(registry_requests(registry, mark)) == 1


def test_image_fs_info(daemon: Daemon, registry: LocalRegistry, test_images: TestImages) -> None:
    before = daemon.client.images.ImageFsInfo(pb.ImageFsInfoRequest(), timeout=30)
    daemon.client.pull(test_images.busybox.ref(registry))
    after = daemon.client.images.ImageFsInfo(pb.ImageFsInfoRequest(), timeout=30)
    (b,), (a,) = before.image_filesystems, after.image_filesystems
    assert a.fs_id.mountpoint.startswith(daemon.root)
    assert a.used_bytes.value > b.used_bytes.value + 500_000  # busybox is ~1-2 MB
    assert a.inodes_used.value > b.inodes_used.value


# ---- bad input ---------------------------------------------------------------------------


@pytest.mark.parametrize("ref", ["library/UPPER:1", "a b", "busybox:bad tag!", "x@sha256:123", ":"])
def test_malformed_references(daemon: Daemon, ref: str) -> None:
    for call in (daemon.client.pull, daemon.client.status, daemon.client.remove):
        err = rpc_error(call, ref)
        assert err.code() == grpc.StatusCode.INVALID_ARGUMENT, (call, err.details())


def test_empty_image_spec(daemon: Daemon) -> None:
    err = rpc_error(daemon.client.images.PullImage, pb.PullImageRequest())
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "empty" in err.details()


def test_missing_image_and_unknown_id(daemon: Daemon, registry: LocalRegistry) -> None:
    err = rpc_error(daemon.client.pull, f"{registry.host}/no/such:image")
    assert err.code() == grpc.StatusCode.NOT_FOUND
    assert "no/such:image" in err.details()
    assert not daemon.client.status("sha256:" + "1" * 64).HasField("image")
    assert_nothing_left(daemon)


def test_unreachable_registry(daemon: Daemon) -> None:
    # cri-api's RegistryUnavailable, which the kubelet reads only from an UNKNOWN answer
    # (CRI-O answers the same); the pod then shows that reason, not ErrImagePull.
    err = rpc_error(daemon.client.pull, "127.0.0.1:1/x:y")
    assert err.code() == grpc.StatusCode.UNKNOWN
    assert err.details().startswith("RegistryUnavailable: ")
    assert "127.0.0.1:1" in err.details()


@pytest.mark.parametrize(
    ("mode", "code"),
    [("garbage", grpc.StatusCode.DATA_LOSS), ("truncated", grpc.StatusCode.DATA_LOSS),
     ("wrongdigest", grpc.StatusCode.DATA_LOSS)],
)
def test_misbehaving_registry_leaves_nothing(tmp_path: Path, mode: str,
                                             code: grpc.StatusCode) -> None:
    with BadRegistry().running() as bad:
        hosts = tmp_path / "certs.d" / bad.host
        hosts.mkdir(parents=True)
        (hosts / "hosts.toml").write_text(f'server = "http://{bad.host}"\n')
        with running_daemon(str(tmp_path / "d"),
                            config_for(str(tmp_path / "certs.d"), "example.com/pause:1")) as d:
            err = rpc_error(d.client.pull, f"{bad.host}/bad/{mode}:latest")
            assert err.code() == code, err.details()
            assert err.details()
            assert_nothing_left(d)


def test_stalled_registry_times_out(tmp_path: Path) -> None:
    with BadRegistry().running() as bad:
        hosts = tmp_path / "certs.d" / bad.host
        hosts.mkdir(parents=True)
        (hosts / "hosts.toml").write_text(f'server = "http://{bad.host}"\n')
        extra = 'image_pull_progress_timeout = "1s"\n'
        with running_daemon(str(tmp_path / "d"),
                            config_for(str(tmp_path / "certs.d"), "example.com/p:1",
                                       extra)) as d:
            err = rpc_error(d.client.pull, f"{bad.host}/bad/slow:latest")
            assert err.code() == grpc.StatusCode.DEADLINE_EXCEEDED, err.details()
            assert_nothing_left(d)


# ---- hostile layers ------------------------------------------------------------------------


def hostile(canary: Path) -> dict[str, tuple[list[Entry], str | None]]:
    """name -> (layer entries, expected gRPC code name or None when the pull must succeed)."""
    depth = "../" * 12
    return {
        "abs-name": ([Entry(f"{canary}/pwned", data=b"x")], None),
        "dotdot-name": ([Entry(f"{depth}{str(canary)[1:]}/pwned", data=b"x")], None),
        "abs-symlink-dir": ([Entry("esc", "symlink", linkname=str(canary)),
                             Entry("esc/pwned", data=b"x")], None),
        "rel-symlink-dir": ([Entry("d", "dir"), Entry("d/up", "symlink",
                                                      linkname=f"{depth}{str(canary)[1:]}"),
                             Entry("d/up/pwned", data=b"x")], None),
        "symlink-then-overwrite": ([Entry("keep", "symlink", linkname=f"{canary}/keep"),
                                    Entry("keep", data=b"overwritten")], None),
        "hardlink-out": ([Entry("h", "hardlink", linkname=f"{depth}{str(canary)[1:]}/keep")],
                         "PERMISSION_DENIED"),
        "device": ([Entry("dev/sda", "block", devmajor=8, devminor=0)], "PERMISSION_DENIED"),
        "whiteout-out": ([Entry(f"{depth}{str(canary)[1:]}/.wh.keep")], None),
    }


def test_hostile_layers(tmp_path: Path, hosts: str, registry: LocalRegistry,
                        test_images: TestImages, canary: Path) -> None:
    cases = hostile(canary)
    builds: dict[str, ImageBuild] = {}
    for name, (entries, _) in cases.items():
        builds[name] = build_image([tar_bytes(entries)])
        push(registry, f"hostile/{name}", "latest", builds[name])
    before = sorted(str(p) for p in canary.rglob("*"))
    with running_daemon(str(tmp_path),
                        config_for(hosts, test_images.pause.ref(registry))) as d:
        for name, (_, expect) in cases.items():
            ref = f"{registry.host}/hostile/{name}:latest"
            if expect is None:
                assert d.client.pull(ref) == builds[name].config_digest, name
            else:
                err = rpc_error(d.client.pull, ref)
                assert err.code().name == expect, (name, err.details())
                assert "outside" in err.details() or "device" in err.details(), err.details()
            assert sorted(str(p) for p in canary.rglob("*")) == before, name
            assert (canary / "keep").read_text() == "untouched", name
        # What was contained landed inside the root.
        pwned = [p for p in files_under(d.root) if p.endswith("/pwned")]
        assert len(pwned) == 4, pwned
        for name in cases:
            d.client.remove(f"{registry.host}/hostile/{name}:latest")
        assert_nothing_left(d)


def test_kill_mid_pull_then_restart_leaves_nothing(tmp_path: Path, hosts: str,
                                                   registry: LocalRegistry,
                                                   test_images: TestImages) -> None:
    layers = [big_layer(6, seed=100 + i) for i in range(5)]
    build = build_image(layers)
    tag = secrets.token_hex(4)
    push(registry, "crash/big", tag, build)
    ref = f"{registry.host}/crash/big:{tag}"
    config = config_for(hosts, test_images.pause.ref(registry))
    with running_daemon(str(tmp_path), config) as d:
        errors: list[BaseException] = []

        def pull() -> None:
            try:
                d.client.pull(ref)
            except BaseException as e:
                errors.append(e)

        t = threading.Thread(target=pull)
        t.start()
        snaps = Path(d.root, "snapshots", "overlayfs", "snapshots")
        deadline = time.monotonic() + 30
        # Kill once the pull is part-way: some layers unpacked, not all.
        while time.monotonic() < deadline and len(list(snaps.glob("*"))) < 2:
            time.sleep(0.005)
        d.proc.kill()
        d.proc.wait()
        t.join(30)
        assert errors, "the pull should have died with the daemon"
    with running_daemon(str(tmp_path), config) as d:
        assert "image store recovered" in d.log()
        assert_nothing_left(d)
        assert d.client.pull(ref) == build.config_digest
