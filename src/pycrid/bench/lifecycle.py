"""Pod and container lifecycle latency over CRI, beside plain ``runc create`` + ``runc start``
of an equivalent bundle (``floor.py``) timed in the same loop."""

from __future__ import annotations

import secrets
import sys

from pycrid.bench.cri import container_config, pod_config
from pycrid.bench.floor import Runc
from pycrid.bench.report import Section
from pycrid.bench.target import Target
from pycrid.bench.timing import timed

POD_START = "pod start (Run+Create+Start)"
#: The same without pod networking: what the runtime adds, CNI's plugins left out.
HOST_POD_START = "pod start hostNetwork (Run+Create+Start)"
CREATE_START = "CreateContainer+StartContainer"
RUNC_CS = "runc create+start"
# figure -> floor; the order is the table's.
FIGURES = {
    POD_START: RUNC_CS,
    HOST_POD_START: RUNC_CS,
    "RunPodSandbox": None,
    "RunPodSandbox hostNetwork": None,
    "RunPodSandbox shared PID": None,
    CREATE_START: RUNC_CS,
    "CreateContainer": "runc create",
    "StartContainer": "runc start",
    "StopContainer": None,
    "RemoveContainer": None,
    "StopPodSandbox": None,
    "RemovePodSandbox": None,
}
FLOORS = (RUNC_CS, "runc create", "runc start")
SLEEP = ["sleep", "3600"]


def handler_figures(handler: str) -> tuple[str, str, str]:
    """The names of a handler's pod start, RunPodSandbox and Create+Start figures."""
    return (f"pod start {handler} (Run+Create+Start)", f"RunPodSandbox {handler}",
            f"{CREATE_START} {handler}")


def _handler_start(target: Target, handler: str, cfg: object, got: dict[str, float]) -> None:
    """The usual pod's start under another runtime handler (e.g. runsc), then its end."""
    pods = target.pods
    start, run, create_start = handler_figures(handler)
    pod = pod_config(f"bench-{handler}-" + secrets.token_hex(4))
    got[run], sid = timed(lambda: pods.run(pod, handler))
    got[create_start], cid = timed(lambda: pods.create(sid, cfg, pod))
    got[create_start] += timed(lambda: pods.start(cid))[0]
    got[start] = got[run] + got[create_start]
    pods.stop_pod(sid)
    pods.remove_pod(sid)


def one_round(target: Target, runc: Runc, samples: dict[str, list[float]] | None,
              handler: str = "") -> None:
    """One CRI pod lifecycle (the kubelet's usual pod: no shared PID namespace), one
    hostNetwork pod start (the pod without CNI), one RunPodSandbox with a shared PID
    namespace, the usual pod's start under ``handler`` if given, and one runc
    create/start/delete; ``samples=None`` is a warm-up."""
    got: dict[str, float] = {}
    pods = target.pods
    pod = pod_config("bench-" + secrets.token_hex(4))
    got["RunPodSandbox"], sid = timed(lambda: pods.run(pod))
    cfg = container_config(target.image, "sleeper", SLEEP)
    got["CreateContainer"], cid = timed(lambda: pods.create(sid, cfg, pod))
    got["StartContainer"], _ = timed(lambda: pods.start(cid))
    got["StopContainer"], _ = timed(lambda: pods.stop(cid, timeout=0))
    got["RemoveContainer"], _ = timed(lambda: pods.remove(cid))
    got["StopPodSandbox"], _ = timed(lambda: pods.stop_pod(sid))
    got["RemovePodSandbox"], _ = timed(lambda: pods.remove_pod(sid))

    host_pod = pod_config("bench-host-" + secrets.token_hex(4), host_network=True)
    got["RunPodSandbox hostNetwork"], hid = timed(lambda: pods.run(host_pod))
    host_cs, host_cid = timed(lambda: pods.create(hid, cfg, host_pod))
    host_cs += timed(lambda: pods.start(host_cid))[0]
    pods.stop_pod(hid)  # stops its container too
    pods.remove_pod(hid)
    # shareProcessNamespace: a runtime needs a process to hold the pod's PID namespace.
    shared = pod_config("bench-shared-" + secrets.token_hex(4), shared_pid=True)
    got["RunPodSandbox shared PID"], pid_pod = timed(lambda: pods.run(shared))
    pods.stop_pod(pid_pod)
    pods.remove_pod(pid_pod)
    if handler:
        _handler_start(target, handler, cfg, got)

    rid = "bench-" + secrets.token_hex(6)
    runc.config_for(rid)
    got["runc create"], _ = timed(lambda: runc.create(rid))
    got["runc start"], _ = timed(lambda: runc.start(rid))
    runc.delete(rid)  # untimed: runc 1.1 polls the killed init every 100 ms

    # Sums per round, so a ratio's numerator is a median of sums, not a sum of medians.
    got[CREATE_START] = got["CreateContainer"] + got["StartContainer"]
    got[POD_START] = got["RunPodSandbox"] + got[CREATE_START]
    got[HOST_POD_START] = got["RunPodSandbox hostNetwork"] + host_cs
    got[RUNC_CS] = got["runc create"] + got["runc start"]
    if samples is not None:
        for name, ms in got.items():
            samples.setdefault(name, []).append(ms)


def run(target: Target, runc_binary: str, iterations: int, warmup: int = 1,
        handler: str = "") -> Section:
    sec = Section("lifecycle")
    runc = Runc.of_run(target.base, runc_binary)
    samples: dict[str, list[float]] = {}
    try:
        runc.prepare(SLEEP)
        for _ in range(warmup):
            one_round(target, runc, None, handler)
        for i in range(iterations):
            one_round(target, runc, samples, handler)
            print(f"\rlifecycle {i + 1}/{iterations}", end="", file=sys.stderr, flush=True)
        print(file=sys.stderr)
    finally:
        runc.cleanup()
    for name in FLOORS:
        sec.floor(name, samples[name])
    for name, floor in FIGURES.items():
        sec.figure(name, samples[name], floor=floor)
    if handler:
        # The default handler's pod start is this figure's floor: what the other handler
        # adds to the same pod's start.
        start, run_pod, create_start = handler_figures(handler)
        sec.floor(POD_START, samples[POD_START])
        sec.floor(CREATE_START, samples[CREATE_START])
        sec.floor("RunPodSandbox", samples["RunPodSandbox"])
        sec.figure(start, samples[start], floor=POD_START)
        sec.figure(run_pod, samples[run_pod], floor="RunPodSandbox")
        sec.figure(create_start, samples[create_start], floor=CREATE_START)
        sec.extra["runtime_handler"] = handler
    sec.notes.append("StopContainer of `sleep 3600` with timeout 0; the runc floor: pycrid's "
                     "base spec, no conmon, no CNI, root = an empty read-only directory with "
                     "the host's /usr bind-mounted read-only by runc, running the host's "
                     "`sleep 3600`")
    sec.extra["iterations"] = iterations
    return sec
