"""CRI v1 fields newer than the generated stubs pycrid installs, and CRI messages as Go
writes them.

container-runtime-interface-api 2.0.1 (the newest release) lags cri-api: it lacks
``ImageSpec.image_ref`` (field 20, added for image volumes, KEP-5365), which carries
the image id of an image volume in ``ContainerStatus.mounts``. Written as an unknown
field it is the same bytes on the wire as a generated setter writes; protobuf keeps
unknown fields through ``CopyFrom`` and serialisation (the record store), and Go
clients (the kubelet, critest) read it as the real field. Once the stubs have the
field, these helpers use it.
"""

from __future__ import annotations

import base64
import json
from typing import Any

from google.protobuf.unknown_fields import (  # type: ignore[import-not-found]  # no stub
    UnknownFieldSet,
)

IMAGE_REF = 20
_LENGTH_DELIMITED = 2


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        low, n = n & 0x7F, n >> 7
        out.append(low | (0x80 if n else 0))
        if not n:
            return bytes(out)


def set_image_ref(spec: Any, ref: str) -> None:
    """``spec.image_ref = ref`` on a ``runtime.v1.ImageSpec``."""
    if "image_ref" in spec.DESCRIPTOR.fields_by_name:
        spec.image_ref = ref
        return
    data = ref.encode()
    spec.MergeFromString(_varint(IMAGE_REF << 3 | _LENGTH_DELIMITED) + _varint(len(data))
                         + data)


def image_ref(spec: Any) -> str:
    """``spec.image_ref`` of a ``runtime.v1.ImageSpec`` ("" when unset)."""
    if "image_ref" in spec.DESCRIPTOR.fields_by_name:
        return str(spec.image_ref)
    found = ""
    for field in UnknownFieldSet(spec):
        if field.field_number == IMAGE_REF and field.wire_type == _LENGTH_DELIMITED:
            found = bytes(field.data).decode()  # the last one wins, as in a parse
    return found


def go_json(message: Any) -> bytes:
    """A CRI message as Go's encoding/json writes the generated struct (containerd's
    ``status.dump`` is ``json.Marshal`` of a ``runtime.ContainerStatus``): proto field
    names, zero values left out (``omitempty``), enums and 64-bit integers as numbers
    (protobuf's own JSON writes those as strings, which Go cannot read back into an
    int64), bytes in base64."""
    return json.dumps(_go_value(message), separators=(",", ":")).encode()


def _go_value(message: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for field, value in message.ListFields():
        if field.message_type is not None and field.message_type.GetOptions().map_entry:
            vfield = field.message_type.fields_by_name["value"]
            out[field.name] = {str(k): _go_scalar(vfield, v) for k, v in value.items()}
        elif field.is_repeated:
            out[field.name] = [_go_scalar(field, v) for v in value]
        else:
            out[field.name] = _go_scalar(field, value)
    return out


def _go_scalar(field: Any, value: Any) -> Any:
    if field.message_type is not None:
        return _go_value(value)
    if field.type == field.TYPE_BYTES:
        return base64.b64encode(value).decode()
    return value
