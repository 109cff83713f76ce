"""``pycrid status`` and ``pycrid nri plugins``: ask a running daemon over its CRI socket
(``Status`` with ``verbose``) and print what its info map says."""

from __future__ import annotations

import json
import os
import socket
import stat
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
    """One Version and one verbose Status call; Unreachable says, in words, why not."""
    import grpc
    from cri_api.v1 import api_pb2 as pb
    from cri_api.v1 import api_pb2_grpc as pb_grpc

    path = socket_path.removeprefix("unix://")
    try:
        with grpc.insecure_channel(f"unix://{path}") as channel:
            stub = pb_grpc.RuntimeServiceStub(channel)
            ver = stub.Version(pb.VersionRequest(), timeout=timeout)
            st = stub.Status(pb.StatusRequest(verbose=True), timeout=timeout)
    except grpc.RpcError as e:
        why = why_unreachable(path)
        if why:
            raise Unreachable(f"nothing answers at {path}: {why}") from None
        raise Unreachable(f"{path} accepts connections but the CRI call failed: "
                          f"{e.code().name}: {e.details()}") from None
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


def why_unreachable(path: str) -> str:
    """Why a client cannot talk to ``path``, from a plain connect ("" when it connects):
    gRPC's own error chain says none of this."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return ("no such file (pycrid is not running, or runs with another --address; "
                "pass --address or --config to ask that one)")
    except PermissionError:
        return "permission denied on its directory (run as root)"
    except OSError as e:
        return e.strerror or str(e)
    if not stat.S_ISSOCK(st.st_mode):
        return "it is not a socket"
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.settimeout(5)
    try:
        probe.connect(path)
    except ConnectionRefusedError:
        return ("connection refused (the socket file is there but no process listens on it: "
                "the daemon stopped or died)")
    except PermissionError:
        return ("permission denied (the socket is mode "
                f"{stat.S_IMODE(st.st_mode):04o}, owner {st.st_uid}, group {st.st_gid}: run "
                "as root or as a member of that group, [grpc] gid)")
    except OSError as e:
        return e.strerror or str(e)
    finally:
        probe.close()
    return ""


def _ready(report: Report) -> bool:
    want = {"RuntimeReady", "NetworkReady"}
    return all(c["status"] for c in report.conditions if c["type"] in want) and want <= {
        c["type"] for c in report.conditions}


def _short(counts: dict[str, int], prefix: str) -> str:
    return ", ".join(f"{n} {state.removeprefix(prefix).lower().replace('_', ' ')}"
                     for state, n in counts.items())


def _asked(socket_path: str, as_json: bool,
           out: TextIO) -> tuple[Report, dict[str, Any]] | None:
    """The report and its ``nri`` part; None when unreachable, said on stderr (or as
    ``{"ready": false, "error": ...}`` on ``out`` for --json)."""
    try:
        report = ask(socket_path)
    except Unreachable as e:
        unreachable(str(e), as_json, out)
        return None
    return report, report.info.get("nri") or {"enabled": False, "socket": "", "plugins": []}


def unreachable(message: str, as_json: bool, out: TextIO = sys.stdout) -> int:
    """Say that the daemon could not be asked; --json keeps stdout JSON."""
    if as_json:
        json.dump({"ready": False, "error": message}, out, sort_keys=True)
        out.write("\n")
    else:
        print(f"pycrid: {message}", file=sys.stderr)
    return UNREACHABLE


def status(socket_path: str, as_json: bool, out: TextIO = sys.stdout) -> int:
    """The whole picture; exit 0 only when RuntimeReady and NetworkReady are true (a health
    check), 1 when one is not, 2 when the daemon cannot be asked."""
    asked = _asked(socket_path, as_json, out)
    if asked is None:
        return UNREACHABLE
    report, nri = asked
    info = report.info
    doc = {"runtime": report.version, "ready": _ready(report),
           "conditions": report.conditions, "daemon": info.get("daemon") or {},
           "streaming": info.get("streaming") or {}, "pods": info.get("pods") or {},
           "containers": info.get("containers") or {}, "images": info.get("images") or {},
           "nri": nri, "network": _network(info.get("cniconfig") or {}),
           "handlers": list((info.get("handlers") or {}).values()),
           "checkpoint": info.get("checkpoint") or {},
           "warnings": info.get("warnings") or []}
    if as_json:
        json.dump(doc, out, sort_keys=True)
        out.write("\n")
    else:
        _print_rows(out, _status_rows(doc))
    return OK if doc["ready"] else NOT_READY


def _network(cni: dict[str, Any]) -> dict[str, Any]:
    """containerd's ``cniconfig`` shape, reduced to what an operator looks at."""
    return {"conf_dir": cni.get("PluginConfDir", ""), "error": cni.get("Error", ""),
            "networks": [{"name": n["Config"]["Name"], "source": n["Config"]["Source"],
                          "plugins": n["Config"]["Plugins"], "interface": n["IFName"]}
                         for n in cni.get("Networks") or []]}


