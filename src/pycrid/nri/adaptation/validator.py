"""The builtin default validator (plugin ``00-default-validator``).

A re-implementation of containerd/nri's default validation plugin. It looks at
the adjustments every mutating plugin asked for, together with the record of
which plugin owns which field, and turns down the kinds of change that the
configuration restricts:

* OCI hook injection,
* seccomp policy adjustment, decided by the profile the container came with
  (no profile counts as unconfined),
* Linux namespace adjustment,
* sysctl adjustment,

and it turns down any container that some required plugin (configured
globally, or asked for by a pod annotation) did not get to see.

The checks run in upstream's order (hooks, seccomp, namespaces, required
plugins, sysctls) and the first failure is the answer. Reasons are worded as
upstream words them, so they read the same in kubelet events whichever
runtime produced them. ``config.enable`` is not consulted here: it decides
whether the adaptation registers the validator at all.
"""

from __future__ import annotations

import json
import logging

import yaml

from pycrid.config.schema import DefaultValidatorConfig
from pycrid.nri import api

log = logging.getLogger(__name__)

NAME = "default-validator"
INDEX = "00"

REQUIRED_PLUGINS_ANNOTATION = "required-plugins.noderesource.dev"
"""Pod annotation (with ``/pod`` or ``/container.<name>`` scopes) listing
further plugins, as a YAML list, that must have handled the container."""

_ERR = "validation error"

_TRUE = frozenset({"1", "t", "T", "TRUE", "true", "True"})
_FALSE = frozenset({"0", "f", "F", "FALSE", "false", "False"})


def _q(s: str) -> str:
    """A double-quoted, escaped rendering of ``s``: how upstream's messages quote."""
    return json.dumps(s, ensure_ascii=False)


class _Invalid(Exception):
    """An annotation that cannot be read; its text is the rejection reason."""


def _parse_bool(value: str) -> bool:
    """The boolean spellings upstream accepts, and nothing else."""
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ValueError(f"strconv.ParseBool: parsing {_q(value)}: invalid syntax")


def _parse_plugin_list(value: str) -> list[str]:
    """A YAML sequence of plugin names; an empty document or ``null`` is no names.

    Scalars are taken by their literal text (so ``[1, true]`` means the names
    "1" and "true"); a mapping, a lone scalar or nested collections are errors.
    """
    try:
        node = yaml.compose(value, Loader=yaml.SafeLoader)
    except yaml.YAMLError as e:
        raise ValueError(str(e).replace("\n", " ")) from e
    if node is None or (isinstance(node, yaml.ScalarNode)
                        and node.tag == "tag:yaml.org,2002:null"):
        return []
    if not isinstance(node, yaml.SequenceNode):
        raise ValueError(f"cannot unmarshal {node.tag} into a list of plugin names")
    names: list[str] = []
    for item in node.value:
        if not isinstance(item, yaml.ScalarNode):
            raise ValueError(f"cannot unmarshal {item.tag} into a plugin name")
        names.append("" if item.tag == "tag:yaml.org,2002:null" else str(item.value))
    return names


