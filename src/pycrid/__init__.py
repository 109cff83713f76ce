"""pycrid: a Kubernetes container runtime speaking CRI v1, with NRI built in."""

#: The release: written here only (pyproject.toml reads it; CHANGELOG.md says what each
#: release changed; pycrid/release.py adds the commit).
__version__ = "0.2.0"
