"""The streaming server: exec, attach and port-forward over SPDY and WebSocket."""