class DefaultValidator:
    """Validates one container's combined adjustment against the configuration."""

    def __init__(self, config: DefaultValidatorConfig) -> None:
        self.config = config

    def validate(self, req: api.ValidateContainerAdjustmentRequest) -> str | None:
        """``None`` to accept, otherwise why the adjustment is rejected."""
        checks = (self._hooks, self._seccomp, self._namespaces,
                  self._required_plugins, self._sysctls)
        for check in checks:
            reason = check(req)
            if reason is not None:
                log.error("rejecting adjustment of container %s/%s/%s: %s",
                          req.pod.namespace, req.pod.name, req.container.name, reason)
                return reason
        return None

    # ------------------------------------------------------------ owners

    @staticmethod
    def _field_owners(req: api.ValidateContainerAdjustmentRequest) -> api.FieldOwners | None:
        owners = req.owners.owners
        cid = req.container.id
        return owners[cid] if cid in owners else None

    def _simple_owner(self, req: api.ValidateContainerAdjustmentRequest,
                      field: int) -> str | None:
        f = self._field_owners(req)
        if f is None or field not in f.simple:
            return None
        return f.simple[field]

    def _compound_owners(self, req: api.ValidateContainerAdjustmentRequest,
                         field: int) -> dict[str, str] | None:
        f = self._field_owners(req)
        if f is None or field not in f.compound:
            return None
        return dict(f.compound[field].owners)

    # ------------------------------------------------------------ rules

    def _hooks(self, req: api.ValidateContainerAdjustmentRequest) -> str | None:
        if not req.HasField("adjust") or not self.config.reject_oci_hook_adjustment:
            return None
        owners = self._simple_owner(req, api.Field.OciHooks)
        if owners is None:
            return None
        # Hook claims accumulate: several injectors are listed comma-separated.
        who = f"plugins {_q(owners)}" if "," in owners else f"plugin {_q(owners)}"
        return f"{_ERR}: {who} attempted restricted OCI hook injection"

    def _seccomp(self, req: api.ValidateContainerAdjustmentRequest) -> str | None:
        if not req.HasField("adjust"):
            return None
        owner = self._simple_owner(req, api.Field.SeccompPolicy)
        if owner is None:
            return None
        c = req.container
        kind: int = api.SecurityProfile.UNCONFINED
        if c.HasField("linux") and c.linux.HasField("seccomp_profile"):
            kind = c.linux.seccomp_profile.profile_type
        cfg = self.config
        # The double spaces in two of these are upstream's wording, kept as is.
        if kind == api.SecurityProfile.UNCONFINED:
            if cfg.reject_unconfined_seccomp_adjustment:
                return (f"{_ERR}: plugin {owner} attempted restricted  "
                        "unconfined seccomp policy adjustment")
        elif kind == api.SecurityProfile.RUNTIME_DEFAULT:
            if cfg.reject_runtime_default_seccomp_adjustment:
                return (f"{_ERR}: plugin {owner} attempted restricted "
                        "runtime default seccomp policy adjustment")
        elif kind == api.SecurityProfile.LOCALHOST:
            if cfg.reject_custom_seccomp_adjustment:
                return (f"{_ERR}: plugin {owner} attempted restricted  "
                        "custom seccomp policy adjustment")
        return None

    def _namespaces(self, req: api.ValidateContainerAdjustmentRequest) -> str | None:
        if not req.HasField("adjust") or not self.config.reject_namespace_adjustment:
            return None
        owners = self._compound_owners(req, api.Field.Namespace)
        if owners is None:
            return None
        # Sorted by namespace type so the reason is stable.
        offenders = ", ".join(f"{_q(plugin)} (namespace {_q(ns)})"
                              for ns, plugin in sorted(owners.items()))
        return f"{_ERR}: attempted restricted namespace adjustment by plugin(s) {offenders}"

    def _sysctls(self, req: api.ValidateContainerAdjustmentRequest) -> str | None:
        if not req.HasField("adjust") or not req.adjust.HasField("linux"):
            return None
        if not self.config.reject_sysctl_adjustment:
            return None
        f = self._field_owners(req)
        if f is None or api.Field.Sysctl not in f.compound:
            return None
        claimed = f.compound[api.Field.Sysctl].owners
        owners = [claimed[key] for key in sorted(req.adjust.linux.sysctl) if key in claimed]
        if not owners:
            return None
        return (f"{_ERR}: attempted restricted sysctl adjustment by plugin(s) "
                f"{', '.join(owners)}")

    def _required_plugins(self, req: api.ValidateContainerAdjustmentRequest) -> str | None:
        try:
            required = self._required(req)
        except _Invalid as e:
            return str(e)
        if not required:
            return None
        present: set[str] = set()
        for p in req.plugins:
            present.add(p.name)
            present.add(f"{p.index}-{p.name}")
        missing = [r for r in required if r not in present]
        if not missing:
            return None
        if len(missing) == 1:
            what = f"required plugin {_q(missing[0])}"
        else:
            what = f"required plugins {_q(','.join(missing))}"
        return f"{_ERR}: {what} not present"

    def _required(self, req: api.ValidateContainerAdjustmentRequest) -> list[str]:
        """Configured plus annotated required plugins; empty when tolerated."""
        annotations = req.pod.annotations
        container = req.container.name
        required = list(self.config.required_plugins)

        tolerate_key = self.config.tolerate_missing_plugins_annotation
        if tolerate_key:
            value = api.container_annotation(annotations, tolerate_key, container)
            if value is not None:
                try:
                    tolerate = _parse_bool(value)
                except ValueError as e:
                    raise _Invalid(f"invalid {tolerate_key} annotation {_q(value)}: {e}") from e
                if tolerate:
                    return []

        value = api.container_annotation(annotations, REQUIRED_PLUGINS_ANNOTATION, container)
        if value is not None:
            try:
                required += _parse_plugin_list(value)
            except ValueError as e:
                raise _Invalid(f"invalid {REQUIRED_PLUGINS_ANNOTATION} annotation "
                               f"{_q(value)}: {e}") from e
        return required
