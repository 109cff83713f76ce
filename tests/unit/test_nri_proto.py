"""The NRI proto: generated modules are current, and the API has upstream's shape."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from pycrid.nri import api
from pycrid.nri.proto import nri_pb2, ttrpc_pb2

ROOT = Path(__file__).resolve().parents[2]
GENERATED = ["nri_pb2.py", "nri_pb2.pyi", "ttrpc_pb2.py", "ttrpc_pb2.pyi"]


def test_generated_modules_are_current(tmp_path: Path) -> None:
    subprocess.run(
        ["bash", str(ROOT / "scripts" / "gen-proto.sh"), str(tmp_path)],
        check=True,
        env={"PYTHON": sys.executable, "PATH": "/usr/bin:/bin"},
        cwd=ROOT,
    )
    for name in GENERATED:
        fresh = (tmp_path / "pycrid" / "nri" / "proto" / name).read_text()
        committed = (ROOT / "src" / "pycrid" / "nri" / "proto" / name).read_text()
        assert fresh == committed, f"{name} is stale: run scripts/gen-proto.sh"


def test_api_has_upstream_shape() -> None:
    desc = nri_pb2.DESCRIPTOR
    assert desc.package == "nri.pkg.api.v1alpha1"
    assert len(desc.message_types_by_name) == 85
    nested_enums = sum(len(m.enum_types) for m in desc.message_types_by_name.values())
    assert len(desc.enum_types_by_name) + nested_enums == 10
    services = {name: len(s.methods) for name, s in desc.services_by_name.items()}
    assert services == {"Runtime": 2, "Plugin": 18, "HostFunctions": 1}
    assert len(api.EVENT_METHODS) == api.Event.LAST - 1
    assert api.VALID_EVENTS == 0x3FFF


def test_field_numbers_that_are_easy_to_get_wrong() -> None:
    # ConfigureResponse.events is field 2 and ContainerAdjustment starts at 2.
    assert api.ConfigureResponse.DESCRIPTOR.fields_by_name["events"].number == 2
    assert api.ContainerAdjustment.DESCRIPTOR.fields_by_name["annotations"].number == 2
    assert api.ContainerAdjustment.DESCRIPTOR.fields_by_name["args"].number == 9
    assert api.Container.DESCRIPTOR.fields_by_name["image"].number == 22
    assert ttrpc_pb2.Request.DESCRIPTOR.fields_by_name["timeout_nano"].number == 4
    assert api.ConfigureResponse(events=0x3FFF).SerializeToString() == b"\x10\xff\x7f"


def test_event_mask_helpers() -> None:
    assert api.parse_event_mask("CreateContainer, stopcontainer") == 0x8 | 0x200
    assert api.parse_event_mask("all") == api.VALID_EVENTS
    pod = api.parse_event_mask("pod")
    assert pod == 0x1 | 0x2 | 0x4 | 0x800 | 0x1000
    assert api.event_names(0x8 | 0x4000) == "CreateContainer,unknown(0x4000)"
    try:
        api.parse_event_mask("bogus")
    except ValueError as exc:
        assert "bogus" in str(exc)
    else:
        raise AssertionError("unknown event accepted")


def test_plugin_names_and_markers() -> None:
    assert api.parse_plugin_name("10-logger") == ("10", "logger")
    assert api.parse_plugin_name("05-a-b") == ("05", "a-b")
    for bad in ("logger", "1-logger", "ab-logger", "100-x"):
        try:
            api.parse_plugin_name(bad)
        except ValueError:
            continue
        raise AssertionError(f"{bad!r} accepted")
    assert api.mark_for_removal("k") == "-k"
    assert api.is_marked_for_removal("-k") and not api.is_marked_for_removal("k")
    assert api.clear_removal_marker("-k") == "k"


def test_container_annotation_lookup_order() -> None:
    ann = {
        "k/container.a": "ctr",
        "old/container.b": "old-ctr",
        "k/pod": "pod",
        "k": "bare",
    }
    assert api.container_annotation(ann, "k", "a", old_key="old") == "ctr"
    assert api.container_annotation(ann, "k", "b", old_key="old") == "old-ctr"
    assert api.container_annotation(ann, "k", "c", old_key="old") == "pod"
    assert api.container_annotation({"k": "bare"}, "k", "c") == "bare"
    assert api.container_annotation({}, "k", "c") is None
