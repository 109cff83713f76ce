"""``pycrid status`` and ``pycrid nri plugins``: ask a running daemon over its CRI socket
(``Status`` with ``verbose``) and print what its info map says."""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from typing import Any, TextIO

#: Exit codes: every condition true / a condition false / the daemon could not be asked.
OK, NOT_READY, UNREACHABLE = 0, 1, 2


class Unreachable(Exception):
    pass


@dataclass
class Report:
    version: dict[str, str]
    conditions: list[dict[str, Any]]
    info: dict[str, Any]


def ask(socket_path: str, timeout: float = 10) -> Report:
    """One Version and one verbose Status call; Unreachable names the socket."""
    import grpc
    from cri_api.v1 import api_pb2 as pb
    from cri_api.v1 import api_pb2_grpc as pb_grpc

    path = socket_path.removeprefix("unix://")
    try:
        with grpc.insecure_channel(f"unix://{path}") as channel:
            stub = pb_grpc.RuntimeServiceStub(channel)  # type: ignore[no-untyped-call]
            ver = stub.Version(pb.VersionRequest(), timeout=timeout)
            st = stub.Status(pb.StatusRequest(verbose=True), timeout=timeout)
    except grpc.RpcError as e:
        raise Unreachable(f"cannot reach pycrid on {path}: {e.code().name}: "
                          f"{e.details()}") from None
    info: dict[str, Any] = {}
    for key, text in st.info.items():
        try:
            info[key] = json.loads(text)
        except ValueError:
            info[key] = text
    return Report(
        version={"name": ver.runtime_name, "version": ver.runtime_version,
                 "api_version": ver.runtime_api_version},
        conditions=[{"type": c.type, "status": c.status, "reason": c.reason,
                     "message": c.message} for c in st.status.conditions],
        info=info)


def _ready(report: Report) -> bool:
    want = {"RuntimeReady", "NetworkReady"}
    return all(c["status"] for c in report.conditions if c["type"] in want) and want <= {
        c["type"] for c in report.conditions}


def _short(counts: dict[str, int], prefix: str) -> str:
    return ", ".join(f"{n} {state.removeprefix(prefix).lower().replace('_', ' ')}"
                     for state, n in counts.items())


def _asked(socket_path: str) -> tuple[Report, dict[str, Any]] | None:
    """The report and its ``nri`` part; None (said on stderr) when unreachable."""
    try:
        report = ask(socket_path)
    except Unreachable as e:
        print(f"pycrid: {e}", file=sys.stderr)
        return None
    return report, report.info.get("nri") or {"enabled": False, "socket": "", "plugins": []}


def status(socket_path: str, as_json: bool, out: TextIO = sys.stdout) -> int:
    asked = _asked(socket_path)
    if asked is None:
        return UNREACHABLE
    report, nri = asked
    pods = report.info.get("pods") or {}
    ctrs = report.info.get("containers") or {}
    if as_json:
        json.dump({"runtime": report.version, "conditions": report.conditions, "pods": pods,
                   "containers": ctrs, "nri": nri}, out, sort_keys=True)
        out.write("\n")
    else:
        v = report.version
        rows = [("Runtime", f"{v['name']} {v['version']} (CRI {v['api_version']})")]
        for c in report.conditions:
            text = "true" if c["status"] else "false"
            if c["reason"] or c["message"]:
                text += f" ({c['reason']}: {c['message']})"
            rows.append((c["type"], text))
        rows.append(("Pods", _short(pods, "SANDBOX_")))
        rows.append(("Containers", _short(ctrs, "CONTAINER_")))
        if nri.get("enabled"):
            where = f"socket {nri['socket']}" if nri.get("socket") else "no socket"
            rows.append(("NRI plugins", f"{len(nri.get('plugins', []))} ({where})"))
        else:
            rows.append(("NRI plugins", "NRI disabled"))
        width = max(len(k) for k, _ in rows) + 2
        for key, text in rows:
            out.write(f"{key + ':':<{width}}{text}\n")
    return OK if _ready(report) else NOT_READY


def plugin_totals(plugin: dict[str, Any]) -> tuple[int, int, float]:
    """(calls, errors, mean latency in ms) over every method of one plugin."""
    calls = plugin.get("calls", {})
    count = sum(c["count"] for c in calls.values())
    errors = sum(c["errors"] for c in calls.values())
    total_ms = sum(c["mean_ms"] * c["count"] for c in calls.values())
    return count, errors, (total_ms / count if count else 0.0)


def nri_plugins(socket_path: str, as_json: bool, out: TextIO = sys.stdout) -> int:
    asked = _asked(socket_path)
    if asked is None:
        return UNREACHABLE
    nri = asked[1]
    if as_json:
        json.dump(nri, out, sort_keys=True)
        out.write("\n")
        return OK
    if not nri.get("enabled"):
        out.write("NRI is disabled\n")
        return OK
    rows = [("INDEX", "NAME", "EVENTS", "CALLS", "ERRORS", "MEAN")]
    for p in nri.get("plugins", []):
        calls, errors, mean = plugin_totals(p)
        rows.append((p["index"], p["name"], ",".join(p["events"]), str(calls), str(errors),
                     f"{mean:.2f}ms"))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        out.write("  ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)).rstrip()
                  + "\n")
    return OK