def _uptime(seconds: float) -> str:
    s = int(seconds)
    d, s = divmod(s, 86400)
    h, s = divmod(s, 3600)
    m, s = divmod(s, 60)
    return (f"{d}d " if d else "") + f"{h:02d}:{m:02d}:{s:02d}"


def _status_rows(doc: dict[str, Any]) -> list[tuple[str, str]]:
    v, d = doc["runtime"], doc["daemon"]
    rows = [("Runtime", f"{v['name']} {v['version']} (CRI {v['api_version']})")]
    if d:
        if "version" in d:  # a pycrid older than 0.2.0 does not say
            rows.append(("Release", f"{d['version']}, commit {d['commit'] or 'unknown'}"))
        rows += [("PID", f"{d['pid']}, up {_uptime(d['uptime_seconds'])} "
                         f"(since {d['started_at']})"),
                 ("Config", d["config_file"] or "embedded defaults (no config file)"),
                 ("Root, state", f"{d['root']}, {d['state']}")]
        socks = d.get("sockets") or {}
        rows.append(("CRI socket", socks.get("cri", "")))
        if doc["streaming"].get("url"):
            rows.append(("Streaming", doc["streaming"]["url"]))
        rows.append(("NRI socket", socks.get("nri") or "none (no external plugins)"))
        rows.append(("Metrics", f"http://{socks['metrics']}/v1/metrics" if socks.get("metrics")
                     else "off ([metrics] address)"))
        rows.append(("containerd API", f"{socks['containerd']} (read-only, for cAdvisor)"
                     if socks.get("containerd") else "not served"))
    for c in doc["conditions"]:
        text = "true" if c["status"] else "false"
        if c["reason"] or c["message"]:
            text += f" ({c['reason']}: {c['message']})"
        rows.append((c["type"], text))
    rows += _handler_rows(doc["handlers"])
    net = doc["network"]
    names = ", ".join(f"{n['name']} ({n['source']})" for n in net["networks"])
    rows.append(("CNI networks", names or f"none in {net['conf_dir']}"))
    rows.append(("Pods", _short(doc["pods"], "SANDBOX_")))
    rows.append(("Containers", _short(doc["containers"], "CONTAINER_")))
    img = doc["images"]
    if img:
        rows.append(("Images", f"{img['count']} ({img['bytes'] / (1 << 20):.1f} MiB), "
                               f"sandbox image {img['sandbox_image']}"))
        sp = img.get("signature_policy") or {}
        if sp:
            text = f"{sp['signature_policy'] or '(none)'}: {sp['state']}"
            if sp.get("namespaces"):
                text += (f"; namespaces with their own in {sp['signature_policy_dir']}: "
                         f"{', '.join(sp['namespaces'])}")
            rows.append(("Signature policy", text))
    nri = doc["nri"]
    if not nri.get("enabled"):
        rows.append(("NRI plugins", "NRI disabled"))
    else:
        plugins = nri.get("plugins", [])
        rows.append(("NRI plugins", str(len(plugins)) if plugins else "none connected"))
        for p in plugins:
            calls, errors, _ = plugin_totals(p)
            text = f"{','.join(p['events']) or '-'}; {calls} calls, {errors} errors"
            if p.get("last_error"):
                text += f"; last error: {p['last_error']}"
            rows.append((f"  {p['index']}-{p['name']}", text))
    if doc["checkpoint"]:
        rows.append(("Checkpoint", _checkpoint(doc["checkpoint"])))
    for w in doc["warnings"]:
        rows.append(("Warning", w))
    return rows


