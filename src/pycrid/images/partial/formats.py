"""The layer formats a partial pull knows, each turning a layer into a ``Layout``: with
range requests (``layout``), or from its blob once it was downloaded whole (``rows``,
what the file index records then).

- zstd:chunked (``chunked_toc``, ``tarsplit``): the descriptor says where the TOC and
  the tar-split are; one request fetches both.
- eStargz (``estargz_toc``, ``gotar``): the footer says where the TOC is (one request
  for the blob's end, a second when the TOC is larger than that); the tar headers are
  written again from the TOC, and the real bytes of the first place where the two ways a
  long name can be written differ (or of the headers before the first file) are fetched
  to check them before anything else.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Protocol, TypeVar

from pycrid.images import mediatypes as oci
from pycrid.images.layer_paths import clean_name
from pycrid.images.partial import chunked_toc, estargz_toc, tarsplit
from pycrid.images.partial.layout import DIGEST_RE, Layout, Unusable
from pycrid.images.partial.range_fetch import Fetcher

T = TypeVar("T")
Rows = list[tuple[str, str, int]]


class Threads(Protocol):
    """Runs CPU work (parsing) off the event loop."""

    def __call__(self, fn: Callable[[], T]) -> Awaitable[T]: ...

#: The end of an eStargz blob fetched first, for the footer and, most of the time, the
#: TOC (a sixteenth of the blob, within these bounds); a larger TOC takes a second request.
TAIL = (4 << 10, 256 << 10)
_GZIP = frozenset({oci.MT_OCI_LAYER_GZIP, oci.MT_DOCKER_LAYER_GZIP})


class Format(Protocol):
    name: str

    async def layout(self, fetcher: Fetcher, thread: Threads) -> Layout: ...

    def rows(self, blob_path: str) -> Rows: ...


def detect(desc: oci.Descriptor) -> Format | None:
    """The format of a layer a partial pull can take, None for any other; Unusable when
    its annotations are broken (it is then pulled whole)."""
    ann = desc.annotations
    if desc.media_type == oci.MT_OCI_LAYER_ZSTD and chunked_toc.is_chunked(ann):
        return Chunked(chunked_toc.locate(ann, desc.size))
    if desc.media_type in _GZIP and estargz_toc.TOC_DIGEST in ann:
        if chunked_toc.is_chunked(ann):
            raise Unusable("the layer claims both a zstd:chunked and an eStargz TOC")
        digest = ann[estargz_toc.TOC_DIGEST]
        if not DIGEST_RE.match(digest):
            raise Unusable(f"{estargz_toc.TOC_DIGEST} is not a sha256 digest")
        if desc.size <= estargz_toc.FOOTER:
            raise Unusable("the blob is too small for eStargz")
        return Estargz(digest, desc.size)
    return None


class Chunked:
    name = "zstd:chunked"

    def __init__(self, pos: chunked_toc.Position) -> None:
        self.pos = pos

    async def layout(self, fetcher: Fetcher, thread: Threads) -> Layout:
        meta = await fetcher.fetch_span(self.pos.metadata_range())

        def parse() -> Layout:
            toc_json, split_z = chunked_toc.open_metadata(self.pos, meta)
            toc = chunked_toc.parse_toc(toc_json, self.pos)
            return tarsplit.layout(chunked_toc.inflate_tarsplit(self.pos, toc, split_z), toc)

        return await thread(parse)

    def rows(self, blob_path: str) -> Rows:
        start, end = self.pos.metadata_range()
        with open(blob_path, "rb") as f:
            f.seek(start)
            meta = f.read(end - start)
        toc = chunked_toc.parse_toc(chunked_toc.open_metadata(self.pos, meta)[0], self.pos)
        return [(f.digest, clean_name(f.name), f.size) for f in toc.files.values()]


class Estargz:
    name = "eStargz"

    def __init__(self, toc_digest: str, size: int) -> None:
        self.toc_digest, self.size = toc_digest, size

    async def layout(self, fetcher: Fetcher, thread: Threads) -> Layout:
        start = max(0, self.size - max(TAIL[0], min(TAIL[1], self.size // 16)))
        tail = await fetcher.fetch_span((start, self.size))
        off = estargz_toc.footer_offset(tail[-estargz_toc.FOOTER:], self.size)
        member = tail[off - start:-estargz_toc.FOOTER] if off >= start else \
            await fetcher.fetch_span((off, self.size - estargz_toc.FOOTER))

        def parse() -> estargz_toc.Styles:
            js, toc_tar = estargz_toc.toc_json(member, self.toc_digest)
            return estargz_toc.styles(estargz_toc.parse(js, off), off, toc_tar)

        styles = await thread(parse)
        probe = await fetcher.fetch_span(styles.probe)
        return await thread(lambda: estargz_toc.choose(styles, probe))

    def rows(self, blob_path: str) -> Rows:
        with open(blob_path, "rb") as f:
            f.seek(self.size - estargz_toc.FOOTER)
            off = estargz_toc.footer_offset(f.read(estargz_toc.FOOTER), self.size)
            f.seek(off)
            member = f.read(self.size - estargz_toc.FOOTER - off)
        js, _ = estargz_toc.toc_json(member, self.toc_digest)
        return [(t.digest, clean_name(t.header.name), t.header.size)
                for t in estargz_toc.parse(js, off) if t.offset]
