"""The crash storm's ledger (tests/support/crashes.py) judges lists as its rules say: the
checks of tests/fault/test_crash_storm.py can fail."""

from __future__ import annotations

from typing import Any

from cri_api.v1 import api_pb2 as pb

from tests.support.crashes import CONTAINER, POD, Ledger, Obj

POD_ID, CTR_ID = "p" * 64, "c" * 64


def _pod(pid: str, name: str, state: int = pb.SANDBOX_READY) -> Any:
    return pb.PodSandbox(id=pid, metadata=pb.PodSandboxMetadata(name=name), state=state)


def _ctr(cid: str, pid: str, state: int, name: str = "c") -> Any:
    return pb.Container(id=cid, pod_sandbox_id=pid, metadata=pb.ContainerMetadata(name=name),
                        state=state)


def _created(ledger: Ledger) -> tuple[Obj, Obj]:
    pod = ledger.new(POD, "w0-1")
    ledger.record("RunPodSandbox", pod, "ok", POD_ID)
    ctr = ledger.new(CONTAINER, "w0-1/c", pod)
    ledger.record("CreateContainer", ctr, "ok", CTR_ID)
    return pod, ctr


def test_a_start_in_flight_may_be_either_but_the_container_must_be_listed() -> None:
    for state, ok in ((pb.CONTAINER_CREATED, True), (pb.CONTAINER_RUNNING, True),
                      (pb.CONTAINER_EXITED, False), (None, False)):
        ledger = Ledger()
        _, ctr = _created(ledger)
        ledger.record("StartContainer", ctr, "in flight")
        listed = [] if state is None else [_ctr(CTR_ID, POD_ID, state)]
        problems = ledger.reconcile([_pod(POD_ID, "w0-1")], listed)
        assert (problems == []) is ok, (state, problems)
        if state is None:
            assert "is not listed" in problems[0] and "StartContainer in flight" in problems[0]


def test_a_container_told_started_is_never_created() -> None:
    ledger = Ledger()
    _, ctr = _created(ledger)
    ledger.record("StartContainer", ctr, "ok")
    problems = ledger.reconcile([_pod(POD_ID, "w0-1")],
                                [_ctr(CTR_ID, POD_ID, pb.CONTAINER_CREATED)])
    assert len(problems) == 1 and "CONTAINER_CREATED" in problems[0]


def test_an_in_flight_create_is_recognised_by_name_and_adopted() -> None:
    ledger = Ledger()
    pod = ledger.new(POD, "w0-1")
    ledger.record("RunPodSandbox", pod, "ok", POD_ID)
    ctr = ledger.new(CONTAINER, "w0-1/c", pod)
    ledger.record("CreateContainer", ctr, "in flight")
    assert ledger.reconcile([_pod(POD_ID, "w0-1")],
                            [_ctr(CTR_ID, POD_ID, pb.CONTAINER_CREATED)]) == []
    assert ctr.id == CTR_ID and ledger.adopted == 1
    # Listed running, though nobody could have started it: a disagreement.
    ledger = Ledger()
    pod = ledger.new(POD, "w0-1")
    ledger.record("RunPodSandbox", pod, "ok", POD_ID)
    ledger.record("CreateContainer", ledger.new(CONTAINER, "w0-1/c", pod), "in flight")
    problems = ledger.reconcile([_pod(POD_ID, "w0-1")],
                                [_ctr(CTR_ID, POD_ID, pb.CONTAINER_RUNNING)])
    assert len(problems) == 1 and "CONTAINER_RUNNING" in problems[0]


def test_what_nobody_asked_for_and_what_came_back_are_disagreements() -> None:
    ledger = Ledger()
    _created(ledger)
    stranger = _pod("s" * 64, "someone-else")
    problems = ledger.reconcile([_pod(POD_ID, "w0-1"), stranger],
                                [_ctr(CTR_ID, POD_ID, pb.CONTAINER_CREATED)])
    assert len(problems) == 1 and "nobody asked for it" in problems[0]
    # Removed, listed gone, then listed again after a later restart.
    pod = next(o for o in ledger.objects if o.kind == POD)
    ledger.record("RemovePodSandbox", pod, "ok")
    assert ledger.reconcile([], []) == []
    problems = ledger.reconcile([_pod(POD_ID, "w0-1", pb.SANDBOX_NOTREADY)], [])
    assert len(problems) == 1 and "listed gone before" in problems[0]


def test_a_pods_removal_takes_its_containers() -> None:
    ledger = Ledger()
    pod, ctr = _created(ledger)
    ledger.record("RemovePodSandbox", pod, "ok")
    problems = ledger.reconcile([], [_ctr(CTR_ID, POD_ID, pb.CONTAINER_EXITED)])
    assert len(problems) == 1 and ctr.id[:12] in problems[0]
    ledger = Ledger()
    pod, ctr = _created(ledger)
    ledger.record("RemovePodSandbox", pod, "in flight")  # any of before, stopped, gone
    assert ledger.reconcile([_pod(POD_ID, "w0-1", pb.SANDBOX_NOTREADY)],
                            [_ctr(CTR_ID, POD_ID, pb.CONTAINER_CREATED)]) == []


def test_an_object_not_asked_for_yet_is_not_judged() -> None:
    ledger = Ledger()
    pod = ledger.new(POD, "w0-1")  # its worker has not called RunPodSandbox yet
    assert ledger.reconcile([], []) == []
    assert pod in ledger.objects
