"""A minimal ``crictl`` stand-in over the real CRI gRPC API, for running docs/quickstart.md
where cri-tools is not installed (Debian does not package it; CI has none).

It implements only the subcommands and flags the quickstart uses, with crictl's output
where the quickstart relies on it: ``runp``/``create``/``start``/``stop``/``rm`` print the
id (``rm`` deletes the container's log file unless ``--keep-logs``, like crictl),
``stopp``/``rmp`` print "Stopped sandbox ID"/"Removed sandbox ID", ``ps -q`` prints
ids, ``logs`` prints the container's log, ``exec`` streams over SPDY like crictl and
``exec -s`` uses ExecSync; the exit code of an exec is crictl's exit code. The endpoint comes
from ``--runtime-endpoint``/``-r``, else ``CONTAINER_RUNTIME_ENDPOINT``, else the
``runtime-endpoint:`` line of ``--config``/``CRI_CONFIG_FILE``/``/etc/crictl.yaml``.

Run as ``python -m tests.support.crictl ARGS``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import glob
import json
import os
import sys
import time
from typing import Any

import grpc
from cri_api.v1 import api_pb2 as pb
from cri_api.v1 import api_pb2_grpc as pb_grpc
from google.protobuf import json_format

STATES = {pb.CONTAINER_CREATED: "Created", pb.CONTAINER_RUNNING: "Running",
          pb.CONTAINER_EXITED: "Exited", pb.CONTAINER_UNKNOWN: "Unknown"}


def _config_file_values(path: str) -> dict[str, str]:
    """``key: value`` lines of a crictl.yaml (the flat subset crictl's own file uses)."""
    out: dict[str, str] = {}
    try:
        with open(path) as f:
            for line in f:
                key, sep, value = line.partition(":")
                if sep and not line.startswith((" ", "#")):
                    out[key.strip()] = value.strip().strip("'\"")
    except FileNotFoundError:
        pass
    return out


def _endpoints(args: argparse.Namespace) -> tuple[str, str]:
    conf = _config_file_values(
        args.config or os.environ.get("CRI_CONFIG_FILE") or "/etc/crictl.yaml")
    runtime = (args.runtime_endpoint or os.environ.get("CONTAINER_RUNTIME_ENDPOINT")
               or conf.get("runtime-endpoint", ""))
    image = (args.image_endpoint or os.environ.get("IMAGE_SERVICE_ENDPOINT")
             or conf.get("image-endpoint", "") or runtime)
    if not runtime:
        raise SystemExit("crictl (stand-in): no runtime endpoint: set --runtime-endpoint, "
                         "CONTAINER_RUNTIME_ENDPOINT or runtime-endpoint in /etc/crictl.yaml")
    return runtime, image


def _read_config(path: str, message: Any) -> Any:
    with open(path) as f:
        return json_format.ParseDict(json.load(f), message, ignore_unknown_fields=False)


def _ago(ns: int) -> str:
    secs = max(0, int(time.time() - ns / 1e9))
    return f"{secs} seconds ago" if secs < 60 else f"{secs // 60} minutes ago"


def _container_ids(rt: Any, prefix: str) -> str:
    """Resolve a (prefix of a) container id as crictl does, through the runtime's filter."""
    resp = rt.ListContainers(pb.ListContainersRequest(
        filter=pb.ContainerFilter(id=prefix)), timeout=30)
    return str(resp.containers[0].id) if len(resp.containers) == 1 else prefix


async def _stream_exec(url: str) -> tuple[bytes, bytes, int]:
    from tests.support.streams import SpdyCommand

    session = await SpdyCommand.start(url, stdin=False)
    result = await session.wait(limit=300)
    return result.stdout, result.stderr, result.exit_code or 0


def _run(args: argparse.Namespace) -> int:
    runtime_ep, image_ep = _endpoints(args)
    rchan = grpc.insecure_channel(runtime_ep)
    ichan = rchan if image_ep == runtime_ep else grpc.insecure_channel(image_ep)
    rt = pb_grpc.RuntimeServiceStub(rchan)
    im = pb_grpc.ImageServiceStub(ichan)
    t = args.timeout
    cmd = args.command
    if cmd == "version":
        v = rt.Version(pb.VersionRequest(), timeout=t)
        print(f"Version:  {v.version}\nRuntimeName:  {v.runtime_name}\n"
              f"RuntimeVersion:  {v.runtime_version}\nRuntimeApiVersion:  "
              f"{v.runtime_api_version}")
    elif cmd == "pull":
        ref = im.PullImage(pb.PullImageRequest(image=pb.ImageSpec(image=args.image)), timeout=None)
        print(f"Image is up to date for {ref.image_ref}")
    elif cmd == "runp":
        config = _read_config(args.pod_config, pb.PodSandboxConfig())
        sid = rt.RunPodSandbox(pb.RunPodSandboxRequest(config=config, runtime_handler=args.runtime),
                               timeout=t).pod_sandbox_id
        print(sid)
    elif cmd == "create":
        ctr = _read_config(args.container_config, pb.ContainerConfig())
        pod = _read_config(args.pod_config, pb.PodSandboxConfig())
        cid = rt.CreateContainer(pb.CreateContainerRequest(
            pod_sandbox_id=args.pod_id, config=ctr, sandbox_config=pod), timeout=t).container_id
        print(cid)
    elif cmd in ("start", "stop", "rm"):
        for given in args.ids:
            cid = _container_ids(rt, given)
            if cmd == "start":
                rt.StartContainer(pb.StartContainerRequest(container_id=cid), timeout=t)
            elif cmd == "stop":
                req = pb.StopContainerRequest(container_id=cid, timeout=args.stop_timeout)
                rt.StopContainer(req, timeout=t + args.stop_timeout)
            else:
                log_path = rt.ContainerStatus(pb.ContainerStatusRequest(container_id=cid),
                                              timeout=t).status.log_path
                rt.RemoveContainer(pb.RemoveContainerRequest(container_id=cid), timeout=t)
                if log_path and not args.keep_logs:  # crictl deletes the log and rotations
                    for path in [log_path, *glob.glob(glob.escape(log_path) + ".*")]:
                        with contextlib.suppress(FileNotFoundError):
                            os.remove(path)
            print(given)
    elif cmd in ("stopp", "rmp"):
        for sid in args.ids:
            if cmd == "stopp":
                rt.StopPodSandbox(pb.StopPodSandboxRequest(pod_sandbox_id=sid), timeout=t)
                print(f"Stopped sandbox {sid}")
            else:
                rt.RemovePodSandbox(pb.RemovePodSandboxRequest(pod_sandbox_id=sid), timeout=t)
                print(f"Removed sandbox {sid}")
    elif cmd == "ps":
        flt = pb.ContainerFilter()
        if not args.all:
            flt.state.state = pb.CONTAINER_RUNNING
        ctrs = rt.ListContainers(pb.ListContainersRequest(filter=flt), timeout=t).containers
        if args.name:
            ctrs = [c for c in ctrs if args.name in c.metadata.name]
        if args.quiet:
            for c in ctrs:
                print(c.id)
        else:
            print(f"{'CONTAINER':<16}{'IMAGE':<24}{'CREATED':<18}{'STATE':<10}{'NAME':<12}"
                  f"{'ATTEMPT':<10}{'POD ID':<16}POD")
            pods = {p.id: p.metadata.name for p in rt.ListPodSandbox(
                pb.ListPodSandboxRequest(), timeout=t).items}
            for c in ctrs:
                print(f"{c.id[:13]:<16}{c.image.image[:22]:<24}{_ago(c.created_at):<18}"
                      f"{STATES.get(c.state, '?'):<10}{c.metadata.name:<12}"
                      f"{c.metadata.attempt:<10}{c.pod_sandbox_id[:13]:<16}"
                      f"{pods.get(c.pod_sandbox_id, '')}")
    elif cmd == "logs":
        cid = _container_ids(rt, args.id)
        path = rt.ContainerStatus(pb.ContainerStatusRequest(container_id=cid),
                                  timeout=t).status.log_path
        with open(path, "rb") as f:
            for line in f:
                # CRI log format: time stream P|F content
                parts = line.rstrip(b"\n").split(b" ", 3)
                if len(parts) < 4:
                    continue
                out = sys.stderr.buffer if parts[1] == b"stderr" else sys.stdout.buffer
                out.write(parts[3] + (b"\n" if parts[2] == b"F" else b""))
        sys.stdout.flush()
    elif cmd == "exec":
        cid = _container_ids(rt, args.id)
        if args.sync:
            r = rt.ExecSync(pb.ExecSyncRequest(container_id=cid, cmd=args.cmd,
                                               timeout=args.exec_timeout), timeout=None)
            out, err, code = r.stdout, r.stderr, r.exit_code
        else:
            url = rt.Exec(pb.ExecRequest(container_id=cid, cmd=args.cmd, stdout=True,
                                         stderr=True), timeout=t).url
            out, err, code = asyncio.run(_stream_exec(url))
        sys.stdout.buffer.write(out)
        sys.stdout.flush()
        sys.stderr.buffer.write(err)
        return code
    return 0


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="crictl", description="crictl stand-in (see module doc)")
    p.add_argument("--runtime-endpoint", "-r", default="")
    p.add_argument("--image-endpoint", "-i", default="")
    p.add_argument("--config", "-c", default="")
    p.add_argument("--timeout", "-t", type=float, default=60.0)
    sub = p.add_subparsers(dest="command", required=True)
    sub.add_parser("version")
    pull = sub.add_parser("pull")
    pull.add_argument("image")
    runp = sub.add_parser("runp")
    runp.add_argument("--runtime", default="")
    runp.add_argument("pod_config")
    create = sub.add_parser("create")
    create.add_argument("pod_id")
    create.add_argument("container_config")
    create.add_argument("pod_config")
    for name in ("start", "stopp", "rmp"):
        sub.add_parser(name).add_argument("ids", nargs="+")
    rm = sub.add_parser("rm")
    rm.add_argument("--keep-logs", action="store_true")
    rm.add_argument("ids", nargs="+")
    stop = sub.add_parser("stop")
    stop.add_argument("--timeout", "-t", dest="stop_timeout", type=int, default=0)
    stop.add_argument("ids", nargs="+")
    ps = sub.add_parser("ps")
    ps.add_argument("--all", "-a", action="store_true")
    ps.add_argument("--quiet", "-q", action="store_true")
    ps.add_argument("--name", default="")
    logs = sub.add_parser("logs")
    logs.add_argument("id")
    ex = sub.add_parser("exec")
    ex.add_argument("--sync", "-s", action="store_true")
    ex.add_argument("--timeout", dest="exec_timeout", type=int, default=0)
    ex.add_argument("id")
    ex.add_argument("cmd", nargs=argparse.REMAINDER)
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        return _run(args)
    except grpc.RpcError as e:
        print(f"crictl (stand-in): {e.code().name}: {e.details()}", file=sys.stderr)  # type: ignore[attr-defined]
        return 1


if __name__ == "__main__":
    sys.exit(main())
