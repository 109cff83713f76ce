"""A crash storm: clients run pod and container lifecycles side by side while the daemon
is SIGKILLed at random moments and restarted on the same root; after every restart the
first ListPodSandbox and ListContainers must agree with what each client was told.

The rules the lists are judged by are written down in tests/fault/test_crash_storm.py's
docstring; ``Ledger`` implements them. ``Storm`` runs the daemon, the workers and the
checks; the fault test runs a short storm, ``python -m bench.crashes`` long ones.
"""

from __future__ import annotations

import collections
import contextlib
import os
import random
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, TypeVar

import grpc
from cri_api.v1 import api_pb2 as pb

from tests.support.daemon import CRIClient, Daemon, running_daemon, serve_command
from tests.support.pods import container_config, leftovers, pod_config

T = TypeVar("T")

ABSENT = "ABSENT"
READY, NOTREADY = "SANDBOX_READY", "SANDBOX_NOTREADY"
CREATED, RUNNING, EXITED = "CONTAINER_CREATED", "CONTAINER_RUNNING", "CONTAINER_EXITED"
POD, CONTAINER = "pod", "container"
OPERATIONS = ("RunPodSandbox", "CreateContainer", "StartContainer", "ExecSync", "StopContainer",
              "RemoveContainer", "StopPodSandbox", "RemovePodSandbox")
NAMESPACE = "crash-storm"


def _stopped(state: str) -> str:
    """A container's state after a stop: a running (or unknown) one has exited."""
    return EXITED if state not in (ABSENT, CREATED, EXITED) else state


def after(op: str, kind: str, state: str) -> str:
    """What an operation answered OK makes of one state of an object it touches (the
    pod it names, or one of that pod's containers)."""
    if op in ("RunPodSandbox", "CreateContainer"):
        return READY if kind == POD else CREATED
    if op == "StartContainer":
        return RUNNING if state == CREATED else state
    if op in ("RemoveContainer", "RemovePodSandbox"):
        return ABSENT
    if op == "StopPodSandbox" and kind == POD:
        return NOTREADY if state != ABSENT else state
    if op in ("StopContainer", "StopPodSandbox"):
        return _stopped(state)
    return state  # ExecSync


def passing(op: str, kind: str, state: str) -> set[str]:
    """Every state an object may be left in when ``op`` was cut short: before, after, and
    what the operation goes through (a removal stops first; a pod's removal stops it)."""
    out = {state, after(op, kind, state)}
    if op == "RemoveContainer" or (op == "RemovePodSandbox" and kind == CONTAINER):
        out.add(_stopped(state))
    if op == "RemovePodSandbox" and kind == POD and state != ABSENT:
        out.add(NOTREADY)
    return out


@dataclass(eq=False)
class Obj:
    """One pod or container a client asked for."""

    kind: str
    #: How a listed object is recognised when its id never reached the client: the pod's
    #: metadata name, or "<pod's name>/<container's name>".
    key: str
    pod: Obj | None = None
    id: str = ""
    #: The states (ABSENT included) the next first list after a restart may show.
    allowed: frozenset[str] = frozenset({ABSENT})
    #: What the client was told, in order (for reports).
    told: list[str] = field(default_factory=list)

    def name(self) -> str:
        return f"{self.kind} {self.id[:12] or '(id never answered)'} {self.key}"


