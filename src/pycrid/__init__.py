"""pycrid: a Kubernetes container runtime speaking CRI v1, with NRI built in."""

__version__ = "0.1.0"
