"""Generated protobuf modules for the read side of containerd's API (containers, tasks,
version) that pycrid serves to the kubelet's built-in cAdvisor.

The .proto files beside this module are pycrid's own; `scripts/gen-proto.sh`
regenerates the *_pb2 modules and a unit test fails when they are stale.
"""
