"""Generated protobuf modules for the NRI API and the ttrpc envelopes.

The .proto files beside this module are pycrid's own; `scripts/gen-proto.sh`
regenerates the *_pb2 modules and a unit test fails when they are stale.
"""
