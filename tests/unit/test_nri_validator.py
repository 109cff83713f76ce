"""The builtin default validator: one test per rule, accepting and rejecting."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

from pycrid.config.schema import DefaultValidatorConfig
from pycrid.nri import api
from pycrid.nri.adaptation.validator import INDEX, NAME, DefaultValidator

CID = "ctr-id"
RT_DEFAULT = api.SecurityProfile.RUNTIME_DEFAULT
UNCONFINED = api.SecurityProfile.UNCONFINED
LOCALHOST = api.SecurityProfile.LOCALHOST
Profile = api.SecurityProfile.ProfileType


def request(*, adjust: api.ContainerAdjustment | None = None,
            simple: dict[int, str] | None = None,
            compound: dict[int, dict[str, str]] | None = None,
            annotations: dict[str, str] | None = None,
            plugins: Sequence[tuple[str, str]] = (),
            profile: Profile | None = None) -> api.ValidateContainerAdjustmentRequest:
    req = api.ValidateContainerAdjustmentRequest(
        pod=api.PodSandbox(id="pod-id", name="pod", namespace="ns",
                           annotations=annotations or {}),
        container=api.Container(id=CID, name="ctr"),
        plugins=[api.PluginInstance(index=i, name=n) for i, n in plugins],
    )
    if profile is not None:
        req.container.linux.seccomp_profile.profile_type = profile
    if adjust is not None:
        req.adjust.CopyFrom(adjust)
    if simple is not None or compound is not None:
        owners = req.owners.owners[CID]
        for field, plugin in (simple or {}).items():
            owners.simple[field] = plugin
        for field, entries in (compound or {}).items():
            for key, plugin in entries.items():
                owners.compound[field].owners[key] = plugin
    return req


def validator(**cfg: Any) -> DefaultValidator:
    return DefaultValidator(DefaultValidatorConfig(enable=True, **cfg))


def test_identity() -> None:
    assert (INDEX, NAME) == ("00", "default-validator")


def test_nothing_configured_accepts_everything() -> None:
    req = request(adjust=api.ContainerAdjustment(),
                  simple={api.Field.OciHooks: "p", api.Field.SeccompPolicy: "p"},
                  compound={api.Field.Namespace: {"network": "p"},
                            api.Field.Sysctl: {"net.x": "p"}})
    assert validator().validate(req) is None


# ---------------------------------------------------------------- OCI hooks


def test_hook_injection_by_one_plugin_rejected() -> None:
    req = request(adjust=api.ContainerAdjustment(), simple={api.Field.OciHooks: "hooker"})
    assert validator(reject_oci_hook_adjustment=True).validate(req) == (
        'validation error: plugin "hooker" attempted restricted OCI hook injection')


def test_hook_injection_by_several_plugins_rejected() -> None:
    req = request(adjust=api.ContainerAdjustment(), simple={api.Field.OciHooks: "a,b"})
    assert validator(reject_oci_hook_adjustment=True).validate(req) == (
        'validation error: plugins "a,b" attempted restricted OCI hook injection')


def test_hooks_accepted_when_unclaimed_unadjusted_or_allowed() -> None:
    v = validator(reject_oci_hook_adjustment=True)
    assert v.validate(request(adjust=api.ContainerAdjustment())) is None
    # Owners of another container do not count.
    other = request(adjust=api.ContainerAdjustment())
    other.owners.owners["other"].simple[api.Field.OciHooks] = "hooker"
    assert v.validate(other) is None
    # Without an adjustment there is nothing to validate.
    assert v.validate(request(simple={api.Field.OciHooks: "hooker"})) is None
    claimed = request(adjust=api.ContainerAdjustment(), simple={api.Field.OciHooks: "h"})
    assert validator().validate(claimed) is None


# ---------------------------------------------------------------- seccomp


def seccomp_req(profile: Profile | None) -> api.ValidateContainerAdjustmentRequest:
    return request(adjust=api.ContainerAdjustment(), profile=profile,
                   simple={api.Field.SeccompPolicy: "sec"})


@pytest.mark.parametrize("profile", [None, UNCONFINED])
def test_unconfined_seccomp_adjustment_rejected(profile: Profile | None) -> None:
    """No profile at all counts as unconfined."""
    assert validator(reject_unconfined_seccomp_adjustment=True).validate(
        seccomp_req(profile)) == ("validation error: plugin sec attempted restricted  "
                                  "unconfined seccomp policy adjustment")


def test_runtime_default_seccomp_adjustment_rejected() -> None:
    assert validator(reject_runtime_default_seccomp_adjustment=True).validate(
        seccomp_req(RT_DEFAULT)) == ("validation error: plugin sec attempted restricted "
                                     "runtime default seccomp policy adjustment")


def test_custom_seccomp_adjustment_rejected() -> None:
    assert validator(reject_custom_seccomp_adjustment=True).validate(
        seccomp_req(LOCALHOST)) == ("validation error: plugin sec attempted restricted  "
                                    "custom seccomp policy adjustment")


def test_seccomp_rule_follows_the_containers_profile() -> None:
    """Each switch guards only its own profile kind."""
    assert validator(reject_unconfined_seccomp_adjustment=True,
                     reject_custom_seccomp_adjustment=True).validate(
        seccomp_req(RT_DEFAULT)) is None
    assert validator(reject_runtime_default_seccomp_adjustment=True,
                     reject_custom_seccomp_adjustment=True).validate(
        seccomp_req(UNCONFINED)) is None
    assert validator(reject_runtime_default_seccomp_adjustment=True,
                     reject_unconfined_seccomp_adjustment=True).validate(
        seccomp_req(LOCALHOST)) is None


def test_seccomp_accepted_when_unclaimed() -> None:
    v = validator(reject_unconfined_seccomp_adjustment=True,
                  reject_runtime_default_seccomp_adjustment=True,
                  reject_custom_seccomp_adjustment=True)
    assert v.validate(request(adjust=api.ContainerAdjustment(), profile=RT_DEFAULT)) is None
    assert v.validate(request(profile=RT_DEFAULT,
                              simple={api.Field.SeccompPolicy: "sec"})) is None


# ---------------------------------------------------------------- namespaces


def test_namespace_adjustment_rejected() -> None:
    req = request(adjust=api.ContainerAdjustment(),
                  compound={api.Field.Namespace: {"network": "netp", "ipc": "ipcp"}})
    assert validator(reject_namespace_adjustment=True).validate(req) == (
        "validation error: attempted restricted namespace adjustment by plugin(s) "
        '"ipcp" (namespace "ipc"), "netp" (namespace "network")')


def test_namespace_adjustment_accepted() -> None:
    claimed = request(adjust=api.ContainerAdjustment(),
                      compound={api.Field.Namespace: {"network": "netp"}})
    assert validator().validate(claimed) is None
    v = validator(reject_namespace_adjustment=True)
    assert v.validate(request(adjust=api.ContainerAdjustment(),
                              compound={api.Field.Sysctl: {"a": "p"}})) is None
    assert v.validate(request(compound={api.Field.Namespace: {"network": "netp"}})) is None


# ---------------------------------------------------------------- sysctls


def sysctl_adjust(*keys: str) -> api.ContainerAdjustment:
    adj = api.ContainerAdjustment()
    for k in keys:
        adj.linux.sysctl[k] = "1"
    return adj


def test_sysctl_adjustment_rejected() -> None:
    req = request(adjust=sysctl_adjust("net.b", "net.a", "kernel.free"),
                  compound={api.Field.Sysctl: {"net.a": "p1", "net.b": "p2"}})
    assert validator(reject_sysctl_adjustment=True).validate(req) == (
        "validation error: attempted restricted sysctl adjustment by plugin(s) p1, p2")


def test_sysctl_adjustment_accepted() -> None:
    v = validator(reject_sysctl_adjustment=True)
    # Adjusted but owned by nobody, or owned but not in the adjustment.
    assert v.validate(request(adjust=sysctl_adjust("net.a"))) is None
    assert v.validate(request(adjust=sysctl_adjust("net.a"),
                              compound={api.Field.Sysctl: {"net.b": "p"}})) is None
    # No Linux part in the adjustment.
    assert v.validate(request(adjust=api.ContainerAdjustment(),
                              compound={api.Field.Sysctl: {"net.a": "p"}})) is None
    assert validator().validate(request(adjust=sysctl_adjust("net.a"),
                                        compound={api.Field.Sysctl: {"net.a": "p"}})) is None


# ---------------------------------------------------------------- required plugins

REQ = "required-plugins.noderesource.dev"


def test_configured_required_plugin_missing_rejected() -> None:
    v = validator(required_plugins=["guard"])
    assert v.validate(request(plugins=[("10", "other")])) == (
        'validation error: required plugin "guard" not present')


def test_required_plugins_missing_listed_together() -> None:
    v = validator(required_plugins=["a", "b"])
    assert v.validate(request(annotations={REQ: "[c]"})) == (
        'validation error: required plugins "a,b,c" not present')


def test_required_plugin_present_by_name_or_index_name() -> None:
    v = validator(required_plugins=["guard", "20-extra"])
    assert v.validate(request(plugins=[("10", "guard"), ("20", "extra")])) is None
    assert v.validate(request(plugins=[("10", "guard"), ("21", "extra")])) == (
        'validation error: required plugin "20-extra" not present')


def test_required_plugins_checked_without_adjustment() -> None:
    req = request(annotations={REQ: "[guard]"})
    assert not req.HasField("adjust")
    assert validator().validate(req) == 'validation error: required plugin "guard" not present'


@pytest.mark.parametrize(("annotations", "missing"), [
    ({REQ: "[pod-wide]"}, "pod-wide"),
    ({f"{REQ}/pod": "[pod]", REQ: "[plain]"}, "pod"),
    ({f"{REQ}/container.ctr": "[mine]", f"{REQ}/pod": "[pod]", REQ: "[plain]"}, "mine"),
    ({f"{REQ}/container.other": "[theirs]", REQ: "- plain"}, "plain"),
])
def test_required_annotation_lookup_order(annotations: dict[str, str], missing: str) -> None:
    """Container scope, then ``/pod``, then the bare key: only the first found counts."""
    assert validator().validate(request(annotations=annotations)) == (
        f'validation error: required plugin "{missing}" not present')


def test_required_annotation_empty_or_satisfied_accepted() -> None:
    v = validator()
    assert v.validate(request(annotations={REQ: ""})) is None
    assert v.validate(request(annotations={REQ: "[]"})) is None
    assert v.validate(request(annotations={f"{REQ}/container.other": "[x]"})) is None
    assert v.validate(request(annotations={REQ: "[a, b]"},
                              plugins=[("01", "a"), ("02", "b")])) is None


def test_required_annotation_invalid_rejected() -> None:
    reason = validator().validate(request(annotations={REQ: "{a: b}"}))
    assert reason is not None
    assert reason.startswith('invalid required-plugins.noderesource.dev annotation "{a: b}": ')


def test_tolerate_annotation_skips_required_plugins() -> None:
    v = validator(required_plugins=["guard"], tolerate_missing_plugins_annotation="tolerate")
    assert v.validate(request(annotations={"tolerate": "true", REQ: "[x]"})) is None
    assert v.validate(request(annotations={"tolerate/container.ctr": "1"})) is None
    # The container-scoped "false" wins over the pod-wide "true".
    assert v.validate(request(annotations={"tolerate/container.ctr": "false",
                                           "tolerate": "true"})) == (
        'validation error: required plugin "guard" not present')


def test_tolerate_annotation_needs_configured_key() -> None:
    v = validator(required_plugins=["guard"])
    assert v.validate(request(annotations={"tolerate": "true"})) == (
        'validation error: required plugin "guard" not present')


def test_tolerate_annotation_invalid_rejected() -> None:
    v = validator(required_plugins=["guard"], tolerate_missing_plugins_annotation="tolerate")
    assert v.validate(request(annotations={"tolerate": "yes"})) == (
        'invalid tolerate annotation "yes": strconv.ParseBool: parsing "yes": invalid syntax')


# ---------------------------------------------------------------- order


def test_first_failing_rule_wins() -> None:
    """Hooks, then seccomp, then namespaces, then required plugins, then sysctls."""
    adj = sysctl_adjust("net.a")
    req = request(adjust=adj, profile=RT_DEFAULT, annotations={REQ: "[x]"},
                  simple={api.Field.OciHooks: "h", api.Field.SeccompPolicy: "s"},
                  compound={api.Field.Namespace: {"ipc": "n"},
                            api.Field.Sysctl: {"net.a": "y"}})
    rules = dict(reject_oci_hook_adjustment=True, reject_runtime_default_seccomp_adjustment=True,
                 reject_namespace_adjustment=True, reject_sysctl_adjustment=True)
    expected = ["OCI hook", "seccomp", "namespace", "required plugin", "sysctl"]
    for want in expected:
        reason = validator(**rules).validate(req)
        assert reason is not None and want in reason
        if want == "OCI hook":
            rules["reject_oci_hook_adjustment"] = False
        elif want == "seccomp":
            rules["reject_runtime_default_seccomp_adjustment"] = False
        elif want == "namespace":
            rules["reject_namespace_adjustment"] = False
        elif want == "required plugin":
            req.plugins.add(name="x", index="05")
    rules["reject_sysctl_adjustment"] = False
    assert validator(**rules).validate(req) is None
