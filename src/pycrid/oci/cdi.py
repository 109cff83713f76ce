"""Container Device Interface: inject CDI devices into an OCI spec.

Devices are asked for by their fully-qualified name ``vendor.com/class=name``
and found in CDI spec files (read by :mod:`pycrid.oci.cdi_specs`); their edits
are applied by :mod:`pycrid.oci.cdi_edits`. What is followed here, from the CDI
specification and its reference library:

* Spec directories are read in order; a later directory has the higher
  priority, so its device of the same qualified name wins. Two files of the
  same directory defining the same device conflict: the device is dropped
  (unless a later directory defines it) and the conflict logged.
* A file that cannot be read or fails validation is skipped with a warning;
  the other files still count.
* The edits of all requested devices are gathered first (a spec's own edits
  once, before the first of its devices' edits) and applied together.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from typing import Any

from pycrid.errors import InvalidArgument
from pycrid.oci.cdi_edits import apply_edits
from pycrid.oci.cdi_specs import ContainerEdits, InvalidSpec, SpecFile, read_spec

log = logging.getLogger(__name__)

DEFAULT_SPEC_DIRS = ("/etc/cdi", "/var/run/cdi")
SPEC_EXTENSIONS = (".json", ".yaml", ".yml")


class CdiRegistry:
    """CDI devices found in ``spec_dirs`` (read afresh on every injection)."""

    def __init__(self, spec_dirs: Sequence[str] = DEFAULT_SPEC_DIRS) -> None:
        self.spec_dirs = tuple(spec_dirs)

    def _scan(self) -> dict[str, tuple[SpecFile, ContainerEdits]]:
        """Qualified device name -> (its spec file, its edits), by priority."""
        devices: dict[str, tuple[SpecFile, ContainerEdits]] = {}
        conflicts: set[str] = set()
        for priority, directory in enumerate(self.spec_dirs):
            try:
                names = sorted(os.listdir(directory))
            except FileNotFoundError:
                continue
            except OSError as e:
                log.warning("cannot read CDI spec directory %s: %s", directory, e)
                continue
            for name in names:
                path = os.path.join(directory, name)
                if not name.endswith(SPEC_EXTENSIONS) or os.path.isdir(path):
                    continue
                try:
                    spec = read_spec(path, priority)
                except (OSError, UnicodeDecodeError, InvalidSpec) as e:
                    log.warning("skipping CDI spec %s: %s", path, e)
                    continue
                for dev_name, edits in spec.devices.items():
                    qualified = f"{spec.kind}={dev_name}"
                    old = devices.get(qualified)
                    if old is not None and old[0].priority == priority:
                        log.warning("conflicting CDI device %s (specs %s, %s)",
                                    qualified, path, old[0].path)
                        conflicts.add(qualified)
                        continue
                    # A later directory overrides, and settles an earlier conflict.
                    devices[qualified] = (spec, edits)
                    conflicts.discard(qualified)
        for qualified in conflicts:
            devices.pop(qualified, None)
        return devices

    def inject(self, spec: dict[str, Any], devices: Sequence[str]) -> None:
        """Apply the edits of ``devices`` (fully-qualified CDI names) to ``spec``."""
        if not devices:
            return
        known = self._scan()
        unresolved = [d for d in devices if d not in known]
        if unresolved:
            raise InvalidArgument(f"unresolvable CDI devices {', '.join(unresolved)}")
        edits = ContainerEdits()
        seen: set[int] = set()
        for d in devices:
            spec_file, device_edits = known[d]
            if id(spec_file) not in seen:
                seen.add(id(spec_file))
                edits.extend(spec_file.edits)
            edits.extend(device_edits)
        apply_edits(spec, edits)
