"""Partial pulls: download only the files of a layer this node does not already have.

A zstd:chunked layer (containers/storage's format, which skopeo, Podman and Buildah
write) compresses every regular file on its own and carries a table of contents (TOC)
with each file's sha256 and where its compressed bytes lie in the blob, plus the
tar-split: the tar's headers and padding, so the exact uncompressed tar can be rebuilt.
An eStargz layer has a TOC too, and its headers are written again from it as Go writes
them (``gotar``). For such a layer the puller fetches the metadata with range requests,
looks every file up by digest in the layers already here (``file_index``), fetches the
missing files' ranges (``range_fetch``), and rebuilds the tar stream from the tar-split,
the files found here and the fetched ones (``reassemble``). That stream goes through the
ordinary unpacker, so the layer is applied exactly as a downloaded one would be and its
sha256 (the diff id) is checked against the image config before anything is committed;
files the node has are shared (hard links, with ``use_hard_links``) or copied.

Anything that cannot be verified this way (no range support, no tar-split, a TOC that
disagrees with the tar, a file whose bytes do not match its digest) makes the layer take
the ordinary full download instead: never a layer that was not verified.

The modules: ``layout`` (shared types), ``chunked_toc``, ``tarsplit``, ``estargz_toc``
and ``gotar`` (parsers and the header writer, sans-IO), ``formats`` (each format's
metadata fetched and parsed), ``ranges`` (coalescing, multipart/byteranges, sans-IO),
``file_index`` (the persisted digest index), ``plan``, ``reassemble``, ``materialize``,
``range_fetch`` and ``puller`` (the part fetch.py asks per layer).
"""