def _checkpoint(cp: dict[str, Any]) -> str:
    """Whether CheckpointContainer works, with which CRIU, for which handlers; else why."""
    if cp.get("criu_error"):
        return f"not possible: {cp['criu_error']}"
    handlers = cp.get("handlers") or {}
    able = [n for n, why in handlers.items() if not why]
    text = f"CRIU {cp.get('criu_version', '')} ({cp.get('criu', '')}); "
    text += f"handlers {', '.join(able)}" if able else "no handler can"
    refused = [f"{n}: {why}" for n, why in handlers.items() if why]
    return text + (f"; not {'; '.join(refused)}" if refused else "")


def _handler_rows(handlers: list[dict[str, Any]]) -> list[tuple[str, str]]:
    rows = [("Runtime handlers", ", ".join(
        h["name"] + (" (default)" if h["default"] else "") for h in handlers) or "none")]
    for h in handlers:
        kind = (f"gVisor runsc {h['version']}".rstrip() if h["sandboxed"]
                else "runc under conmon")
        can = [what for what, yes in (("user namespaces", h["user_namespaces"]),
                                      ("recursive read-only mounts",
                                       h["recursive_read_only_mounts"]),
                                      ("resource updates", h["update_resources"])) if yes]
        if not h["user_namespaces"] and not h["sandboxed"]:
            # What user-namespace pods need of a runc (docs/user-namespaces.md).
            can.insert(0, "no user namespaces (its runc lacks idmapped mounts: runc 1.2 "
                          "or later)")
        pause = "always with" if h["pod_sandbox"] == "pause" else "with or without"
        text = (f"{kind}, {h['binary']}, pods {pause} a pause; "
                f"{', '.join(can) or 'no user namespaces, rro mounts or resource updates'}")
        if h["flags"]:
            text += f"; flags {' '.join(h['flags'])}"
        rows.append((f"  {h['name']}", text))
    return rows


def _print_rows(out: TextIO, rows: list[tuple[str, str]]) -> None:
    width = max(len(k) for k, _ in rows) + 2
    for key, text in rows:
        out.write(f"{key + ':':<{width}}{text}\n")


def plugin_totals(plugin: dict[str, Any]) -> tuple[int, int, float]:
    """(calls, errors, mean latency in ms) over every method of one plugin."""
    calls = plugin.get("calls", {})
    count = sum(c["count"] for c in calls.values())
    errors = sum(c["errors"] for c in calls.values())
    total_ms = sum(c["mean_ms"] * c["count"] for c in calls.values())
    return count, errors, (total_ms / count if count else 0.0)


def nri_plugins(socket_path: str, as_json: bool, out: TextIO = sys.stdout) -> int:
    asked = _asked(socket_path, as_json, out)
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
    rows = [("INDEX", "NAME", "EVENTS", "CALLS", "ERRORS", "MEAN", "LAST ERROR")]
    for p in nri.get("plugins", []):
        calls, errors, mean = plugin_totals(p)
        rows.append((p["index"], p["name"], ",".join(p["events"]), str(calls), str(errors),
                     f"{mean:.2f}ms", p.get("last_error") or "-"))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        out.write("  ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)).rstrip()
                  + "\n")
    return OK
