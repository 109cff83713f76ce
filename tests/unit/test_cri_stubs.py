"""The committed CRI stubs (stubs/cri_api, made by ``scripts/gen_cri_stubs.py`` from the
package's own descriptor) describe the installed CRI package: every message with its
fields, every enum, every service method, no more and no less. mypy checks the CRI edge
against them, so stubs of another cri-api version would let a wrong field name through."""

from __future__ import annotations

import ast
from pathlib import Path

from cri_api.v1 import api_pb2 as pb

STUBS = Path(__file__).resolve().parents[2] / "stubs" / "cri_api" / "v1"


def _classes(name: str) -> dict[str, ast.ClassDef]:
    tree = ast.parse((STUBS / name).read_text())
    return {n.name: n for n in tree.body if isinstance(n, ast.ClassDef)}


def _fields(cls: ast.ClassDef) -> set[str]:
    """Scalar fields are annotated attributes; message and repeated fields, properties."""
    out = set()
    for node in cls.body:
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            out.add(node.target.id)
        elif isinstance(node, ast.FunctionDef) and any(
                ast.unparse(d).endswith("property") for d in node.decorator_list):
            out.add(node.name)
    return {f for f in out if f != "DESCRIPTOR" and not f.startswith("_")
            and not f.endswith("_FIELD_NUMBER")}


def test_every_message_and_enum_is_stubbed() -> None:
    public = {n for n in _classes("api_pb2.pyi") if not n.startswith("_")}
    assert public == set(pb.DESCRIPTOR.message_types_by_name) | set(
        pb.DESCRIPTOR.enum_types_by_name)


def test_every_field_is_stubbed() -> None:
    classes = _classes("api_pb2.pyi")
    wrong = {}
    for name, msg in pb.DESCRIPTOR.message_types_by_name.items():
        # A nested enum's values are attributes of the message too.
        values = {v.name for e in msg.enum_types for v in e.values}
        stubbed, fields = _fields(classes[name]) - values, {f.name for f in msg.fields}
        if stubbed != fields:
            wrong[name] = (stubbed, fields)
    assert wrong == {}


def test_every_service_method_is_stubbed() -> None:
    classes = _classes("api_pb2_grpc.pyi")
    for service in pb.DESCRIPTOR.services_by_name.values():
        servicer = classes[f"{service.name}Servicer"]
        methods = {f.name for f in servicer.body if isinstance(f, ast.FunctionDef)}
        assert methods == {m.name for m in service.methods}, service.name
