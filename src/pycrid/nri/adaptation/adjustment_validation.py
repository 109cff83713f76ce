"""Validating a merged CreateContainer adjustment: the builtin default validator and every
plugin subscribed to ValidateContainerAdjustment (asked concurrently) see the pristine
container, the merged adjustment and who owns what; any rejection fails the create."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from pycrid.errors import FailedPrecondition
from pycrid.nri import api
from pycrid.nri.adaptation.merge import CreateResult
from pycrid.nri.adaptation.remote_plugin import ConnectedPlugin, PluginFailed, PluginGone
from pycrid.nri.adaptation.validator import INDEX as VALIDATOR_INDEX
from pycrid.nri.adaptation.validator import NAME as VALIDATOR_NAME
from pycrid.nri.adaptation.validator import DefaultValidator


async def validate_adjustment(pod: api.PodSandbox, pristine: api.Container,
                              result: CreateResult, instances: list[api.PluginInstance],
                              validators: Sequence[ConnectedPlugin],
                              default: DefaultValidator | None) -> None:
    """Raise FailedPrecondition with the first rejection (the default validator's first)."""
    if default is None and not validators:
        return
    if default is not None:
        instances = [api.PluginInstance(name=VALIDATOR_NAME, index=VALIDATOR_INDEX),
                     *instances]
    req = api.ValidateContainerAdjustmentRequest(
        pod=pod, container=pristine, adjust=result.adjust, update=result.updates,
        owners=result.owners, plugins=instances)

    async def ask(plugin: ConnectedPlugin) -> str | None:
        try:
            rpl = await plugin.call("ValidateContainerAdjustment", req,
                                    api.ValidateContainerAdjustmentResponse)
        except (PluginGone, PluginFailed) as e:
            # A validator that cannot answer fails the create, as upstream.
            return f"validator plugin {plugin.name} failed: {e}"
        if rpl.reject:
            return (f'validator "{plugin.name}" rejected container adjustment, '
                    f"reason: {rpl.reason}")
        return None

    verdicts: list[str | None] = list(await asyncio.gather(*(ask(p) for p in validators)))
    if default is not None:
        reason = default.validate(req)
        if reason is not None:
            verdicts.insert(0, f'validator "{VALIDATOR_INDEX}-{VALIDATOR_NAME}" rejected '
                               f"container adjustment, reason: {reason}")
    for verdict in verdicts:
        if verdict is not None:
            raise FailedPrecondition(verdict)
