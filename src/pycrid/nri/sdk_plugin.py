"""``Plugin``: the base class an NRI plugin written in Python subclasses.

Every handler is a no-op; a plugin overrides the ones it needs, and the event
handlers it overrides are its subscription (as with the Go stub, where the
interfaces a plugin implements decide it). Handlers may be coroutines or plain
functions.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable
from typing import Any

from pycrid.nri import api
from pycrid.nri.replies import Adjustment, Update

UpdatesResult = Iterable[api.ContainerUpdate | Update] | None
CreateResult = (
    Adjustment
    | api.ContainerAdjustment
    | tuple[Adjustment | api.ContainerAdjustment | None, UpdatesResult]
    | None
)


class Plugin:
    """Base class for plugins. Every handler here is a no-op; override the
    ones you need. Event handlers you override are the events you get."""

    def configure(self, config: str, runtime_name: str, runtime_version: str) -> int | None:
        """Called once; may return an event mask narrower than the handlers
        overridden (0 or None means all of them)."""
        return 0

    def synchronize(
        self, pods: list[api.PodSandbox], containers: list[api.Container]
    ) -> UpdatesResult:
        """Every pod and container that exists when the plugin joins."""
        return None

    def shutdown(self) -> None:
        """The runtime is shutting down."""

    def run_pod_sandbox(self, pod: api.PodSandbox) -> None: ...
    def update_pod_sandbox(
        self,
        pod: api.PodSandbox,
        overhead: api.LinuxResources,
        resources: api.LinuxResources,
    ) -> None: ...
    def post_update_pod_sandbox(self, pod: api.PodSandbox) -> None: ...
    def stop_pod_sandbox(self, pod: api.PodSandbox) -> None: ...
    def remove_pod_sandbox(self, pod: api.PodSandbox) -> None: ...

    def create_container(self, pod: api.PodSandbox, container: api.Container) -> CreateResult:
        """Return an adjustment, or ``(adjustment, updates)``, or None."""
        return None

    def post_create_container(self, pod: api.PodSandbox, container: api.Container) -> None: ...
    def start_container(self, pod: api.PodSandbox, container: api.Container) -> None: ...
    def post_start_container(self, pod: api.PodSandbox, container: api.Container) -> None: ...

    def update_container(
        self, pod: api.PodSandbox, container: api.Container, resources: api.LinuxResources
    ) -> UpdatesResult:
        return None

    def post_update_container(self, pod: api.PodSandbox, container: api.Container) -> None: ...

    def stop_container(self, pod: api.PodSandbox, container: api.Container) -> UpdatesResult:
        return None

    def remove_container(self, pod: api.PodSandbox, container: api.Container) -> None: ...

    def validate_container_adjustment(
        self, request: api.ValidateContainerAdjustmentRequest
    ) -> None:
        """Raise to reject the merged adjustment; the exception text is the reason."""


EVENT_HANDLERS: dict[int, str] = {
    api.Event.RUN_POD_SANDBOX: "run_pod_sandbox",
    api.Event.STOP_POD_SANDBOX: "stop_pod_sandbox",
    api.Event.REMOVE_POD_SANDBOX: "remove_pod_sandbox",
    api.Event.CREATE_CONTAINER: "create_container",
    api.Event.POST_CREATE_CONTAINER: "post_create_container",
    api.Event.START_CONTAINER: "start_container",
    api.Event.POST_START_CONTAINER: "post_start_container",
    api.Event.UPDATE_CONTAINER: "update_container",
    api.Event.POST_UPDATE_CONTAINER: "post_update_container",
    api.Event.STOP_CONTAINER: "stop_container",
    api.Event.REMOVE_CONTAINER: "remove_container",
    api.Event.UPDATE_POD_SANDBOX: "update_pod_sandbox",
    api.Event.POST_UPDATE_POD_SANDBOX: "post_update_pod_sandbox",
    api.Event.VALIDATE_CONTAINER_ADJUSTMENT: "validate_container_adjustment",
}
"""Each event and the Plugin method that handles it."""

def implemented(plugin: object, method: str) -> bool:
    """Whether ``plugin`` provides ``method`` itself (not Plugin's no-op)."""
    own = getattr(type(plugin), method, None)
    if own is None:
        return callable(getattr(plugin, method, None))
    return own is not getattr(Plugin, method, None)


def handled_events(plugin: object) -> int:
    """The event mask the plugin's overridden handlers cover."""
    return api.event_mask(ev for ev, name in EVENT_HANDLERS.items() if implemented(plugin, name))


async def call_handler(fn: Callable[..., Any], *args: Any) -> Any:
    result = fn(*args)
    if inspect.isawaitable(result):
        result = await result
    return result


def update_messages(result: UpdatesResult) -> list[api.ContainerUpdate]:
    if not result:
        return []
    return [u.message if isinstance(u, Update) else u for u in result]

