"""CDI injection: spec files in temporary directories, edits on a plain OCI spec dict."""

from __future__ import annotations

import copy
import json
import logging
import os
from pathlib import Path
from typing import Any

import pytest
import yaml

from pycrid.errors import FailedPrecondition, InvalidArgument
from pycrid.oci.cdi import DEFAULT_SPEC_DIRS, CdiRegistry
from pycrid.oci.cdi_specs import HOOK_NAMES

KIND = "vendor.com/gpu"
NULL_NODE = {"path": "/dev/null"}  # a char device (1, 3) on every Linux host


def write(dir_: Path, name: str, devices: dict[str, dict[str, Any]], *,
          kind: str = KIND, edits: dict[str, Any] | None = None) -> Path:
    doc: dict[str, Any] = {"cdiVersion": "0.7.0", "kind": kind,
                           "devices": [{"name": n, "containerEdits": e}
                                       for n, e in devices.items()]}
    if edits is not None:
        doc["containerEdits"] = edits
    dir_.mkdir(parents=True, exist_ok=True)
    path = dir_ / name
    text = yaml.safe_dump(doc) if name.endswith((".yaml", ".yml")) else json.dumps(doc)
    path.write_text(text)
    return path


def base_spec(uid: int = 0, gid: int = 0) -> dict[str, Any]:
    return {
        "process": {"env": ["PATH=/bin", "A=old"], "user": {"uid": uid, "gid": gid}},
        "mounts": [{"destination": "/proc", "type": "proc", "source": "proc"},
                   {"destination": "/dev/shm/x", "type": "bind", "source": "/s"},
                   {"destination": "/etc/hosts", "type": "bind", "source": "/h"}],
        "linux": {"namespaces": [{"type": "mount"}], "devices": [],
                  "resources": {"devices": [{"allow": False, "access": "rwm"}]}},
    }


def inject(tmp_path: Path, edits: dict[str, Any], spec: dict[str, Any] | None = None,
           ) -> dict[str, Any]:
    write(tmp_path / "cdi", "v.json", {"d": edits})
    spec = spec if spec is not None else base_spec()
    CdiRegistry([str(tmp_path / "cdi")]).inject(spec, [f"{KIND}=d"])
    return spec


def test_defaults() -> None:
    assert DEFAULT_SPEC_DIRS == ("/etc/cdi", "/var/run/cdi")
    assert CdiRegistry().spec_dirs == DEFAULT_SPEC_DIRS


def test_env_replaces_by_name_or_appends(tmp_path: Path) -> None:
    spec = inject(tmp_path, {"env": ["A=new", "B=1", "B=2"]})
    assert spec["process"]["env"] == ["PATH=/bin", "A=new", "B=2"]


def test_device_node_completed_from_host(tmp_path: Path) -> None:
    spec = inject(tmp_path, {"deviceNodes": [NULL_NODE]})
    mode = os.stat("/dev/null").st_mode & 0o7777
    assert spec["linux"]["devices"] == [
        {"path": "/dev/null", "type": "c", "major": 1, "minor": 3, "fileMode": mode}]
    assert spec["linux"]["resources"]["devices"][-1] == {
        "allow": True, "type": "c", "major": 1, "minor": 3, "access": "rwm"}


def test_device_node_given_fields_win(tmp_path: Path) -> None:
    node = {"path": "/dev/gpu0", "hostPath": "/dev/null", "fileMode": 0o600,
            "permissions": "rw", "uid": 5, "gid": 6}
    spec = inject(tmp_path, {"deviceNodes": [node]})
    assert spec["linux"]["devices"] == [{"path": "/dev/gpu0", "type": "c", "major": 1,
                                         "minor": 3, "fileMode": 0o600, "uid": 5, "gid": 6}]
    assert spec["linux"]["resources"]["devices"][-1]["access"] == "rw"


def test_device_node_permissions_none(tmp_path: Path) -> None:
    spec = inject(tmp_path, {"deviceNodes": [{**NULL_NODE, "permissions": "none"}]})
    assert spec["linux"]["resources"]["devices"][-1]["access"] == ""


