"""Runtime handlers: config to handler specs, runc feature reading, routing by object id."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path
from typing import Any

import pytest

from pycrid.config.decode import ConfigError
from pycrid.config.schema import RuntimeConfig, RuntimeHandlerConfig, RuntimeHandlerOptions
from pycrid.errors import InvalidArgument
from pycrid.runtime.exits import Exit
from pycrid.runtime.handlers import RuntimeRouter, default_runc, features_from, load_handlers
from pycrid.runtime.interface import ContainerRuntime, CreateOptions, ExecResult
from pycrid.stdio import ProcessIO


def _config(**handlers: RuntimeHandlerConfig) -> RuntimeConfig:
    return RuntimeConfig(runtime_path="/usr/sbin/runc",
                         runtimes={"runc": RuntimeHandlerConfig(), **handlers})


def test_default_roots_and_binaries() -> None:
    got = load_handlers(_config(alt=RuntimeHandlerConfig(
        options=RuntimeHandlerOptions(BinaryName="/opt/runc"))), "/run/p")
    assert got["runc"].runc_root == "/run/p/runc"
    assert got["alt"].runc_root == "/run/p/runc-alt"
    assert got["runc"].runc_binary == "/usr/sbin/runc"
    assert got["alt"].runc_binary == "/opt/runc"
    assert got["alt"].base_spec is None


def test_the_default_runc_is_a_path_also_when_not_configured() -> None:
    # The host facts ask this runc its version: "" would make every version check fail.
    found = default_runc(RuntimeConfig())
    assert os.path.isabs(found) and os.access(found, os.X_OK)
    assert default_runc(_config()) == "/usr/sbin/runc"


def test_shared_root_is_refused() -> None:
    same = RuntimeHandlerOptions(Root="/run/p/runc")
    with pytest.raises(ConfigError, match="share one runc root"):
        load_handlers(_config(alt=RuntimeHandlerConfig(options=same)), "/run/p")


def test_base_spec_is_read_and_completed(tmp_path: Path) -> None:
    path = tmp_path / "spec.json"
    path.write_text(json.dumps({"process": {"rlimits": []}, "linux": {}}))
    got = load_handlers(_config(alt=RuntimeHandlerConfig(base_runtime_spec=str(path),
                                                         pod_annotations=["a/*"])), "/r")
    spec = got["alt"].base_spec
    assert spec is not None
    assert spec["process"]["rlimits"] == [] and spec["root"] == {"path": "rootfs"}
    assert spec["linux"]["resources"]["devices"] == [{"allow": False, "access": "rwm"}]
    assert got["alt"].pod_annotations == ("a/*",)


@pytest.mark.parametrize(("text", "why"), [
    (None, "cannot read"), ("[1", "not valid JSON"), ("[]", "not an OCI runtime spec")])
def test_bad_base_spec_names_the_key(tmp_path: Path, text: str | None, why: str) -> None:
    path = tmp_path / "spec.json"
    if text is not None:
        path.write_text(text)
    with pytest.raises(ConfigError) as err:
        load_handlers(_config(alt=RuntimeHandlerConfig(base_runtime_spec=str(path))), "/r")
    assert err.value.key.endswith("runtimes.alt.base_runtime_spec")
    assert why in err.value.reason


def test_features_from_runc_output() -> None:
    old_runc = {"mountOptions": ["ro", "rro"], "linux": {"namespaces": ["user", "pid"]}}
    feats = features_from(old_runc)
    assert feats.user_namespaces is False  # no idmapped mounts
    new_runc = {"mountOptions": ["rro"], "linux": {
        "namespaces": ["user"], "mountExtensions": {"idmap": {"enabled": True}}}}
    assert features_from(new_runc).user_namespaces is True
    assert features_from({"mountOptions": ["ro"]}).recursive_read_only_mounts is False


class _Recorder(ContainerRuntime):
    """A runtime that only records which ids it was asked about."""

    def __init__(self, name: str, listed: tuple[str, ...] = ()) -> None:
        self.name = name
        self.exit_dir = "/run/exits"
        self.calls: list[tuple[str, str]] = []
        self.listed = listed

    async def create(self, opts: CreateOptions) -> int:
        self.calls.append(("create", opts.id))
        return 1

    async def start(self, object_id: str) -> None:
        self.calls.append(("start", object_id))

    async def kill(self, object_id: str, signal: int) -> bool:
        self.calls.append(("kill", object_id))
        return True

    async def delete(self, object_id: str) -> None:
        self.calls.append(("delete", object_id))

    async def update(self, object_id: str, resources: dict[str, Any]) -> None:
        self.calls.append(("update", object_id))

    async def state(self, object_id: str) -> dict[str, Any] | None:
        return None

    async def states(self) -> dict[str, dict[str, Any]]:
        return {i: {"id": i, "status": "running"} for i in self.listed}

    async def exec_sync(self, object_id: str, process: dict[str, Any], *,
                        limit: float | None, output_cap: int) -> ExecResult:
        self.calls.append(("exec", object_id))
        return ExecResult(0, b"", b"")

    async def exec_stream(self, object_id: str, process: dict[str, Any], io: ProcessIO) -> int:
        return 0

    async def attach(self, bundle: str, io: ProcessIO) -> None:
        pass

    def exit_of(self, object_id: str) -> Exit | None:
        return None

    def watch(self, object_id: str, bundle: str) -> bool:
        self.calls.append(("watch", object_id))
        return True

    async def monitor_lost(self, object_id: str, bundle: str, reason: str = "") -> Exit | None:
        self.calls.append(("lost", object_id))
        return None

    def forget_exit(self, object_id: str) -> None:
        pass

    def oom_killed(self, bundle: str) -> bool:
        return False

    async def reopen_log(self, bundle: str, log_path: str) -> None:
        pass


def test_router_sends_each_id_to_its_handler() -> None:
    runc, alt = _Recorder("runc"), _Recorder("alt", listed=("old",))
    router = RuntimeRouter({"runc": runc, "alt": alt}, "runc")

    async def scenario() -> None:
        await router.create(CreateOptions(id="a", bundle="/b", name="a", runtime_handler="alt"))
        await router.create(CreateOptions(id="d", bundle="/b", name="d"))
        await router.start("a")
        await router.kill("d", 9)
        await router.exec_sync("a", {}, limit=None, output_cap=1)
        assert set(await router.states()) == {"old"}  # learned: "old" is alt's
        assert router.watch("old", "/b")
        await router.monitor_lost("old", "/b")
        await router.delete("old")
        await router.delete("a")
        await router.delete("a")  # forgotten after delete: goes to the default
        with pytest.raises(InvalidArgument, match="kata"):
            await router.create(CreateOptions(id="k", bundle="/b", name="k",
                                              runtime_handler="kata"))

    asyncio.run(scenario())
    assert alt.calls == [("create", "a"), ("start", "a"), ("exec", "a"), ("watch", "old"),
                         ("lost", "old"), ("delete", "old"), ("delete", "a")]
    assert runc.calls == [("create", "d"), ("kill", "d"), ("delete", "a")]