class Ledger:
    """What every client was told, as the set of states each object may be listed in."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.objects: list[Obj] = []
        #: Ids of objects the lists showed gone (a later list showing one is a disagreement).
        self.gone: dict[str, str] = {}
        #: "<op> <outcome>" -> count; outcome is ok, failed or in flight.
        self.counts: collections.Counter[str] = collections.Counter()
        self.errors: list[str] = []
        self.adopted = 0

    def new(self, kind: str, key: str, pod: Obj | None = None) -> Obj:
        obj = Obj(kind, key, pod)
        with self.lock:
            self.objects.append(obj)
        return obj

    def _touched(self, op: str, target: Obj) -> list[Obj]:
        if op in ("StopPodSandbox", "RemovePodSandbox"):
            return [target] + [o for o in self.objects if o.pod is target]
        return [target]

    def record(self, op: str, target: Obj, outcome: str, new_id: str = "",
               error: str = "") -> None:
        """A call's outcome: ``ok`` (the answer: the new object's id, if any), ``failed``
        (an error while the daemon lived: unexpected here, every request is valid) or
        ``in flight`` (the daemon was killed before it answered)."""
        with self.lock:
            self.counts[f"{op} {outcome}"] += 1
            if new_id:
                target.id = new_id
            for obj in self._touched(op, target):
                if outcome == "ok":
                    obj.allowed = frozenset(after(op, obj.kind, s) for s in obj.allowed)
                else:
                    obj.allowed = frozenset().union(
                        *(passing(op, obj.kind, s) for s in obj.allowed))
                obj.told.append(f"{op} {outcome}" if obj is target else f"{op} of its pod "
                                f"{outcome}")
            if outcome == "failed":
                self.errors.append(f"{op} of {target.name()} failed: {error}")

    def reconcile(self, pods: list[Any], containers: list[Any]) -> list[str]:
        """Judge the first lists after a restart; then take what they show as the truth
        (an object whose create was in flight gets the listed id; absent objects leave)."""
        problems: list[str] = []
        with self.lock:
            by_id = {o.id: o for o in self.objects if o.id}
            unnamed = {(o.kind, o.key): o for o in self.objects if not o.id and o.told}
            seen: dict[Obj, str] = {}

            def match(kind: str, oid: str, key: str, state: str) -> None:
                obj = by_id.get(oid)
                if obj is None and (obj := unnamed.pop((kind, key), None)) is not None:
                    obj.id = oid  # its create was in flight: now the client knows it
                    by_id[oid] = obj
                    self.adopted += 1
                if obj is None:
                    why = (f"it was listed gone before ({self.gone[oid]})" if oid in self.gone
                           else "nobody asked for it")
                    problems.append(f"{kind} {oid[:12]} {key} is listed as {state}, but {why}")
                    return
                seen[obj] = state

            for p in pods:
                match(POD, p.id, p.metadata.name, pb.PodSandboxState.Name(p.state))
            pod_keys = {o.id: o.key for o in self.objects if o.kind == POD and o.id}
            for c in containers:
                key = f"{pod_keys.get(c.pod_sandbox_id, c.pod_sandbox_id[:12])}/" \
                      f"{c.metadata.name}"
                match(CONTAINER, c.id, key, pb.ContainerState.Name(c.state))
            for obj in list(self.objects):
                if not obj.told:
                    continue  # its worker has not asked for it yet
                state = seen.get(obj, ABSENT)
                if state not in obj.allowed:
                    problems.append(
                        f"{obj.name()} is {'not listed' if state == ABSENT else state} "
                        f"(may be: {', '.join(sorted(obj.allowed))}); the client was told: "
                        f"{'; '.join(obj.told)}")
                obj.allowed = frozenset({state})
                if state == ABSENT:
                    self.objects.remove(obj)
                    if obj.id:
                        self.gone[obj.id] = "; ".join(obj.told)
        return problems


class Interrupted(Exception):
    """A call failed: the daemon was killed under it (or just before it), or (never
    expected) it answered an error. The worker waits until calls may start again and
    goes on from what the restart's lists showed."""


class Stopping(Exception):
    """The storm is over: the worker ends at its next call."""


def _listed(client: CRIClient) -> tuple[list[Any], list[Any]]:
    rt = client.runtime
    return (list(rt.ListPodSandbox(pb.ListPodSandboxRequest(), timeout=30).items),
            list(rt.ListContainers(pb.ListContainersRequest(), timeout=30).containers))


def _states(listed: tuple[list[Any], list[Any]]) -> dict[str, int]:
    pods, containers = listed
    return {**{p.id: p.state for p in pods}, **{c.id: c.state for c in containers}}


