"""The NRI API: every message and enum of ``nri.pkg.api.v1alpha1`` plus the
small facts both sides share (service names, environment variables, event
masks, plugin names, the removal marker).

Plugins use it as ``from pycrid.nri import api`` and build messages with
``api.ContainerAdjustment(...)`` and friends.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

from pycrid.nri.proto.nri_pb2 import *  # noqa: F403  (the API is the generated module)
from pycrid.nri.proto.nri_pb2 import Event

NRI_VERSION = "v0.12.2"
"""The containerd/nri release whose api.proto ours matches on the wire."""

PACKAGE = "nri.pkg.api.v1alpha1"
RUNTIME_SERVICE = f"{PACKAGE}.Runtime"
PLUGIN_SERVICE = f"{PACKAGE}.Plugin"

DEFAULT_SOCKET_PATH = "/var/run/nri/nri.sock"
PLUGIN_SOCKET_ENV = "NRI_PLUGIN_SOCKET"
PLUGIN_NAME_ENV = "NRI_PLUGIN_NAME"
PLUGIN_IDX_ENV = "NRI_PLUGIN_IDX"

# ---------------------------------------------------------------- events

EVENT_METHODS: dict[int, str] = {
    Event.RUN_POD_SANDBOX: "RunPodSandbox",
    Event.STOP_POD_SANDBOX: "StopPodSandbox",
    Event.REMOVE_POD_SANDBOX: "RemovePodSandbox",
    Event.CREATE_CONTAINER: "CreateContainer",
    Event.POST_CREATE_CONTAINER: "PostCreateContainer",
    Event.START_CONTAINER: "StartContainer",
    Event.POST_START_CONTAINER: "PostStartContainer",
    Event.UPDATE_CONTAINER: "UpdateContainer",
    Event.POST_UPDATE_CONTAINER: "PostUpdateContainer",
    Event.STOP_CONTAINER: "StopContainer",
    Event.REMOVE_CONTAINER: "RemoveContainer",
    Event.UPDATE_POD_SANDBOX: "UpdatePodSandbox",
    Event.POST_UPDATE_POD_SANDBOX: "PostUpdatePodSandbox",
    Event.VALIDATE_CONTAINER_ADJUSTMENT: "ValidateContainerAdjustment",
}
"""Each event and the Plugin method that delivers it."""

STATE_CHANGE_EVENTS = frozenset({
    Event.RUN_POD_SANDBOX, Event.STOP_POD_SANDBOX, Event.REMOVE_POD_SANDBOX,
    Event.POST_UPDATE_POD_SANDBOX, Event.POST_CREATE_CONTAINER, Event.START_CONTAINER,
    Event.POST_START_CONTAINER, Event.POST_UPDATE_CONTAINER, Event.REMOVE_CONTAINER,
})
"""The events that may travel as the deprecated StateChange (those whose answer carries
nothing): a runtime falls back to it for a plugin without the event's own method."""

VALID_EVENTS = (1 << (Event.LAST - 1)) - 1
"""Every event bit a plugin may subscribe to (0x3FFF)."""


def event_bit(event: int) -> int:
    return 1 << (event - 1)


def event_mask(events: Iterable[int]) -> int:
    mask = 0
    for e in events:
        mask |= event_bit(e)
    return mask


def parse_event_mask(spec: str) -> int:
    """A mask from names such as ``"CreateContainer,stopcontainer"``; also
    ``all``, ``pod`` (or ``podsandbox``) and ``container`` as upstream accepts."""
    by_name = {name.lower(): ev for ev, name in EVENT_METHODS.items()}
    mask = 0
    for raw in spec.split(","):
        name = raw.strip().lower()
        if not name:
            continue
        if name == "all":
            mask |= VALID_EVENTS
        elif name in ("pod", "podsandbox"):
            mask |= event_mask(ev for n, ev in by_name.items() if "pod" in n)
        elif name == "container":
            mask |= event_mask(ev for n, ev in by_name.items() if "container" in n)
        elif name in by_name:
            mask |= event_bit(by_name[name])
        else:
            raise ValueError(f"unknown event {raw.strip()!r}")
    return mask


def event_names(mask: int) -> str:
    """``mask`` as a comma-separated list of event names (for logs)."""
    names = [name for ev, name in sorted(EVENT_METHODS.items()) if mask & event_bit(ev)]
    rest = mask & ~VALID_EVENTS
    if rest:
        names.append(f"unknown(0x{rest:x})")
    return ",".join(names)


# ---------------------------------------------------------------- plugin identity

_NAME_RE = re.compile(r"^[A-Za-z0-9_.+-]+$")
_IDX_RE = re.compile(r"^[0-9]{2}$")


def check_plugin_index(idx: str) -> None:
    if not _IDX_RE.match(idx):
        raise ValueError(f"invalid plugin index {idx!r}: must be 2 digits")


def check_plugin_name(name: str) -> None:
    if not name:
        raise ValueError("invalid plugin name: name is empty")
    if not _NAME_RE.match(name):
        raise ValueError(f"invalid plugin name {name!r}: only letters, digits and _.+- allowed")


def parse_plugin_name(base: str) -> tuple[str, str]:
    """``"10-logger"`` -> ``("10", "logger")``, the pre-installed plugin naming rule."""
    idx, sep, name = base.partition("-")
    if not sep:
        raise ValueError(f"invalid plugin name {base!r}: expected NN-name")
    check_plugin_index(idx)
    return idx, name


# ---------------------------------------------------------------- removal marker

REMOVAL_MARKER = "-"


def mark_for_removal(key: str) -> str:
    """The key an adjustment uses to ask for the removal of ``key``."""
    return REMOVAL_MARKER + key


def is_marked_for_removal(key: str) -> bool:
    return key.startswith(REMOVAL_MARKER)


def clear_removal_marker(key: str) -> str:
    return key.removeprefix(REMOVAL_MARKER)


# ---------------------------------------------------------------- annotations


def container_annotation(
    annotations: Mapping[str, str], key: str, container: str, *, old_key: str = ""
) -> str | None:
    """The value of an annotation-driven setting for one container.

    The sample plugins' convention: ``<key>/container.<name>`` first, then
    ``<key>/pod``, then ``<key>`` alone, each also under a deprecated ``old_key``
    right after the current one.
    """
    for suffix in (f"/container.{container}", "/pod", ""):
        for base in (key, old_key):
            if base and (value := annotations.get(base + suffix)) is not None:
                return value
    return None
