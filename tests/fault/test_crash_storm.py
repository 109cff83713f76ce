"""kill -9 under concurrency: clients run lifecycles while the daemon is killed at random.

Eight workers, each with its own CRI client, loop RunPodSandbox, CreateContainer,
StartContainer, ExecSync (now and then), StopContainer, RemoveContainer, StopPodSandbox,
RemovePodSandbox with small random pauses. The daemon is SIGKILLed at random moments (half
of the kills wait for a call of a randomly chosen operation to be under way, so the short
ones are hit too), sometimes SIGKILLed again while it recovers, and restarted on the same
root. A ledger keeps what each client was told of each call: answered OK, failed, or in
flight when the daemon died (tests/support/crashes.py).

Right after each restart, before any client calls again, the first ListPodSandbox and
ListContainers must agree with the ledger (the kubelet relists right after a runtime
restart, and acts on what it sees):

* an object whose create was answered OK, and that nobody was told was removed since, is
  listed; one told removed (RemoveContainer, or RemovePodSandbox of it or its pod) is not;
* an object whose create was in flight may be listed or not; its id never reached the
  client, so it is recognised by its metadata name (unique in the run), and if listed
  it is a fresh object: a pod READY, a container CREATED (nobody started it);
* nothing else is listed: no id nobody was answered, no name nobody asked for, no id an
  earlier restart's lists showed gone;
* states follow what was told. The containers run ``sleep 3600`` and the pods' pause
  never dies on its own, so only calls change them:
  - a pod told run is READY, told stopped NOTREADY; with its stop in flight READY or
    NOTREADY; with its removal in flight READY, NOTREADY or not listed;
  - a container told created is CREATED, told started RUNNING (never CREATED: a kubelet
    would start it again), told stopped (StopContainer, or StopPodSandbox of its pod)
    EXITED; with its start in flight CREATED or RUNNING; with a stop in flight as before
    or EXITED; with a removal (its own or its pod's) in flight as before, EXITED or not
    listed;
  - a container that was never started stays CREATED when its pod is stopped
    (containerd's stopContainer leaves a container that is not running alone; the pods
    do not share their PID namespace, the kubelet's default, so the pause's death does
    not kill the container's waiting init);
* a second pair of lists, with no call in between, shows exactly the first, and each
  listed object's PodSandboxStatus or ContainerStatus says the state List said.

After the check what the lists showed is what the clients know, and each worker goes on
from there as a kubelet would: a create that did not survive is asked for again with the
same name (a name still held by an invisible object would fail it), a container listed
created is started, and so on; now and then a worker removes its pod instead. A call
answered with an error while the daemon lived is no disagreement but fails the run too:
every request the workers make is valid. At the end every pod is removed, nothing is
listed, and nothing is left on the host (``leftovers``).

This is the short run; ``python -m bench.crashes`` runs long ones.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.crashes import Storm
from tests.support.images import TestImages
from tests.support.pods import daemon_config
from tests.support.registry import LocalRegistry

pytestmark = pytest.mark.e2e

WORKERS = 8
KILLS = 3


def test_kill_9_at_random_under_eight_clients(tmp_path: Path, registry: LocalRegistry,
                                              test_images: TestImages) -> None:
    storm = Storm(str(tmp_path), daemon_config(registry, test_images, tmp_path),
                  (test_images.pause.ref(registry), test_images.busybox.ref(registry)),
                  workers=WORKERS, kills=KILLS, seed=KILLS)
    report = storm.run()
    assert report.kills == KILLS
    assert report.in_flight > 0, f"no call was under way at any kill: {report.counts}"
    assert report.disagreements == []
    assert report.errors == []
    assert report.leftovers == []
