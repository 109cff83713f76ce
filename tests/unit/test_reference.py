"""Image reference parsing and normalisation."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pycrid.errors import InvalidArgument
from pycrid.images.reference import Reference, parse_reference

D1 = "sha256:" + "a" * 64
D2 = "sha256:" + "0123456789abcdef" * 4


@pytest.mark.parametrize("given_, want", [
    ("busybox", "docker.io/library/busybox:latest"),
    ("busybox:1.36", "docker.io/library/busybox:1.36"),
    ("library/busybox", "docker.io/library/busybox:latest"),
    ("docker.io/busybox", "docker.io/library/busybox:latest"),
    ("docker.io/library/busybox:1", "docker.io/library/busybox:1"),
    ("index.docker.io/busybox", "docker.io/library/busybox:latest"),
    ("index.docker.io/foo/bar:2", "docker.io/foo/bar:2"),
    ("registry-1.docker.io/foo/bar", "docker.io/foo/bar:latest"),
    ("foo/bar", "docker.io/foo/bar:latest"),
    ("foo/bar/baz", "docker.io/foo/bar/baz:latest"),
    ("localhost/x", "localhost/x:latest"),
    ("localhost:5000/x", "localhost:5000/x:latest"),
    ("localhost:5000/x/y:tag", "localhost:5000/x/y:tag"),
    ("127.0.0.1:5000/x", "127.0.0.1:5000/x:latest"),
    ("[::1]:5000/x", "[::1]:5000/x:latest"),
    ("registry.k8s.io/pause:3.10", "registry.k8s.io/pause:3.10"),
    ("quay.io/a/b-c_d.e__f:v1.2-rc_3", "quay.io/a/b-c_d.e__f:v1.2-rc_3"),
    ("a--b/c", "docker.io/a--b/c:latest"),
    ("Example.COM/x", "Example.COM/x:latest"),
    (f"busybox@{D1}", f"docker.io/library/busybox@{D1}"),
    (f"busybox:1@{D1}", f"docker.io/library/busybox:1@{D1}"),
    (f"localhost:5000/x@{D2}", f"localhost:5000/x@{D2}"),
    ("x:" + "t" * 128, "docker.io/library/x:" + "t" * 128),
    ("x:_under", "docker.io/library/x:_under"),
    ("x:UPPER", "docker.io/library/x:UPPER"),
])
def test_normalise(given_: str, want: str) -> None:
    assert str(parse_reference(given_)) == want


def test_fields() -> None:
    r = parse_reference(f"localhost:5000/a/b:t@{D1}")
    assert r == Reference("localhost:5000", "a/b", "t", D1)
    assert r.name == "localhost:5000/a/b"
    assert r.object == D1
    r = parse_reference("busybox")
    assert (r.domain, r.path, r.tag, r.digest) == ("docker.io", "library/busybox", "latest", None)
    assert r.object == "latest"
    r = parse_reference(f"busybox@{D1}")
    assert r.tag is None and r.digest == D1
    assert parse_reference("busybox") == parse_reference("docker.io/library/busybox:latest")


@pytest.mark.parametrize("bad, why", [
    ("", "empty"),
    (" busybox", "whitespace"),
    ("busybox ", "whitespace"),
    ("busy box", "whitespace"),
    ("busybox\n", "whitespace"),
    ("busybox\t:1", "whitespace"),
    ("Busybox", "lowercase"),
    ("foo/Bar", "lowercase"),
    ("docker.io/Library/busybox", "lowercase"),
    ("busybox:", "empty tag"),
    ("busybox:-x", "tag"),
    ("busybox:.x", "tag"),
    ("busybox:a/b", "malformed"),
    ("busybox:a+b", "tag"),
    ("busybox:é", "tag"),
    ("x:" + "t" * 129, "129 characters"),
    ("busybox@", "empty digest"),
    ("busybox@sha256:abc", "malformed digest"),
    ("busybox@sha256:" + "A" * 64, "unsupported digest"),
    ("busybox@sha512:" + "a" * 128, "unsupported digest"),
    ("busybox@md5", "malformed digest"),
    (f"busybox@{D1}@{D1}", "digest"),
    ("a" * 64, "image id"),
    (":tag", "empty"),
    ("/busybox", "malformed"),
    ("busybox/", "malformed"),
    ("foo//bar", "malformed"),
    ("-foo", "malformed"),
    ("foo-", "malformed"),
    ("foo..bar", "malformed"),
    ("foo___bar", "malformed"),
    ("foo.-bar", "malformed"),
    ("a:b:c", "malformed"),
    ("-host.com/x", "registry host"),
    ("host.com:port/x", "registry host"),
    ("host_name.com/x", "registry host"),
    ("a" * 250 + "/b", "at most 255"),
    ("x/" + "a" * 250, "at most 255"),
    ("registry.example.com/" + "/".join(["abc"] * 60), "at most 255"),
])
def test_invalid(bad: str, why: str) -> None:
    with pytest.raises(InvalidArgument) as e:
        parse_reference(bad)
    msg = str(e.value)
    assert why in msg
    assert len(msg) < 600


def test_message_quotes_input() -> None:
    with pytest.raises(InvalidArgument, match="'Busybox:1'"):
        parse_reference("Busybox:1")


def test_name_limit_is_on_normalised_name() -> None:
    # "docker.io/library/" adds 18 characters to a bare name.
    ok = "a" * (255 - len("docker.io/library/"))
    assert parse_reference(ok).name == f"docker.io/library/{ok}"
    with pytest.raises(InvalidArgument):
        parse_reference(ok + "a")


def test_non_string() -> None:
    with pytest.raises(InvalidArgument):
        parse_reference(None)  # type: ignore[arg-type]


# ---- properties ---------------------------------------------------------------------------

_alnum = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789", min_size=1, max_size=8)
_sep = st.sampled_from([".", "_", "__", "-", "--"])
_component = st.builds(
    lambda parts, seps: "".join(p + s for p, s in zip(parts, seps, strict=False)) + parts[-1],
    st.lists(_alnum, min_size=1, max_size=3), st.lists(_sep, min_size=2, max_size=2))
_path = st.lists(_component, min_size=1, max_size=4).map("/".join)
_domain = st.one_of(
    st.just(""), st.just("localhost"), st.just("localhost:5000"), st.just("127.0.0.1:5000"),
    st.just("docker.io"), st.just("index.docker.io"), st.just("quay.io"),
    st.just("registry.example.com:443"), st.just("[::1]:5000"))
_tag = st.from_regex(r"\A[A-Za-z0-9_][A-Za-z0-9_.-]{0,20}\Z")
_digest = st.from_regex(r"\Asha256:[0-9a-f]{64}\Z")


@st.composite
def references(draw: st.DrawFn) -> str:
    domain, path = draw(_domain), draw(_path)
    first = path.split("/", 1)[0]
    if not domain and ("." in first or first == "localhost"):
        # Such a first component is read as a registry host (docker's rule), not a path.
        domain = "docker.io"
    s = f"{domain}/{path}" if domain else path
    tag = draw(st.one_of(st.none(), _tag))
    digest = draw(st.one_of(st.none(), _digest))
    if tag is not None:
        s += f":{tag}"
    if digest is not None:
        s += f"@{digest}"
    return s


@given(references())
def test_roundtrip(s: str) -> None:
    r = parse_reference(s)
    assert parse_reference(str(r)) == r
    assert str(parse_reference(str(r))) == str(r)
    assert r.tag is not None or r.digest is not None
    assert r.name == f"{r.domain}/{r.path}"
    assert r.domain != "index.docker.io"
    if r.domain == "docker.io":
        assert "/" in r.path
    if "@" in s:
        assert r.digest == s.rsplit("@", 1)[1]
        assert r.tag is None or f":{r.tag}@" in s
    elif r.tag == "latest":
        assert s.endswith(":latest") or ":" not in s.rsplit("/", 1)[-1]


@given(st.text(max_size=80))
def test_never_crashes(s: str) -> None:
    try:
        r = parse_reference(s)
    except InvalidArgument:
        return
    assert parse_reference(str(r)) == r
    assert not any(c.isspace() for c in str(r))
