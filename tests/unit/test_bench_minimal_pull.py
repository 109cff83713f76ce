"""The bench's minimal pull (bench/pull.py): a floor is only worth its name if it does
the work it claims, so it must refuse a blob or a tar that does not hash as named."""

from __future__ import annotations

import http.server
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from bench.pull_floors import REPO, minimal_layer

from tests.support.images import digest_of
from tests.support.layers import compress

TAR = bytes(range(256)) * 4096  # 1 MiB: more than one read of the loop


@pytest.fixture
def registry() -> Iterator[tuple[int, dict[str, bytes]]]:
    """A loopback HTTP server answering ``/v2/<REPO>/blobs/<digest>`` from a dict."""
    blobs: dict[str, bytes] = {}

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = blobs.get(self.path.removeprefix(f"/v2/{REPO}/blobs/"))
            if body is None:
                self.send_error(404)
                return
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1], blobs
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


@pytest.mark.parametrize("compression", ["gzip", "zstd", "none"])
def test_minimal_layer_verifies_and_writes_blob_and_tar(
        registry: tuple[int, dict[str, bytes]], tmp_path: Path, compression: str) -> None:
    port, blobs = registry
    blob = compress(TAR, compression)
    digest = digest_of(blob)
    blobs[digest] = blob
    assert minimal_layer(port, digest, compression, digest_of(TAR), tmp_path) == len(blob)
    name = digest.split(":", 1)[1]
    assert (tmp_path / f"{name}.blob").read_bytes() == blob
    assert (tmp_path / f"{name}.tar").read_bytes() == TAR


def test_minimal_layer_refuses_a_wrong_diff_id(
        registry: tuple[int, dict[str, bytes]], tmp_path: Path) -> None:
    port, blobs = registry
    blob = compress(TAR, "gzip")
    blobs[digest_of(blob)] = blob
    with pytest.raises(RuntimeError, match="does not match"):
        minimal_layer(port, digest_of(blob), "gzip", digest_of(TAR + b"x"), tmp_path)


def test_minimal_layer_refuses_a_blob_that_is_not_itsdigest_of(
        registry: tuple[int, dict[str, bytes]], tmp_path: Path) -> None:
    port, blobs = registry
    blob = compress(TAR, "gzip")
    named = digest_of(b"another blob")
    blobs[named] = blob
    with pytest.raises(RuntimeError, match="does not match"):
        minimal_layer(port, named, "gzip", digest_of(TAR), tmp_path)
