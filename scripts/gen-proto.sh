#!/usr/bin/env bash
# Regenerate the Python modules for pycrid's own .proto files (the NRI API, the
# ttrpc envelopes, and the read side of containerd's API served to cAdvisor). Needs the test
# extras (grpcio-tools <= 1.80, which emits code for protobuf 6, the major the whole
# environment is pinned to).
#   scripts/gen-proto.sh [output-dir]    (default: src, i.e. in place)
#
# The CRI package's type stubs (stubs/cri_api) come from scripts/gen_cri_stubs.py instead.
set -euo pipefail
cd "$(dirname "$0")/.."
py=${PYTHON:-.venv/bin/python}

out=${1:-src}
common=$("$py" -c 'import google.rpc.status_pb2 as m, pathlib; print(pathlib.Path(m.__file__).parents[2])')
mkdir -p "$out"
"$py" -m grpc_tools.protoc -Isrc -I"$common" --python_out="$out" --pyi_out="$out" \
  pycrid/nri/proto/nri.proto pycrid/nri/proto/ttrpc.proto \
  pycrid/cadvisor/proto/task.proto pycrid/cadvisor/proto/tasks.proto \
  pycrid/cadvisor/proto/containers.proto pycrid/cadvisor/proto/version.proto
# protoc's stub generator writes the NRI enum value `Field.None` as an attribute
# named None, which is not valid Python; drop those two lines from the stub (the
# value stays reachable at run time as nri_pb2.Field.Value("None")).
sed -i -e '/^    None: _ClassVar\[Field\]$/d' -e '/^None: Field$/d' "$out/pycrid/nri/proto/nri_pb2.pyi"
