"""The List answers' message cache: a record's message is reused while the record object is
the same, rebuilt when the store replaced it, and dropped once an unfiltered list no longer
has it."""

from __future__ import annotations

import dataclasses

from cri_api.v1 import api_pb2 as pb

from pycrid.cri.record_messages import MessageCache, container_pb
from pycrid.store.records import ContainerRecord


def rec(cid: str, **kw: int) -> ContainerRecord:
    return ContainerRecord(id=cid, sandbox_id="s", name=cid, created_at=1, phase="created",
                           config=pb.ContainerConfig(metadata=pb.ContainerMetadata(name=cid),
                                                     labels={"app": cid}), **kw)


def test_unchanged_records_reuse_their_message_and_changed_ones_are_rebuilt() -> None:
    cache = MessageCache(container_pb)
    a, b = rec("a"), rec("b")
    first = cache.messages([a, b], complete=True)
    assert [m.id for m in first] == ["a", "b"]
    assert [m.state for m in first] == [pb.CONTAINER_CREATED] * 2
    again = cache.messages([a, b], complete=True)
    assert again[0] is first[0] and again[1] is first[1]
    started = dataclasses.replace(b, started_at=5)  # what RecordStore.update makes
    third = cache.messages([a, started], complete=True)
    assert third[0] is first[0]
    assert third[1] is not first[1] and third[1].state == pb.CONTAINER_RUNNING
    assert pb.ListContainersResponse(containers=third).containers[1].labels == {"app": "b"}


def test_unfiltered_list_forgets_removed_records_filtered_lists_forget_nothing() -> None:
    cache = MessageCache(container_pb)
    a, b = rec("a"), rec("b")
    kept = cache.messages([a, b], complete=True)
    cache.messages([a], complete=False)  # a filter: b still exists
    assert cache.messages([b], complete=False)[0] is kept[1]
    cache.messages([a], complete=True)  # b was removed
    assert cache.messages([b], complete=False)[0] is not kept[1]
