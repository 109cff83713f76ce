"""Manifest, index and config parsing; platform selection."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pycrid.errors import DataLoss, InvalidArgument, NotFound
from pycrid.images import mediatypes as oci
from pycrid.images.manifest import (
    MT_DOCKER_SCHEMA1,
    detect_media_type,
    normalize,
    parse_image_config,
    parse_index,
    parse_manifest,
    platform_matches,
    select_platform,
)
from pycrid.images.mediatypes import Descriptor, Platform

D = ["sha256:" + c * 64 for c in "0123456789abcdef"]


def desc(i: int, mt: str = oci.MT_OCI_LAYER_GZIP, size: int = 10, **extra: Any) -> dict[str, Any]:
    return {"mediaType": mt, "digest": D[i], "size": size, **extra}


def manifest(**over: Any) -> dict[str, Any]:
    m: dict[str, Any] = {
        "schemaVersion": 2, "mediaType": oci.MT_OCI_MANIFEST,
        "config": desc(0, oci.MT_OCI_CONFIG), "layers": [desc(1), desc(2)],
    }
    m.update(over)
    return {k: v for k, v in m.items() if v is not ...}


def index(*entries: dict[str, Any], **over: Any) -> dict[str, Any]:
    i: dict[str, Any] = {"schemaVersion": 2, "mediaType": oci.MT_OCI_INDEX,
                         "manifests": list(entries)}
    i.update(over)
    return {k: v for k, v in i.items() if v is not ...}


def b(obj: Any) -> bytes:
    return json.dumps(obj).encode()


def config(**over: Any) -> dict[str, Any]:
    c: dict[str, Any] = {"architecture": "amd64", "os": "linux",
                         "config": {"User": "1000:1000", "Env": ["A=1"]},
                         "rootfs": {"type": "layers", "diff_ids": [D[3], D[4]]}}
    c.update(over)
    return {k: v for k, v in c.items() if v is not ...}


# ---- manifests ----------------------------------------------------------------------------


def test_parse_manifest() -> None:
    m = parse_manifest(b(manifest(annotations={"a": "b"})))
    assert m.config == Descriptor(oci.MT_OCI_CONFIG, D[0], 10)
    assert [x.digest for x in m.layers] == [D[1], D[2]]
    assert m.media_type == oci.MT_OCI_MANIFEST
    assert m.annotations == {"a": "b"}


def test_parse_docker_manifest_and_missing_media_type() -> None:
    m = parse_manifest(b(manifest(mediaType=oci.MT_DOCKER_MANIFEST)))
    assert m.media_type == oci.MT_DOCKER_MANIFEST
    assert parse_manifest(b(manifest(mediaType=...))).media_type == oci.MT_OCI_MANIFEST
    assert parse_manifest(b(manifest(layers=[]))).layers == []


@pytest.mark.parametrize("data, text", [
    (b"", "not valid JSON"),
    (b"<html>", "not valid JSON"),
    (b"\xff\xfe", "not valid JSON"),
    (b"[]", "not a JSON object but an array"),
    (b"null", "null"),
    (b'"x"', "a string"),
    (b"1", "a number"),
    (b"[" * 100_000, "not valid JSON"),
    (b(manifest(schemaVersion=3)), "schemaVersion"),
    (b(manifest(schemaVersion="2")), "schemaVersion"),
    (b(manifest(schemaVersion=True)), "schemaVersion"),
    (b(manifest(schemaVersion=...)), "schemaVersion"),
    (b(manifest(mediaType=5)), "mediaType"),
    (b(manifest(mediaType="text/plain")), "unsupported mediaType"),
    (b(manifest(mediaType=oci.MT_OCI_INDEX)), "index"),
    (b(manifest(config=...)), "'config' is missing"),
    (b(manifest(config=None)), "config"),
    (b(manifest(config="sha256:x")), "config"),
    (b(manifest(config=[])), "config"),
    (b(manifest(config={"digest": D[0]})), "size"),
    (b(manifest(config={"size": 1})), "digest"),
    (b(manifest(config={"digest": "sha256:zz", "size": 1})), "digest"),
    (b(manifest(config={"digest": "md5:" + "a" * 32, "size": 1})), "digest"),
    (b(manifest(config={"digest": D[0], "size": -1})), "size"),
    (b(manifest(config={"digest": D[0], "size": "10"})), "size"),
    (b(manifest(config={"digest": D[0], "size": 1.5})), "size"),
    (b(manifest(config={"digest": D[0], "size": True})), "size"),
    (b(manifest(config={"digest": 5, "size": 1})), "digest"),
    (b(manifest(config={"digest": D[0], "size": 1, "mediaType": []})), "mediaType"),
    (b(manifest(config={"digest": D[0], "size": 1, "annotations": []})), "annotations"),
    (b(manifest(config={"digest": D[0], "size": 1, "annotations": {"a": 1}})), "annotations"),
    (b(manifest(config={"digest": D[0], "size": 1, "platform": "linux"})), "platform"),
    (b(manifest(config={"digest": D[0], "size": 1, "platform": {"os": 1}})), "platform"),
    (b(manifest(layers=...)), "'layers'"),
    (b(manifest(layers={})), "'layers'"),
    (b(manifest(layers=None)), "'layers'"),
    (b(manifest(layers=[None])), "layer 0"),
    (b(manifest(layers=[desc(1), "x"])), "layer 1"),
    (b(manifest(layers=[desc(1), {"digest": D[1]}])), "layer 1"),
    (b(manifest(annotations="x")), "annotations"),
    (b({"schemaVersion": 2, "manifests": []}), "index"),
])
def test_parse_manifest_malformed(data: bytes, text: str) -> None:
    with pytest.raises(DataLoss) as e:
        parse_manifest(data)
    assert text in str(e.value)


@pytest.mark.parametrize("doc", [
    {"schemaVersion": 1, "name": "x", "tag": "y", "fsLayers": [], "history": []},
    {"schemaVersion": 1},
    {"mediaType": MT_DOCKER_SCHEMA1, "schemaVersion": 2},
    {"fsLayers": [{"blobSum": D[0]}]},
    {"signatures": [], "name": "x"},
])
def test_schema1_refused(doc: dict[str, Any]) -> None:
    with pytest.raises(InvalidArgument, match="schema 1 manifests are not supported"):
        parse_manifest(b(doc))
    with pytest.raises(InvalidArgument, match="schema 1"):
        parse_index(b(doc))
    assert detect_media_type(b(doc), "application/json") == MT_DOCKER_SCHEMA1


def test_parse_manifest_not_bytes() -> None:
    with pytest.raises(DataLoss):
        parse_manifest("{}")  # type: ignore[arg-type]


# ---- indexes ------------------------------------------------------------------------------


def test_parse_index() -> None:
    entries = parse_index(b(index(
        desc(1, oci.MT_OCI_MANIFEST, platform={"os": "linux", "architecture": "amd64"}),
        desc(2, oci.MT_OCI_MANIFEST,
             platform={"os": "linux", "architecture": "arm64", "variant": "v8"}),
        desc(3, oci.MT_OCI_MANIFEST))))
    assert [e.digest for e in entries] == [D[1], D[2], D[3]]
    assert entries[1].platform == Platform("linux", "arm64", "v8")
    assert entries[2].platform is None
    docker = parse_index(b(index(mediaType=oci.MT_DOCKER_LIST)))
    assert docker == []
    assert parse_index(b(index(mediaType=...))) == []


@pytest.mark.parametrize("data, text", [
    (b"{", "not valid JSON"),
    (b"[]", "not a JSON object"),
    (b(index(schemaVersion=...)), "schemaVersion"),
    (b(index(mediaType=oci.MT_OCI_MANIFEST)), "not an index"),
    (b(index(mediaType=7)), "mediaType"),
    (b(index(manifests=...)), "'manifests'"),
    (b(index(manifests={})), "'manifests'"),
    (b(index(manifests="x")), "'manifests'"),
    (b(index(1)), "entry 0"),  # type: ignore[arg-type]
    (b(index(desc(1), {"digest": D[2]})), "entry 1"),
    (b(index(desc(1, platform=[1]))), "platform"),
])
def test_parse_index_malformed(data: bytes, text: str) -> None:
    with pytest.raises(DataLoss) as e:
        parse_index(data)
    assert text in str(e.value)


# ---- detect_media_type --------------------------------------------------------------------


@pytest.mark.parametrize("doc, header, want", [
    (manifest(), oci.MT_OCI_MANIFEST, oci.MT_OCI_MANIFEST),
    (manifest(), "application/json", oci.MT_OCI_MANIFEST),
    (manifest(), "", oci.MT_OCI_MANIFEST),
    (manifest(mediaType=...), "application/octet-stream", oci.MT_OCI_MANIFEST),
    (manifest(mediaType=...), oci.MT_DOCKER_MANIFEST, oci.MT_DOCKER_MANIFEST),
    (manifest(mediaType=...), oci.MT_DOCKER_MANIFEST + "; charset=utf-8",
     oci.MT_DOCKER_MANIFEST),
    (manifest(mediaType=oci.MT_DOCKER_MANIFEST), "text/plain", oci.MT_DOCKER_MANIFEST),
    (index(), "application/json", oci.MT_OCI_INDEX),
    (index(mediaType=...), "", oci.MT_OCI_INDEX),
    (index(mediaType=...), oci.MT_DOCKER_LIST, oci.MT_DOCKER_LIST),
    (index(mediaType=oci.MT_DOCKER_LIST), "", oci.MT_DOCKER_LIST),
])
def test_detect_media_type(doc: dict[str, Any], header: str, want: str) -> None:
    assert detect_media_type(b(doc), header) == want


@pytest.mark.parametrize("data, header, text", [
    (b"garbage", oci.MT_OCI_MANIFEST, "not valid JSON"),
    (b"[]", "", "not a JSON object"),
    (b("{}"), "", "not a JSON object"),
    (b({}), "application/json", "neither an index nor an image manifest"),
    (b(manifest(mediaType="application/vnd.example+json")), "", "unsupported media type"),
    (b(manifest()), oci.MT_OCI_INDEX, "declares itself"),
])
def test_detect_media_type_bad(data: bytes, header: str, text: str) -> None:
    with pytest.raises(DataLoss, match=text):
        detect_media_type(data, header)


# ---- image config -------------------------------------------------------------------------


def test_parse_image_config() -> None:
    c = parse_image_config(b(config(variant="v8", architecture="arm64")))
    assert c.diff_ids == [D[3], D[4]]
    assert c.user == "1000:1000"
    assert c.platform == Platform("linux", "arm64", "v8")
    assert c.raw["config"]["Env"] == ["A=1"]


def test_parse_image_config_lenient_parts() -> None:
    c = parse_image_config(b(config(config=None)))
    assert c.user == ""
    c = parse_image_config(b(config(config=...)))
    assert c.user == ""
    c = parse_image_config(b(config(config={"User": None})))
    assert c.user == ""
    c = parse_image_config(b(config(rootfs={"type": "layers", "diff_ids": []})))
    assert c.diff_ids == []
    c = parse_image_config(b(config(os=..., architecture=...)))
    assert c.platform.os == ""


@pytest.mark.parametrize("data, text", [
    (b"", "not valid JSON"),
    (b"[]", "not a JSON object"),
    (b(config(rootfs=...)), "rootfs"),
    (b(config(rootfs=[])), "rootfs"),
    (b(config(rootfs={"type": "layers"})), "diff_ids"),
    (b(config(rootfs={"type": "other", "diff_ids": []})), "rootfs type"),
    (b(config(rootfs={"diff_ids": []})), "rootfs type"),
    (b(config(rootfs={"type": "layers", "diff_ids": "x"})), "diff_ids"),
    (b(config(rootfs={"type": "layers", "diff_ids": [D[1], 5]})), "diff_id 1"),
    (b(config(rootfs={"type": "layers", "diff_ids": ["sha256:abc"]})), "diff_id 0"),
    (b(config(rootfs={"type": "layers", "diff_ids": ["sha256:" + "A" * 64]})), "diff_id 0"),
    (b(config(config=[])), "'config' is not an object"),
    (b(config(config={"User": 0})), "User"),
    (b(config(os=5)), "'os'"),
    (b(config(architecture=[])), "'architecture'"),
    (b(config(variant={})), "'variant'"),
])
def test_parse_image_config_malformed(data: bytes, text: str) -> None:
    with pytest.raises(DataLoss) as e:
        parse_image_config(data)
    assert text in str(e.value)


# ---- fuzz: nothing but DataLoss / InvalidArgument ever escapes -----------------------------

_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=10)
    | st.sampled_from([*D[:3], oci.MT_OCI_MANIFEST, oci.MT_OCI_INDEX, "layers"]),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(
        st.sampled_from(["schemaVersion", "mediaType", "config", "layers", "manifests",
                         "digest", "size", "platform", "annotations", "rootfs", "diff_ids",
                         "type", "os", "architecture", "variant", "User", "fsLayers"]),
        inner, max_size=6),
    max_leaves=20)


@given(_json)
def test_fuzz_parsers(doc: Any) -> None:
    data = json.dumps(doc).encode()
    for fn in (parse_manifest, parse_index, parse_image_config,
               lambda d: detect_media_type(d, "")):
        try:
            fn(data)
        except (DataLoss, InvalidArgument):
            pass


@given(st.binary(max_size=200))
def test_fuzz_bytes(data: bytes) -> None:
    for fn in (parse_manifest, parse_index, parse_image_config):
        try:
            fn(data)
        except (DataLoss, InvalidArgument):
            pass


# ---- platforms ----------------------------------------------------------------------------


def P(s: str) -> Platform:
    return Platform(*s.split("/"))


@pytest.mark.parametrize("raw, want", [
    ("linux/amd64", "linux/amd64/v1"),
    ("linux/x86_64", "linux/amd64/v1"),
    ("Linux/AMD64", "linux/amd64/v1"),
    ("linux/aarch64", "linux/arm64/v8"),
    ("linux/arm64", "linux/arm64/v8"),
    ("linux/arm64/8", "linux/arm64/v8"),
    ("linux/arm", "linux/arm/v7"),
    ("linux/arm/7", "linux/arm/v7"),
    ("linux/armhf", "linux/arm/v7"),
    ("linux/armel", "linux/arm/v6"),
    ("linux/i386", "linux/386"),
    ("macos/arm64", "darwin/arm64/v8"),
    ("linux/riscv64", "linux/riscv64"),
])
def test_normalize(raw: str, want: str) -> None:
    assert str(normalize(P(raw))) == want


@pytest.mark.parametrize("want, have, ok", [
    ("linux/amd64", "linux/amd64", True),
    ("linux/amd64", "linux/amd64/v1", True),
    ("linux/amd64", "linux/amd64/v2", False),
    ("linux/amd64/v3", "linux/amd64/v2", True),
    ("linux/amd64/v3", "linux/amd64", True),
    ("linux/amd64", "linux/arm64", False),
    ("linux/amd64", "windows/amd64", False),
    ("linux/arm64/v8", "linux/arm64", True),
    ("linux/arm64", "linux/arm64/v8", True),
    ("linux/arm64/v8", "linux/arm64/v9", False),
    ("linux/arm/v7", "linux/arm/v6", True),
    ("linux/arm/v7", "linux/arm/v5", True),
    ("linux/arm/v6", "linux/arm/v7", False),
    ("linux/arm/v7", "linux/arm", True),
    ("linux/arm64/v8", "linux/arm/v7", False),
    ("linux/riscv64", "linux/riscv64", True),
    ("linux/s390x", "linux/ppc64le", False),
])
def test_platform_matches(want: str, have: str, ok: bool) -> None:
    assert platform_matches(P(want), P(have)) is ok


def entry(i: int, plat: str | None, mt: str = oci.MT_OCI_MANIFEST) -> Descriptor:
    return Descriptor(mt, D[i], 100, P(plat) if plat else None)


def test_select_exact_first() -> None:
    es = [entry(0, "linux/arm/v6"), entry(1, "linux/arm/v7"), entry(2, "linux/amd64"),
          entry(3, "linux/arm/v5")]
    assert select_platform(es, P("linux/arm/v7")).digest == D[1]
    assert select_platform(es, P("linux/amd64")).digest == D[2]


def test_select_falls_back_to_closest_lower_variant() -> None:
    es = [entry(0, "linux/arm/v5"), entry(1, "linux/arm/v6")]
    assert select_platform(es, P("linux/arm/v7")).digest == D[1]
    assert select_platform([entry(0, "linux/arm/v5")], P("linux/arm/v7")).digest == D[0]


def test_select_arm64_variant_equivalence() -> None:
    assert select_platform([entry(0, "linux/arm64")], P("linux/arm64/v8")).digest == D[0]
    assert select_platform([entry(0, "linux/arm64/v8")], P("linux/arm64")).digest == D[0]


def test_select_index_order_breaks_ties() -> None:
    es = [entry(0, "linux/amd64"), entry(1, "linux/amd64")]
    assert select_platform(es, P("linux/amd64")).digest == D[0]


def test_select_skips_attestations_and_nested() -> None:
    es = [entry(0, "unknown/unknown"), entry(1, "linux/amd64", oci.MT_OCI_INDEX),
          entry(2, "linux/amd64")]
    assert select_platform(es, P("linux/amd64")).digest == D[2]


def test_select_unplatformed_is_last_resort() -> None:
    es = [entry(0, None), entry(1, "linux/amd64")]
    assert select_platform(es, P("linux/amd64")).digest == D[1]
    assert select_platform(es, P("linux/s390x")).digest == D[0]


def test_select_not_found() -> None:
    es = [entry(0, "linux/arm64/v8"), entry(1, "linux/arm/v7")]
    with pytest.raises(NotFound) as e:
        select_platform(es, P("linux/amd64"), "docker.io/library/x:1")
    assert str(e.value).startswith(
        "no manifest for linux/amd64 in index of docker.io/library/x:1")
    assert "linux/arm64/v8" in str(e.value)
    with pytest.raises(NotFound, match="no manifest for linux/amd64 in index"):
        select_platform([], P("linux/amd64"))
