"""Replay of real NRI conversations between containerd and containerd/nri's Go
sample plugins (tests/data/nri-wire, see its README).

Three things are checked against the captured bytes:
* every message decodes with the project's proto, with no unknown field at
  any depth, and encodes back to the same bytes (map entry order aside);
* our multiplexer frames every message exactly as the Go writer did;
* the SDK, running the Python equivalent of the captured Go plugin, answers
  the captured runtime side with the same bytes the Go plugin sent.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import socket
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from google.protobuf import descriptor as pb_descriptor
from google.protobuf import message_factory
from google.protobuf.internal import decoder, encoder
from google.protobuf.message import Message
from google.protobuf.unknown_fields import UnknownFieldSet

from pycrid.nri import Plugin, Stub, api
from pycrid.nri.proto import ttrpc_pb2
from pycrid.nri.wire import mux, ttrpc

DATA = Path(__file__).resolve().parent.parent / "data" / "nri-wire"
EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "nri"
CAPTURES = sorted(p.name for p in DATA.glob("*.jsonl"))


@dataclass(frozen=True)
class Record:
    seq: int
    conn: int
    to_runtime: bool
    mux_id: int
    mux_frames: list[int]
    stream_id: int
    type: int
    flags: int
    message: bytes
    payload: bytes
    method: str
    raw: dict[str, Any]


def load(name: str) -> list[Record]:
    out = []
    with open(DATA / name) as f:
        for line in f:
            o = json.loads(line)
            out.append(
                Record(
                    seq=o["seq"],
                    conn=o["conn"],
                    to_runtime=o["dir"] == "plugin->runtime",
                    mux_id=o["mux_id"],
                    mux_frames=o["mux_frames"],
                    stream_id=o["stream_id"],
                    type=o["type"],
                    flags=o["flags"],
                    message=bytes.fromhex(o["message_hex"]),
                    payload=bytes.fromhex(o["payload_hex"]),
                    method=o.get("method", ""),
                    raw=o,
                )
            )
    return out


def with_message_types(records: list[Record]) -> Iterator[tuple[Record, type[Message]]]:
    """Each record with the NRI message type its payload carries."""
    calls: dict[tuple[int, int, int], str] = {}
    for rec in records:
        service = api.DESCRIPTOR.services_by_name["Runtime" if rec.mux_id == 2 else "Plugin"]
        if rec.type == ttrpc.MessageType.REQUEST:
            calls[(rec.conn, rec.mux_id, rec.stream_id)] = rec.method
            desc = service.methods_by_name[rec.method].input_type
        else:
            method = calls[(rec.conn, rec.mux_id, rec.stream_id)]
            desc = service.methods_by_name[method].output_type
        yield rec, message_factory.GetMessageClass(desc)


# ---------------------------------------------------------------- canonical bytes


def canonical(data: bytes, desc: pb_descriptor.Descriptor) -> bytes:
    """``data`` re-encoded field by field with map entries sorted, recursively.

    Go writes map entries in its map's iteration order; comparing canonical
    forms compares everything else byte for byte.
    """
    fields: list[tuple[int, bytes]] = []
    maps: dict[int, list[bytes]] = {}
    pos = 0
    while pos < len(data):
        tag, new_pos = decoder._DecodeVarint(data, pos)
        number, wire_type = tag >> 3, tag & 7
        if wire_type == 0:
            _, end = decoder._DecodeVarint(data, new_pos)
            value = data[new_pos:end]
        elif wire_type == 1:
            end = new_pos + 8
            value = data[new_pos:end]
        elif wire_type == 5:
            end = new_pos + 4
            value = data[new_pos:end]
        elif wire_type == 2:
            length, start = decoder._DecodeVarint(data, new_pos)
            end = start + length
            value = data[start:end]
            field = desc.fields_by_number.get(number)
            if field is not None and field.message_type is not None:
                value = canonical(value, field.message_type)
                if field.message_type.GetOptions().map_entry:
                    maps.setdefault(number, []).append(value)
                    pos = end
                    continue
            value = encoder._VarintBytes(len(value)) + value
        else:
            raise AssertionError(f"unexpected wire type {wire_type} in {desc.full_name}")
        fields.append((number, encoder._VarintBytes(tag) + value))
        pos = end
    for number, entries in maps.items():
        tag = encoder._VarintBytes(number << 3 | 2)
        for entry in sorted(entries):
            fields.append((number, tag + encoder._VarintBytes(len(entry)) + entry))
    fields.sort(key=lambda f: f[0])  # stable: repeated fields keep their order
    return b"".join(b for _, b in fields)


def unknown_fields(msg: Message, path: str = "") -> list[str]:
    """Paths of unknown fields anywhere in ``msg``."""
    found = [f"{path or msg.DESCRIPTOR.name}: #{f.field_number}" for f in UnknownFieldSet(msg)]
    for field, value in msg.ListFields():
        if field.message_type is None:
            continue
        if field.message_type.GetOptions().map_entry:
            values = value.values() if field.message_type.fields_by_name["value"].message_type \
                else []
        elif field.is_repeated:
            values = value
        else:
            values = [value]
        for i, v in enumerate(values):
            found += unknown_fields(v, f"{path}.{field.name}[{i}]")
    return found


# ---------------------------------------------------------------- decoding


@pytest.mark.parametrize("capture", CAPTURES)
def test_every_message_decodes_and_reencodes(capture: str) -> None:
    records = load(capture)
    assert records
    for rec, msg_type in with_message_types(records):
        length, stream_id, type_, flags = ttrpc.HEADER.unpack_from(rec.message)
        assert (stream_id, type_, flags) == (rec.stream_id, rec.type, rec.flags)
        body = rec.message[ttrpc.HEADER_SIZE :]
        assert length == len(body), rec.seq

        envelope: Message
        if rec.type == ttrpc.MessageType.REQUEST:
            envelope = ttrpc_pb2.Request.FromString(body)
            assert envelope.service == rec.raw["service"]
            assert envelope.method == rec.method
            assert envelope.timeout_nano == rec.raw["timeout_nano"]
        else:
            envelope = ttrpc_pb2.Response.FromString(body)
            assert envelope.status.code == rec.raw["status_code"]
        assert envelope.payload == rec.payload
        assert envelope.SerializeToString() == body, f"envelope of seq {rec.seq}"
        assert unknown_fields(envelope) == []

        msg = msg_type.FromString(rec.payload)
        assert unknown_fields(msg) == [], f"seq {rec.seq} {msg_type.__name__}"
        ours = msg.SerializeToString()
        assert len(ours) == len(rec.payload), f"seq {rec.seq}"
        assert canonical(ours, msg.DESCRIPTOR) == canonical(rec.payload, msg.DESCRIPTOR), (
            f"seq {rec.seq} {msg_type.__name__} re-encodes differently"
        )


@pytest.mark.parametrize("capture", CAPTURES)
def test_frames_match_the_go_writer(capture: str) -> None:
    for rec in load(capture):
        assert mux.frame_sizes(rec.mux_id, rec.message) == rec.mux_frames, rec.seq


def test_captures_cover_large_and_split_frames() -> None:
    """Guard against a capture set that no longer exercises the 4096-byte rule."""
    records = [r for c in CAPTURES for r in load(c)]
    assert any(len(r.mux_frames) == 2 and r.mux_frames[0] == 4096 for r in records)
    methods = {r.method for r in records if r.method}
    assert {"RegisterPlugin", "Configure", "Synchronize", "CreateContainer",
            "ValidateContainerAdjustment", "StopContainer", "RemovePodSandbox"} <= methods


def test_canonical_form_ignores_only_map_order() -> None:
    a = api.PodSandbox(id="p", annotations={"a": "1", "b": "2"})
    b = api.PodSandbox(id="p", annotations={"b": "2", "a": "1"})
    c = api.PodSandbox(id="p", annotations={"a": "1", "b": "3"})
    desc = api.PodSandbox.DESCRIPTOR
    assert canonical(a.SerializeToString(), desc) == canonical(b.SerializeToString(), desc)
    assert canonical(a.SerializeToString(), desc) != canonical(c.SerializeToString(), desc)


# ---------------------------------------------------------------- the SDK answers


def example(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"nri_example_{name}", EXAMPLES / f"{name}.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


class Template(Plugin):
    """The Go 'template' sample: a no-op handler for 11 events."""

    def run_pod_sandbox(self, pod: Any) -> None: ...
    def stop_pod_sandbox(self, pod: Any) -> None: ...
    def remove_pod_sandbox(self, pod: Any) -> None: ...
    def create_container(self, pod: Any, ctr: Any) -> Any:
        return None
    def post_create_container(self, pod: Any, ctr: Any) -> None: ...
    def start_container(self, pod: Any, ctr: Any) -> None: ...
    def post_start_container(self, pod: Any, ctr: Any) -> None: ...
    def update_container(self, pod: Any, ctr: Any, res: Any) -> Any:
        return None
    def post_update_container(self, pod: Any, ctr: Any) -> None: ...
    def stop_container(self, pod: Any, ctr: Any) -> Any:
        return None
    def remove_container(self, pod: Any, ctr: Any) -> None: ...
    def synchronize(self, pods: Any, containers: Any) -> Any:
        return None


def captured_plugin(name: str) -> object:
    """The Python counterpart of a captured Go plugin, configured the same way."""
    if name == "nri-logger":
        logger = example("logger")
        return logger.Logger(
            add_annotation="logger.example.com/seen=yes",
            add_env="LOGGER_SEEN=yes",
            value="logger-pid-22902",  # the Go plugin's pid, which it puts in the value
        )
    if name == "nri-ulimit-adjuster":
        return example("ulimit_adjuster").UlimitAdjuster()
    if name == "nri-device-injector":
        return example("device_injector").DeviceInjector()
    if name == "nri-template":
        return Template()
    raise AssertionError(f"no Python counterpart for {name}")


class RawRuntime:
    """Plays the captured runtime side byte for byte and reads the plugin's messages."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.demux = mux.Demultiplexer([1, 2])
        self.streams = {1: ttrpc.MessageReader(), 2: ttrpc.MessageReader()}
        self.inbox: dict[int, list[ttrpc.Message]] = {1: [], 2: []}

    async def send(self, rec: Record) -> None:
        self.writer.write(mux.encode(rec.mux_id, rec.message))
        await self.writer.drain()

    async def next_message(self, mux_id: int) -> ttrpc.Message:
        while not self.inbox[mux_id]:
            data = await self.reader.read(65536)
            assert data, "plugin closed the connection"
            self.demux.receive_data(data)
            for conn in (1, 2):
                for item in self.streams[conn].feed(self.demux.read(conn)):
                    assert isinstance(item, ttrpc.Message)
                    self.inbox[conn].append(item)
        return self.inbox[mux_id].pop(0)


