#!/usr/bin/env bash
# Regenerate the Python modules for pycrid's own .proto files (the NRI API, the
# ttrpc envelopes, and the read side of containerd's API served to cAdvisor). Needs the test
# extras (grpcio-tools <= 1.80, which emits code for protobuf 6, the major the whole
# environment is pinned to).
#   scripts/gen-proto.sh [output-dir]    (default: src, i.e. in place)
#
# With --cri-stubs, regenerate instead the type stubs of the CRI package
# (container-runtime-interface-api, which ships no stubs for its gRPC module) into stubs/,
# where mypy_path finds them. Needs the [stubgen] extras (mypy-protobuf) and the CRI api.proto
# of the pinned package: a path to it, or downloaded from kubernetes/cri-api at $CRI_API_REF.
#   scripts/gen-proto.sh --cri-stubs [api.proto]
set -euo pipefail
cd "$(dirname "$0")/.."
py=${PYTHON:-.venv/bin/python}

if [ "${1:-}" = --cri-stubs ]; then
  # The cri-api tag whose api.proto compiles to exactly the descriptor that
  # container-runtime-interface-api 2.0.1 carries (checked below).
  ref=${CRI_API_REF:-v0.34.0-beta.0}
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT
  mkdir -p "$work/cri_api/v1"
  if [ -n "${2:-}" ]; then
    cp "$2" "$work/cri_api/v1/api.proto"
  else
    curl -fsSL -o "$work/cri_api/v1/api.proto" \
      "https://raw.githubusercontent.com/kubernetes/cri-api/$ref/pkg/apis/runtime/v1/api.proto"
  fi
  "$py" scripts/check_cri_proto.py "$work/cri_api/v1/api.proto"
  mkdir -p stubs
  bin=$(dirname "$py")
  "$py" -m grpc_tools.protoc -I"$work" \
    --plugin=protoc-gen-mypy="$bin/protoc-gen-mypy" \
    --plugin=protoc-gen-mypy_grpc="$bin/protoc-gen-mypy_grpc" \
    --mypy_out=stubs --mypy_grpc_out=stubs cri_api/v1/api.proto
  exit 0
fi

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