def test_device_node_owner_defaults_to_process_user(tmp_path: Path) -> None:
    spec = inject(tmp_path, {"deviceNodes": [NULL_NODE]}, base_spec(uid=1000, gid=2000))
    assert spec["linux"]["devices"][0]["uid"] == 1000
    assert spec["linux"]["devices"][0]["gid"] == 2000


def test_device_node_fully_given_needs_no_host_node(tmp_path: Path) -> None:
    node = {"path": "/dev/sdz", "hostPath": str(tmp_path / "absent"),
            "type": "b", "major": 8, "minor": 9}
    spec = inject(tmp_path, {"deviceNodes": [node]})
    assert spec["linux"]["devices"] == [{"path": "/dev/sdz", "type": "b", "major": 8,
                                         "minor": 9}]
    assert spec["linux"]["resources"]["devices"][-1] == {
        "allow": True, "type": "b", "major": 8, "minor": 9, "access": "rwm"}


def test_device_node_missing_host_node_fails_untouched(tmp_path: Path) -> None:
    spec = base_spec()
    before = copy.deepcopy(spec)
    edits = {"env": ["X=1"], "deviceNodes": [{"path": str(tmp_path / "absent")}]}
    with pytest.raises(FailedPrecondition, match="failed to stat CDI host device"):
        inject(tmp_path, edits, spec)
    assert spec == before


def test_device_node_not_a_device_or_wrong_type(tmp_path: Path) -> None:
    regular = tmp_path / "file"
    regular.write_text("")
    with pytest.raises(FailedPrecondition, match="not a device node"):
        inject(tmp_path, {"deviceNodes": [{"path": str(regular)}]})
    with pytest.raises(FailedPrecondition, match=r"host type mismatch \(b, c\)"):
        inject(tmp_path, {"deviceNodes": [{**NULL_NODE, "type": "b"}]})


def test_device_node_fifo_gets_no_cgroup_rule(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo, 0o640)
    spec = inject(tmp_path, {"deviceNodes": [{"path": str(fifo)}]})
    assert spec["linux"]["devices"] == [{"path": str(fifo), "type": "p", "major": 0,
                                         "minor": 0, "fileMode": 0o640}]
    assert spec["linux"]["resources"]["devices"] == [{"allow": False, "access": "rwm"}]


def test_device_node_replaces_same_path(tmp_path: Path) -> None:
    spec = base_spec()
    spec["linux"]["devices"] = [{"path": "/dev/null", "type": "c", "major": 9, "minor": 9}]
    inject(tmp_path, {"deviceNodes": [{**NULL_NODE, "fileMode": 0o644}]}, spec)
    assert spec["linux"]["devices"] == [{"path": "/dev/null", "type": "c", "major": 1,
                                         "minor": 3, "fileMode": 0o644}]


def test_mounts_replace_and_sort_by_depth(tmp_path: Path) -> None:
    mounts = [{"hostPath": "/host/lib", "containerPath": "/usr/lib/vendor",
               "options": ["ro", "bind"], "type": "bind"},
              {"hostPath": "/host/hosts", "containerPath": "/etc/hosts"},
              {"hostPath": "/host/bin", "containerPath": "/opt"}]
    spec = inject(tmp_path, {"mounts": mounts})
    assert spec["mounts"] == [
        {"destination": "/proc", "type": "proc", "source": "proc"},
        {"destination": "/opt", "source": "/host/bin"},
        {"destination": "/etc/hosts", "source": "/host/hosts"},
        {"destination": "/dev/shm/x", "type": "bind", "source": "/s"},
        {"destination": "/usr/lib/vendor", "source": "/host/lib", "type": "bind",
         "options": ["ro", "bind"]},
    ]