def _statuses_disagree(client: CRIClient, listed: tuple[list[Any], list[Any]]) -> list[str]:
    """PodSandboxStatus and ContainerStatus of every listed object say what List said."""
    rt, problems = client.runtime, []
    for p in listed[0]:
        st = rt.PodSandboxStatus(pb.PodSandboxStatusRequest(pod_sandbox_id=p.id),
                                 timeout=30).status.state
        if st != p.state:
            problems.append(f"pod {p.id[:12]} is listed {pb.PodSandboxState.Name(p.state)} "
                            f"but its status says {pb.PodSandboxState.Name(st)}")
    for c in listed[1]:
        st = rt.ContainerStatus(pb.ContainerStatusRequest(container_id=c.id),
                                timeout=30).status.state
        if st != c.state:
            problems.append(f"container {c.id[:12]} is listed {pb.ContainerState.Name(c.state)}"
                            f" but its status says {pb.ContainerState.Name(st)}")
    return problems


@dataclass
class Report:
    kills: int = 0
    #: Of which a second kill while the restarted daemon recovered.
    recovery_kills: int = 0
    disagreements: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    leftovers: list[str] = field(default_factory=list)
    counts: collections.Counter[str] = field(default_factory=collections.Counter)
    #: Objects whose create was in flight, found in the lists (recognised by name).
    adopted: int = 0
    seconds: float = 0.0
    #: Traces the daemons' orphan sweeps removed (no record explained them: a create the
    #: kill cut short in a child process that finished after recovery, say).
    orphans: int = 0

    @property
    def operations(self) -> int:
        return sum(self.counts.values())

    @property
    def in_flight(self) -> int:
        return sum(n for k, n in self.counts.items() if k.endswith(" in flight"))

    @property
    def clean(self) -> bool:
        return not (self.disagreements or self.errors or self.leftovers)