def conversations(capture: str) -> list[tuple[str, list[Record]]]:
    by_conn: dict[int, list[Record]] = {}
    for rec in load(capture):
        by_conn.setdefault(rec.conn, []).append(rec)
    out = []
    for recs in by_conn.values():
        reg = api.RegisterPluginRequest.FromString(recs[0].payload)
        out.append((f"{capture}:{reg.plugin_idx}-{reg.plugin_name}", recs))
    return out


CONVERSATIONS = [conv for c in CAPTURES for conv in conversations(c)]


@pytest.mark.parametrize("conv", CONVERSATIONS, ids=[c[0] for c in CONVERSATIONS])
async def test_sdk_answers_like_the_go_plugin(conv: tuple[str, list[Record]]) -> None:
    _, records = conv
    reg = api.RegisterPluginRequest.FromString(records[0].payload)
    ours, theirs = socket.socketpair()
    reader, writer = await asyncio.open_unix_connection(sock=theirs)
    runtime = RawRuntime(reader, writer)
    stub = Stub(captured_plugin(reg.plugin_name), name=reg.plugin_name, idx=reg.plugin_idx,
                sock=ours)
    started = asyncio.create_task(stub.start())
    answered = 0
    try:
        async with asyncio.timeout(10):
            for rec in records:
                if not rec.to_runtime:
                    await runtime.send(rec)
                    continue
                got = await runtime.next_message(rec.mux_id)
                assert (got.stream_id, got.type, got.flags) == (rec.stream_id, rec.type, rec.flags)
                if rec.method == "RegisterPlugin":
                    # Same call; only the remaining deadline in the envelope differs.
                    req = ttrpc_pb2.Request.FromString(got.payload)
                    assert (req.service, req.method) == (rec.raw["service"], rec.method)
                    assert req.payload == rec.payload
                    assert 4_000_000_000 < req.timeout_nano <= 5_000_000_000
                else:
                    resp = ttrpc_pb2.Response.FromString(got.payload)
                    assert resp.status.code == rec.raw["status_code"], rec.seq
                    expected = ttrpc_pb2.Response.FromString(rec.message[ttrpc.HEADER_SIZE :])
                    assert resp.payload == expected.payload, f"seq {rec.seq}"
                    assert got.payload == rec.message[ttrpc.HEADER_SIZE :], f"seq {rec.seq}"
                    answered += 1
            await started
    finally:
        started.cancel()
        await stub.stop()
        writer.close()
    assert answered == sum(1 for r in records if r.to_runtime) - 1
    assert stub.events == api.ConfigureResponse.FromString(
        next(r.payload for r in records if r.to_runtime and r.mux_id == 1 and r.stream_id == 1)
    ).events