def test_mounts_idmapped_with_user_namespace(tmp_path: Path) -> None:
    spec = base_spec()
    spec["linux"]["namespaces"].append({"type": "user"})
    mounts = [{"hostPath": "/a", "containerPath": "/a", "options": ["rbind"]},
              {"hostPath": "/b", "containerPath": "/b", "type": "bind"},
              {"hostPath": "/c", "containerPath": "/c", "options": ["bind", "idmap"]},
              {"hostPath": "tmpfs", "containerPath": "/d", "type": "tmpfs"}]
    inject(tmp_path, {"mounts": mounts}, spec)
    by_dest = {m["destination"]: m.get("options") for m in spec["mounts"]}
    assert by_dest["/a"] == ["rbind", "ridmap"]
    assert by_dest["/b"] == ["idmap"]
    assert by_dest["/c"] == ["bind", "idmap"]
    assert by_dest["/d"] is None


def test_hooks_go_to_their_lists(tmp_path: Path) -> None:
    hooks: list[dict[str, Any]] = [{"hookName": n, "path": f"/bin/{n}"} for n in HOOK_NAMES]
    hooks.append({"hookName": "createContainer", "path": "/bin/x", "args": ["x", "-v"],
                  "env": ["K=V"], "timeout": 5})
    spec = inject(tmp_path, {"hooks": hooks})
    assert set(spec["hooks"]) == set(HOOK_NAMES)
    assert spec["hooks"]["poststop"] == [{"path": "/bin/poststop"}]
    assert spec["hooks"]["createContainer"] == [
        {"path": "/bin/createContainer"},
        {"path": "/bin/x", "args": ["x", "-v"], "env": ["K=V"], "timeout": 5}]


def test_additional_gids(tmp_path: Path) -> None:
    spec = inject(tmp_path, {"additionalGids": [0, 44, 10, 44]})
    assert spec["process"]["user"]["additionalGids"] == [44, 10]
    spec = base_spec()
    spec["process"]["user"]["additionalGids"] = [10]
    inject(tmp_path, {"additionalGIDs": [10, 20]}, spec)
    assert spec["process"]["user"]["additionalGids"] == [10, 20]


def test_spec_edits_once_then_device_edits(tmp_path: Path) -> None:
    write(tmp_path, "v.json", {"a": {"env": ["DEV=a"]}, "b": {"env": ["DEV_B=b"]}},
          edits={"env": ["SHARED=1"], "additionalGids": [7]})
    write(tmp_path, "w.json", {"c": {"env": ["C=1"]}}, kind="other.io/x",
          edits={"env": ["OTHER=1"]})
    spec = base_spec()
    CdiRegistry([str(tmp_path)]).inject(spec, [f"{KIND}=a", "other.io/x=c", f"{KIND}=b"])
    assert spec["process"]["env"] == ["PATH=/bin", "A=old", "SHARED=1", "DEV=a",
                                      "OTHER=1", "C=1", "DEV_B=b"]
    assert spec["process"]["user"]["additionalGids"] == [7]


def test_unresolvable_devices_named(tmp_path: Path) -> None:
    write(tmp_path, "v.json", {"a": {"env": ["A=1"]}})
    spec = base_spec()
    with pytest.raises(InvalidArgument) as e:
        CdiRegistry([str(tmp_path)]).inject(
            spec, [f"{KIND}=a", f"{KIND}=x", "a", "vendor.com/other=a"])
    assert str(e.value) == ("unresolvable CDI devices vendor.com/gpu=x, a, "
                            "vendor.com/other=a")
    assert spec == base_spec()


def test_no_devices_and_missing_dirs(tmp_path: Path) -> None:
    spec = base_spec()
    CdiRegistry([str(tmp_path / "none")]).inject(spec, [])
    assert spec == base_spec()
    with pytest.raises(InvalidArgument, match=r"unresolvable CDI devices vendor\.com/gpu=a"):
        CdiRegistry([str(tmp_path / "none")]).inject(spec, [f"{KIND}=a"])


def test_later_directory_overrides(tmp_path: Path) -> None:
    write(tmp_path / "etc", "v.json", {"a": {"env": ["FROM=etc"]}, "b": {"env": ["B=etc"]}})
    write(tmp_path / "run", "v.yaml", {"a": {"env": ["FROM=run"]}})
    spec = base_spec()
    CdiRegistry([str(tmp_path / "etc"), str(tmp_path / "run")]).inject(
        spec, [f"{KIND}=a", f"{KIND}=b"])
    assert spec["process"]["env"][2:] == ["FROM=run", "B=etc"]