class Storm:
    """Workers with their own CRI clients, one daemon killed ``kills`` times.

    Calls and kills are ordered by one condition: a kill first closes the gate (no call
    starts), then kills, then waits until every call under way has failed and been put in
    the ledger; the daemon is restarted, the first lists judged, and only then are the
    workers let go on, with new clients."""

    def __init__(self, base: str, config_text: str, images: tuple[str, str], *,
                 workers: int = 8, kills: int = 3, seed: int = 0,
                 kill_after: tuple[float, float] = (0.5, 3.0), recovery_kills: float = 0.25,
                 env: dict[str, str] | None = None,
                 log: Callable[[str], None] | None = None) -> None:
        self.base, self.config_text = base, config_text
        self.pause_image, self.busybox = images
        self.workers, self.kills = workers, kills
        self.rng = random.Random(seed)
        self.seed = seed
        self.kill_after = kill_after
        self.recovery_kills = recovery_kills
        #: The daemon's extra environment (``PYTHONPATH`` of another checkout, say).
        self.env = env
        self.log = log or (lambda _msg: None)
        self.ledger = Ledger()
        self.cond = threading.Condition()
        self.up = False
        self.stopping = False
        self.generation = 0
        #: Calls under way, by operation.
        self.active: collections.Counter[str] = collections.Counter()
        self.clients: list[CRIClient] = []
        self.failure: BaseException | None = None

    # ---- the workers' side ----------------------------------------------------------------

    @contextlib.contextmanager
    def _slot(self, index: int, op: str) -> Iterator[tuple[CRIClient, int]]:
        with self.cond:
            while not self.up and not self.stopping:
                self.cond.wait()
            if self.stopping:
                raise Stopping
            self.active[op] += 1
            self.cond.notify_all()
            client, generation = self.clients[index], self.generation
        try:
            yield client, generation
        finally:
            with self.cond:
                self.active[op] -= 1
                self.cond.notify_all()

    def call(self, index: int, op: str, target: Obj, fn: Callable[[CRIClient], T],
             new_id: Callable[[T], str] | None = None) -> T:
        """``fn`` on worker ``index``'s client, its outcome put in the ledger before the
        slot is given back (so a kill's check sees every call that was under way)."""
        with self._slot(index, op) as (client, generation):
            try:
                result = fn(client)
            except grpc.RpcError as e:
                with self.cond:
                    killed = self.generation != generation or not self.up
                if killed:
                    self.ledger.record(op, target, "in flight")
                    raise Interrupted from None
                self.ledger.record(op, target, "failed",
                                   error=f"{e.code().name}: {e.details()}")
                raise Interrupted from None
            self.ledger.record(op, target, "ok", new_id(result) if new_id else "")
            return result

    def wait_up(self) -> None:
        """Until the restarted daemon's lists are judged and calls may start again."""
        with self.cond:
            while not self.up and not self.stopping:
                self.cond.wait()
            if self.stopping:
                raise Stopping

    def _worker(self, index: int) -> None:
        try:
            Worker(self, index, random.Random(f"{self.seed}-{index}")).run()
        except Stopping:
            pass
        except BaseException as e:  # handed to the controller
            self.failure = self.failure or e
            with self.cond:
                self.stopping = True
                self.cond.notify_all()

    # ---- the controller's side ------------------------------------------------------------

    def _open_gate(self, d: Daemon) -> None:
        with self.cond:
            for c in self.clients:
                c.close()
            self.clients = [CRIClient(d.address) for _ in range(self.workers)]
            self.generation += 1
            self.up = True
            self.cond.notify_all()

    def _kill(self, d: Daemon) -> None:
        with self.cond:
            self.up = False
            self.generation += 1
        d.proc.kill()
        d.proc.wait(30)
        assert d.proc.returncode == -9, f"daemon exited with {d.proc.returncode}"
        deadline = time.monotonic() + 150
        with self.cond:
            while self.active.total():
                if not self.cond.wait(max(0.0, deadline - time.monotonic())):
                    raise AssertionError(f"calls still under way after the kill: "
                                         f"{+self.active}")

    def _daemon(self) -> contextlib.AbstractContextManager[Daemon]:
        return running_daemon(self.base, self.config_text, env=self.env)

    def _crash_while_recovering(self) -> None:
        """A crash loop: the daemon is started on the root and SIGKILLed again while it
        recovers (within 300 ms of serving its socket, which it does just before
        recovery; the gate is closed until recovery is over, so no call is affected)."""
        root, state = os.path.join(self.base, "root"), os.path.join(self.base, "state")
        log_path = os.path.join(self.base, "pycrid.log")
        offset = os.path.getsize(log_path)
        cmd = serve_command(os.path.join(self.base, "config.toml"), root, state,
                            os.path.join(state, "pycrid.sock"))
        with open(log_path, "ab") as logf:
            proc = subprocess.Popen(cmd, stdout=logf, stderr=logf, stdin=subprocess.DEVNULL,
                                    env={**os.environ, **(self.env or {})})
        try:
            deadline = time.monotonic() + 60
            while proc.poll() is None and time.monotonic() < deadline:
                with open(log_path, "rb") as f:
                    f.seek(offset)
                    if b"serving CRI on" in f.read():
                        break
                time.sleep(0.01)
            time.sleep(self.rng.uniform(0, 0.3))
        finally:
            proc.kill()
            proc.wait(30)

    def _aim(self) -> None:
        """Half the kills wait for a call of one operation (chosen at random) to be under
        way, then strike within 10 ms: the short calls (StartContainer, a create's last
        steps) are hit as often as the long ones."""
        if self.rng.random() < 0.5:
            return
        op = self.rng.choice(OPERATIONS)
        deadline = time.monotonic() + 3
        with self.cond:
            while not self.active[op] and not self.stopping and \
                    (left := deadline - time.monotonic()) > 0:
                self.cond.wait(left)
        time.sleep(self.rng.uniform(0, 0.01))

    def _pause(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        with self.cond:
            while not self.stopping and (left := deadline - time.monotonic()) > 0:
                self.cond.wait(left)
            if self.failure is not None:
                raise self.failure

    def run(self) -> Report:
        report = Report()
        started = time.monotonic()
        threads = [threading.Thread(target=self._worker, args=(i,), name=f"storm worker {i}",
                                    daemon=True) for i in range(self.workers)]
        with contextlib.ExitStack() as stack:
            d = stack.enter_context(self._daemon())
            try:
                d.client.pull(self.pause_image)
                d.client.pull(self.busybox)
                self._open_gate(d)
                for t in threads:
                    t.start()
                for k in range(self.kills):
                    self._pause(self.rng.uniform(*self.kill_after))
                    self._aim()
                    self._kill(d)
                    report.kills += 1
                    stack.close()
                    if self.rng.random() < self.recovery_kills:
                        self._crash_while_recovering()
                        report.recovery_kills += 1
                    d = stack.enter_context(self._daemon())
                    problems = self._judge(d, k + 1)
                    report.disagreements += [f"kill {k + 1}: {p}" for p in problems]
                    self._open_gate(d)
                self._pause(self.rng.uniform(*self.kill_after))
            finally:
                with self.cond:
                    self.stopping = True
                    self.cond.notify_all()
                for t in threads:
                    if t.is_alive():
                        t.join(180)
                for c in self.clients:
                    c.close()
                if d.proc.poll() is None:
                    remove_everything(d.client)
        if self.failure is not None:
            raise self.failure
        report.leftovers = leftovers(d.root, d.state)
        report.errors = list(self.ledger.errors)
        report.counts = self.ledger.counts
        report.adopted = self.ledger.adopted
        report.seconds = time.monotonic() - started
        with open(os.path.join(self.base, "pycrid.log"), "rb") as f:
            report.orphans = f.read().count(b"removed orphaned ")
        return report

    def _judge(self, d: Daemon, restart: int) -> list[str]:
        """The first lists after a restart against the ledger; a second pair of lists,
        with no call in between, must show the same."""
        first = _listed(d.client)
        problems = self.ledger.reconcile(*first)
        if _states(second := _listed(d.client)) != _states(first):
            problems.append(f"the second lists differ from the first: "
                            f"{_states(first)} then {_states(second)}")
        problems += _statuses_disagree(d.client, first)
        self.log(f"restart {restart}/{self.kills}: {len(first[0])} pods and "
                 f"{len(first[1])} containers listed, {len(problems)} disagreements")
        return problems


def remove_everything(client: CRIClient) -> None:
    """Stop and remove every pod the daemon lists; then nothing may be listed."""
    rt = client.runtime
    for p in rt.ListPodSandbox(pb.ListPodSandboxRequest(), timeout=30).items:
        rt.StopPodSandbox(pb.StopPodSandboxRequest(pod_sandbox_id=p.id), timeout=120)
        rt.RemovePodSandbox(pb.RemovePodSandboxRequest(pod_sandbox_id=p.id), timeout=120)
    pods, containers = _listed(client)
    assert (pods, containers) == ([], []), f"still listed after removal: {pods} {containers}"


class Worker:
    """One client, acting as a kubelet would on what it knows: RunPodSandbox,
    CreateContainer, StartContainer, ExecSync (now and then), StopContainer,
    RemoveContainer, StopPodSandbox, RemovePodSandbox, with small random pauses. After a
    call the daemon died under it goes on from what the first lists showed: a create
    that did not survive is asked for again with the same name (as the kubelet retries),
    a container listed created is started, and so on; now and then it removes the pod
    instead."""

    def __init__(self, storm: Storm, index: int, rng: random.Random) -> None:
        self.storm, self.index, self.rng = storm, index, rng
        self.ledger = storm.ledger
        self.pod: Obj | None = None
        self.ctr: Obj | None = None
        self.config = pb.PodSandboxConfig()
        self.cycles = 0
        self.exec_planned = False
        self.abandon = False

    def run(self) -> None:
        while True:
            try:
                self.step()
            except Interrupted:
                self.storm.wait_up()
                self.abandon = self.abandon or self.rng.random() < 0.3

    def _state(self, obj: Obj) -> str | None:
        """The object's state if the ledger is sure of it (after an error it is not)."""
        with self.ledger.lock:
            return next(iter(obj.allowed)) if len(obj.allowed) == 1 else None

    @staticmethod
    def _asked(obj: Obj, op: str) -> bool:
        return any(t.startswith(op) for t in obj.told)

    def step(self) -> None:
        """The next call, from what this client knows."""
        pod, ctr = self.pod, self.ctr
        if pod is None or (self._state(pod) == ABSENT and self._asked(pod, "RemovePodSandbox")):
            self.cycles += 1
            self.abandon = False
            return self.run_pod(f"w{self.index}-{self.cycles}")
        pod_state = self._state(pod)
        if pod_state == ABSENT:
            return self.run_pod(pod.key)  # its RunPodSandbox did not survive: again
        if not pod.id:  # its RunPodSandbox failed (an error, reported): start over
            self.pod = None
            return None
        if pod_state is None or pod_state == NOTREADY:
            return self.call_pod("RemovePodSandbox", pod)
        if self.abandon:
            return self.call_pod(self.rng.choice(("StopPodSandbox", "RemovePodSandbox")), pod)
        state = self._state(ctr) if ctr is not None else ABSENT
        if ctr is None or (state == ABSENT and not self._asked(ctr, "RemoveContainer")):
            return self.create(pod)
        if state is None:
            self.abandon = True
        elif state == ABSENT:
            self.call_pod("StopPodSandbox", pod)
        elif state == CREATED:
            self.call_container("StartContainer", ctr)
        elif state == RUNNING and self.exec_planned:
            self.exec_planned = False
            self.exec(ctr)
        elif state == RUNNING:
            self.call_container("StopContainer", ctr)
        else:
            self.call_container("RemoveContainer", ctr)

    def _call(self, op: str, target: Obj, fn: Callable[[Any], T],
              new_id: Callable[[T], str] | None = None) -> T:
        time.sleep(self.rng.uniform(0, 0.05))
        return self.storm.call(self.index, op, target, lambda c: fn(c.runtime), new_id)

    def run_pod(self, name: str) -> None:
        self.config = pod_config(name, NAMESPACE)
        # The kubelet's default: the pod's containers do not share its PID namespace.
        self.config.linux.security_context.namespace_options.pid = pb.CONTAINER
        self.pod, self.ctr = self.ledger.new(POD, name), None
        config = self.config
        self._call("RunPodSandbox", self.pod, lambda rt: rt.RunPodSandbox(
            pb.RunPodSandboxRequest(config=config), timeout=60),
            lambda r: str(r.pod_sandbox_id))

    def create(self, pod: Obj) -> None:
        config = container_config(self.storm.busybox, "c", command=["sleep", "3600"])
        config.linux.security_context.namespace_options.pid = pb.CONTAINER
        self.ctr = self.ledger.new(CONTAINER, f"{pod.key}/c", pod)
        self.exec_planned = self.rng.random() < 0.3
        self._call("CreateContainer", self.ctr, lambda rt: rt.CreateContainer(
            pb.CreateContainerRequest(pod_sandbox_id=pod.id, sandbox_config=self.config,
                                      config=config), timeout=60),
            lambda r: str(r.container_id))

    def call_pod(self, op: str, pod: Obj) -> None:
        self._call(op, pod, lambda rt: getattr(rt, op)(
            getattr(pb, f"{op}Request")(pod_sandbox_id=pod.id), timeout=120))

    def call_container(self, op: str, ctr: Obj) -> None:
        grace = self.rng.choice((0, 0, 1))
        extra = {"timeout": grace} if op == "StopContainer" else {}
        self._call(op, ctr, lambda rt: getattr(rt, op)(
            getattr(pb, f"{op}Request")(container_id=ctr.id, **extra), timeout=grace + 60))

    def exec(self, ctr: Obj) -> None:
        r = self._call("ExecSync", ctr, lambda rt: rt.ExecSync(
            pb.ExecSyncRequest(container_id=ctr.id, cmd=["true"], timeout=10), timeout=70))
        if r.exit_code != 0:
            with self.ledger.lock:
                self.ledger.errors.append(f"ExecSync true in {ctr.name()}: {r.exit_code}")


__all__ = ["Ledger", "Report", "Storm", "after", "passing", "remove_everything"]
