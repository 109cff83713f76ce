"""Containers, one CRI operation per module, as containerd lays out its CRI server.

Each operation is a function of ``ContainerParts`` (parts.py): ``create``, ``start``,
``stop`` (and NRI evictions), ``remove``, ``status`` (status and list), ``exec``
(ExecSync and the checks before exec and attach), ``update`` (resources),
``reopen_log``, ``recover`` (start-up), and ``exited`` (what a container's exit
changes). Each one records its intent, does its steps with their undo pushed on an
``AsyncExitStack`` right after each succeeds, and records the result (containerd's
container_create.go pattern); every state change is also a CRI container event
(core/events.py). The bundle and spec are the ContainerBundles part's
(runtime/container_bundles.py).
"""

from pycrid.core.containers.parts import (
    RECOVERY_CONCURRENCY,
    ContainerParts,
    labels_match,
    now_ns,
    state_name,
)

__all__ = ["RECOVERY_CONCURRENCY", "ContainerParts", "labels_match", "now_ns", "state_name"]