def test_same_directory_conflict_drops_device(tmp_path: Path,
                                              caplog: pytest.LogCaptureFixture) -> None:
    write(tmp_path / "etc", "v1.json", {"a": {"env": ["X=1"]}, "b": {"env": ["B=1"]}})
    write(tmp_path / "etc", "v2.json", {"a": {"env": ["X=2"]}})
    reg = CdiRegistry([str(tmp_path / "etc")])
    with caplog.at_level(logging.WARNING), pytest.raises(InvalidArgument):
        reg.inject(base_spec(), [f"{KIND}=a"])
    assert "conflicting CDI device vendor.com/gpu=a" in caplog.text
    reg.inject(base_spec(), [f"{KIND}=b"])
    # A later directory settles the conflict.
    write(tmp_path / "run", "v.json", {"a": {"env": ["X=3"]}})
    spec = base_spec()
    CdiRegistry([str(tmp_path / "etc"), str(tmp_path / "run")]).inject(spec, [f"{KIND}=a"])
    assert spec["process"]["env"][-1] == "X=3"


@pytest.mark.parametrize("content", [
    "{not json",
    '["a list"]',
    json.dumps({"kind": KIND, "devices": [{"name": "a", "containerEdits": {"env": ["A=1"]}}]}),
    json.dumps({"cdiVersion": "0.7.0", "kind": "gpu",
                "devices": [{"name": "a", "containerEdits": {"env": ["A=1"]}}]}),
    json.dumps({"cdiVersion": "0.7.0", "kind": KIND, "devices": []}),
    json.dumps({"cdiVersion": "0.7.0", "kind": KIND, "devices": [{"name": "a"}]}),
    json.dumps({"cdiVersion": "0.7.0", "kind": KIND,
                "devices": [{"name": "-a", "containerEdits": {"env": ["A=1"]}}]}),
    json.dumps({"cdiVersion": "0.7.0", "kind": KIND,
                "devices": [{"name": "a", "containerEdits": {"env": ["=1"]}}]}),
    json.dumps({"cdiVersion": "0.7.0", "kind": KIND,
                "devices": [{"name": "a", "containerEdits": {
                    "hooks": [{"hookName": "later", "path": "/x"}]}}]}),
    json.dumps({"cdiVersion": "0.7.0", "kind": KIND,
                "devices": [{"name": "a", "containerEdits": {
                    "deviceNodes": [{"path": "/dev/x", "permissions": "rwx"}]}}]}),
    json.dumps({"cdiVersion": "0.7.0", "kind": KIND,
                "devices": [{"name": "a", "containerEdits": {"mounts": [{"hostPath": "/x"}]}}]}),
])
def test_invalid_spec_file_skipped(tmp_path: Path, caplog: pytest.LogCaptureFixture,
                                   content: str) -> None:
    (tmp_path / "bad.json").write_text(content)
    write(tmp_path, "good.yml", {"ok": {"env": ["OK=1"]}}, kind="good.io/c")
    reg = CdiRegistry([str(tmp_path)])
    spec = base_spec()
    with caplog.at_level(logging.WARNING):
        reg.inject(spec, ["good.io/c=ok"])
        with pytest.raises(InvalidArgument):
            reg.inject(spec, [f"{KIND}=a"])
    assert spec["process"]["env"][-1] == "OK=1"
    assert "skipping CDI spec" in caplog.text and "bad.json" in caplog.text


def test_other_files_ignored_and_specs_reread(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("garbage")
    (tmp_path / "sub.json").mkdir()
    reg = CdiRegistry([str(tmp_path)])
    with pytest.raises(InvalidArgument):
        reg.inject(base_spec(), [f"{KIND}=a"])
    write(tmp_path, "v.yaml", {"a": {"env": ["A=1"]}})
    spec = base_spec()
    reg.inject(spec, [f"{KIND}=a"])
    assert spec["process"]["env"][-1] == "A=1"
