"""The CRI runtime under test, as every section sees it."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pycrid.bench.cri import Pods


@dataclass
class Target:
    """A runtime at ``endpoint``: ``client`` has its ``runtime`` and ``images`` services,
    ``pods`` makes and remembers pods, ``image`` is the containers' image (it has ``sleep``
    and ``true``); ``base`` is the run's own directory (runc floor, plugin logs)."""

    base: Path
    client: Any
    pods: Pods
    image: str
    endpoint: str
    daemon_pid: int | None
    nri_socket: str | None

    @property
    def rt(self) -> Any:
        return self.client.runtime
