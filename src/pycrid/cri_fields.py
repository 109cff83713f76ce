"""CRI v1 fields newer than the generated stubs pycrid installs.

container-runtime-interface-api 2.0.1 (the newest release) lags cri-api: it lacks
``ImageSpec.image_ref`` (field 20, added for image volumes, KEP-5365), which carries
the image id of an image volume in ``ContainerStatus.mounts``. Written as an unknown
field it is the same bytes on the wire as a generated setter writes; protobuf keeps
unknown fields through ``CopyFrom`` and serialisation (the record store), and Go
clients (the kubelet, critest) read it as the real field. Once the stubs have the
field, these helpers use it.
"""

from __future__ import annotations

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
