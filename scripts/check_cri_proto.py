"""Stop stub generation when an api.proto is not the one the installed CRI package was built
from: stubs of another cri-api version would type fields the runtime does not have.

    python scripts/check_cri_proto.py path/to/cri_api/v1/api.proto
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

from cri_api.v1 import api_pb2
from google.protobuf import descriptor_pb2


def _without_json_names(msg: descriptor_pb2.DescriptorProto) -> None:
    # protoc fills json_name into a descriptor set; the Python module's copy leaves it out.
    for field in msg.field:
        field.ClearField("json_name")
    for nested in msg.nested_type:
        _without_json_names(nested)


def main(proto: str) -> int:
    path = Path(proto)
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "set.pb"
        subprocess.run([sys.executable, "-m", "grpc_tools.protoc", f"-I{path.parent.parent}",
                        f"--descriptor_set_out={out}", f"v1/{path.name}"], check=True)
        fresh = descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes()).file[0]
    for msg in fresh.message_type:
        _without_json_names(msg)
    shipped = descriptor_pb2.FileDescriptorProto.FromString(api_pb2.DESCRIPTOR.serialized_pb)
    if fresh != shipped:
        print(f"{proto} does not describe the installed cri_api.v1.api_pb2", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
