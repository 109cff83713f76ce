"""The image service's keys, ``[plugins."pycrid.cri.v1.images"]``: pulls, snapshots,
registries, signature verification and partial pulls (kept apart from config/schema.py,
which holds the rest, by size alone)."""

from __future__ import annotations

from dataclasses import dataclass

from pycrid.config.decode import Duration, abs_or_empty, at_least, cfg, one_of

#: Where containers/image (and CRI-O) look: the signature keys' defaults.
DEFAULT_POLICY = "/etc/containers/policy.json"
DEFAULT_POLICY_DIR = "/etc/pycrid/policies"
DEFAULT_REGISTRIES_D = "/etc/containers/registries.d"


@dataclass
class RegistryConfig:
    config_path: str = cfg(
        "/etc/pycrid/certs.d",
        "Directory of per-registry hosts.toml files (containerd's format): mirrors,\n"
        "plain-http registries, CA and client certificates. Empty: defaults only.",
        abs_or_empty)


@dataclass
class ImagesConfig:
    """``[plugins."pycrid.cri.v1.images"]``."""

    snapshotter: str = cfg("overlayfs", "Snapshotter that image layers are unpacked into.",
                           one_of("overlayfs"))
    sandbox_image: str = cfg("registry.k8s.io/pause:3.10",
                             "Image of the pod sandbox (pause) container; always pinned.")
    max_concurrent_downloads: int = cfg(
        3, "Layers downloaded at once, per pull (each unpacked as it downloads).", at_least(1))
    image_pull_progress_timeout: Duration = cfg(
        Duration(300), "A pull with no bytes received for this long is cancelled (0: never).")
    allow_device_nodes: bool = cfg(
        False, "Create device nodes found in image layers (refused by default: the\n"
        "container's /dev comes from the runtime, and a node in a layer is a way out).")
    slow_chown: bool = cfg(
        False, "Pods in a user namespace see the image's layers through idmapped mounts;\n"
        "where the kernel or file system cannot make them, give such pods a copy of the\n"
        "image chowned to their ids instead of refusing them (containerd's overlayfs\n"
        "snapshotter key: the copy costs the image's size per set of mappings).")
    signature_policy: str = cfg(
        DEFAULT_POLICY,
        "containers-policy.json(5) deciding which images may be pulled and run (sigstore\n"
        "and GPG signatures, per registry and repository). Re-read when it changes. At\n"
        "this default path a missing file means no verification; another path must exist\n"
        "at start-up. Empty: no verification.", abs_or_empty)
    signature_policy_dir: str = cfg(
        DEFAULT_POLICY_DIR,
        "<namespace>.json here replaces signature_policy for pulls and containers of pods\n"
        "in that namespace (CRI-O's signature_policy_dir).", abs_or_empty)
    registries_d: str = cfg(
        DEFAULT_REGISTRIES_D,
        "containers-registries.d(5): where signatures live (use-sigstore-attachments,\n"
        "lookaside), per registry and namespace.", abs_or_empty)
    enable_partial_images: bool = cfg(
        True, "Partial pulls (CRI-O's key): a zstd:chunked or eStargz layer is rebuilt from\n"
        "the files this node already has plus the missing files fetched with range\n"
        "requests, and verified against its diff id like any layer; false: every layer is\n"
        "downloaded whole.")
    use_hard_links: bool = cfg(
        False, "A file a partial pull takes from a layer already here, with the same owner,\n"
        "mode, mtime and xattrs, becomes a hard link to it instead of a copy (containers/\n"
        "storage's key): less disk, and safe, since layers are never written after they\n"
        "are committed (containers write through overlayfs, which copies a file up first).\n"
        "Files then show a link count above 1 inside containers.")
    registry: RegistryConfig = cfg(RegistryConfig(), "Registry access.")
