"""Splitting a plugin's Synchronize (every current pod and container) into requests that
each stay under ttrpc's message limit, chained by ``more``."""

from __future__ import annotations

from collections.abc import Sequence

from google.protobuf.message import Message

from pycrid.nri import api

#: Synchronize chunks are kept this far under ttrpc's 4 MiB message limit (envelope, header).
SYNC_CHUNK_LIMIT = 4 * 1024 * 1024 - 64 * 1024


def _entry_size(msg: Message) -> int:
    # A repeated message field costs its tag, its length varint and its bytes.
    size = msg.ByteSize()
    return size + 1 + (size.bit_length() + 6) // 7


def sync_chunks(pods: Sequence[api.PodSandbox], containers: Sequence[api.Container],
                limit: int = SYNC_CHUNK_LIMIT
                ) -> list[tuple[list[api.PodSandbox], list[api.Container]]]:
    """Split the sync set so each SynchronizeRequest stays under ``limit`` bytes.

    Pods go first, so a plugin has seen a container's pod when it meets the
    container (upstream's order). Always at least one (maybe empty) chunk.
    """
    chunks: list[tuple[list[api.PodSandbox], list[api.Container]]] = []
    cur_pods: list[api.PodSandbox] = []
    cur_ctrs: list[api.Container] = []
    used = 2  # the ``more`` flag
    items: list[api.PodSandbox | api.Container] = [*pods, *containers]
    for item in items:
        size = _entry_size(item)
        if size + 2 > limit:
            raise ValueError(f"object {item.id} alone exceeds the NRI message limit")
        if used + size > limit and (cur_pods or cur_ctrs):
            chunks.append((cur_pods, cur_ctrs))
            cur_pods, cur_ctrs, used = [], [], 2
        if isinstance(item, api.PodSandbox):
            cur_pods.append(item)
        else:
            cur_ctrs.append(item)
        used += size
    chunks.append((cur_pods, cur_ctrs))
    return chunks
