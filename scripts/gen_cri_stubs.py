"""Write the type stubs of the CRI package (container-runtime-interface-api ships none that
mypy reads for its gRPC module) into stubs/cri_api/v1, from the descriptor the installed
package itself carries: the stubs describe exactly what the runtime has, and carry no text
but names and types (the descriptor has no comments).

    .venv/bin/python scripts/gen_cri_stubs.py        (needs the [stubgen] extras)
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from cri_api.v1 import api_pb2
from google.protobuf import descriptor_pb2
from google.protobuf.compiler import plugin_pb2

ROOT = Path(__file__).resolve().parents[1]
PLUGINS = ("protoc-gen-mypy", "protoc-gen-mypy_grpc")


def main() -> int:
    shipped = descriptor_pb2.FileDescriptorProto.FromString(api_pb2.DESCRIPTOR.serialized_pb)
    # The generators name outputs after the proto's path; the package imports as cri_api.v1.
    shipped.name = "cri_api/v1/api.proto"
    request = plugin_pb2.CodeGeneratorRequest(file_to_generate=[shipped.name],
                                              proto_file=[shipped])
    bindir = Path(sys.executable).parent
    for plugin in PLUGINS:
        out = subprocess.run([str(bindir / plugin)], input=request.SerializeToString(),
                             capture_output=True, check=True).stdout
        answer = plugin_pb2.CodeGeneratorResponse.FromString(out)
        if answer.error:
            print(f"{plugin}: {answer.error}", file=sys.stderr)
            return 1
        for generated in answer.file:
            path = ROOT / "stubs" / generated.name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(generated.content)
    return 0


if __name__ == "__main__":
    sys.exit(main())
