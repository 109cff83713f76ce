"""Config: decoding, validation messages, unknown keys, defaults round trip, migration."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from pycrid import release
from pycrid.builtins import registry
from pycrid.config.decode import ConfigError, Duration
from pycrid.config.images_schema import ImagesConfig
from pycrid.config.loader import load, migrate, render_default, render_raw
from pycrid.config.schema import CURRENT_VERSION

REGS = registry().registrations()
IMAGES = 'plugins."pycrid.cri.v1.images"'


def write(tmp_path: Path, text: str) -> str:
    p = tmp_path / "config.toml"
    p.write_text(text)
    return str(p)


def test_embedded_defaults() -> None:
    loaded = load(None, REGS)
    assert loaded.config.root == "/var/lib/pycrid"
    assert loaded.config.state == "/run/pycrid"
    assert loaded.config.grpc.address == "/run/pycrid/pycrid.sock"
    images = loaded.plugins["pycrid.cri.v1.images"]
    assert isinstance(images, ImagesConfig)
    assert images.sandbox_image == "registry.k8s.io/pause:3.10"
    assert images.max_concurrent_downloads == 3
    assert loaded.warnings == []


def test_values_are_read(tmp_path: Path) -> None:
    path = write(tmp_path, f"""
version = 2
root = "/srv/pycrid"
[grpc]
address = "/tmp/x.sock"
[{IMAGES}]
max_concurrent_downloads = 7
image_pull_progress_timeout = "1m30s"
[{IMAGES}.registry]
config_path = "/etc/certs.d"
""")
    loaded = load(path, REGS)
    images = loaded.plugins["pycrid.cri.v1.images"]
    assert loaded.config.root == "/srv/pycrid"
    assert loaded.config.grpc.address == "/tmp/x.sock"
    assert images.max_concurrent_downloads == 7
    assert float(images.image_pull_progress_timeout) == 90.0
    assert images.registry.config_path == "/etc/certs.d"


def test_unknown_keys_are_errors_by_name(tmp_path: Path) -> None:
    path = write(tmp_path, f"""
version = 2
bogus = 1
[grpc]
adress = "/x"
[{IMAGES}]
sandbox_imag = "x"
[plugins."no.such.plugin"]
a = 1
""")
    with pytest.raises(ConfigError) as e:
        load(path, REGS)
    assert sorted(k for k, _ in e.value.problems) == sorted(
        ["bogus", "grpc.adress", f"{IMAGES}.sandbox_imag", 'plugins."no.such.plugin"'])


@pytest.mark.parametrize(
    ("body", "key", "reason"),
    [
        ('root = "relative/dir"', "root", "absolute path"),
        ("root = 5", "root", "must be a string"),
        ("[grpc]\nmax_recv_message_size = 10", "grpc.max_recv_message_size", "at least"),
        ('[debug]\nlevel = "chatty"', "debug.level", "one of"),
        (f"[{IMAGES}]\nmax_concurrent_downloads = 0", f"{IMAGES}.max_concurrent_downloads",
         "at least 1"),
        (f'[{IMAGES}]\nimage_pull_progress_timeout = "soon"',
         f"{IMAGES}.image_pull_progress_timeout", "not a duration"),
        (f'[{IMAGES}]\nallow_device_nodes = "yes"', f"{IMAGES}.allow_device_nodes",
         "true or false"),
        (f'[{IMAGES}]\nsnapshotter = "btrfs"', f"{IMAGES}.snapshotter", "one of"),
        ("grpc = 3", "grpc", "must be a table"),
    ],
)
def test_invalid_values_name_the_key(tmp_path: Path, body: str, key: str, reason: str) -> None:
    path = write(tmp_path, "version = 2\n" + body + "\n")
    with pytest.raises(ConfigError) as e:
        load(path, REGS)
    assert e.value.key == key
    assert reason in str(e.value)
    assert key in str(e.value)


RUNTIME = 'plugins."pycrid.cri.v1.runtime"'
NRI = 'plugins."pycrid.nri.v1.nri"'


def test_every_invalid_value_is_reported_at_once(tmp_path: Path) -> None:
    path = write(tmp_path, f"""
version = 2
root = 5
[debug]
level = "chatty"
format = "xml"
[{IMAGES}]
max_concurrent_downloads = 0
[{NRI}]
plugin_request_timeout = "soon"
plugin_request_timeouts = {{ a = "1s", b = "never", c = -1 }}
""")
    with pytest.raises(ConfigError) as e:
        load(path, REGS)
    keys = [k for k, _ in e.value.problems]
    assert keys == ["root", "debug.level", "debug.format", f"{IMAGES}.max_concurrent_downloads",
                    f"{NRI}.plugin_request_timeout", f"{NRI}.plugin_request_timeouts.b",
                    f"{NRI}.plugin_request_timeouts.c"]
    text = str(e.value)
    assert text.startswith("7 errors:\n  config key root: must be a string")
    for key in keys:
        assert f"\n  config key {key}: " in text
    assert e.value.key == "root"  # the first, for callers that name one


def test_every_bad_item_of_a_list_is_reported(tmp_path: Path) -> None:
    path = write(tmp_path, 'version = 2\ndisabled_plugins = [1, "ok", true]\n')
    with pytest.raises(ConfigError) as e:
        load(path, REGS)
    assert [k for k, _ in e.value.problems] == ["disabled_plugins[0]", "disabled_plugins[2]"]


def test_unknown_keys_stop_start_up_naming_the_closest_known_key(tmp_path: Path) -> None:
    """A key this release does not know (a typo, or a newer release's key in a config
    kept through a rollback) is refused by name, never ignored."""
    path = write(tmp_path, f"""
version = 2
bogus = 1
[grpc]
adress = "/x"
[{RUNTIME}]
cgroup_drivr = "cgroupfs"
[plugins."pycrid.cri.v1.image"]
sandbox_image = "x"
""")
    with pytest.raises(ConfigError) as e:
        load(path, REGS)
    v = release.VERSION
    assert dict(e.value.problems) == {
        "bogus": f"not a key of pycrid {v}",
        "grpc.adress": f"not a key of pycrid {v}; did you mean `address`?",
        f"{RUNTIME}.cgroup_drivr": f"not a key of pycrid {v}; did you mean `cgroup_driver`?",
        'plugins."pycrid.cri.v1.image"': f'no such plugin in pycrid {v}; did you mean '
                                         'plugins."pycrid.cri.v1.images"?'}
    assert str(e.value).startswith("4 errors:\n  config key ")
    assert "a key of a newer pycrid comes out of the config" in str(e.value)


def test_a_newer_releases_key_is_refused(tmp_path: Path) -> None:
    """What an older release does with a config a newer one reads: the key is named."""
    path = write(tmp_path, 'version = 2\n[plugins."pycrid.cri.v1.images"]\n'
                           'signature_policy_path = "/etc/containers/policy.json"\n')
    with pytest.raises(ConfigError) as e:
        load(path, REGS)
    assert e.value.key == 'plugins."pycrid.cri.v1.images".signature_policy_path'
    assert str(e.value).startswith(
        'config key plugins."pycrid.cri.v1.images".signature_policy_path: not a key of '
        f"pycrid {release.VERSION}")


def test_a_section_for_a_plugin_without_config_is_refused(tmp_path: Path) -> None:
    no_config = next(r.uri for r in REGS if r.config is None)
    path = write(tmp_path, f'version = 2\n[plugins."{no_config}"]\nx = 1\n')
    with pytest.raises(ConfigError) as e:
        load(path, REGS)
    assert e.value.problems == [(f'plugins."{no_config}"',
                                 "this plugin takes no configuration")]


def test_an_invalid_file_also_names_its_unknown_keys(tmp_path: Path) -> None:
    # The misspelt key is why the intended value never applied: say both at once.
    path = write(tmp_path, 'version = 2\n[debug]\nlevel = "chatty"\nformt = "json"\n')
    with pytest.raises(ConfigError) as e:
        load(path, REGS)
    assert e.value.problems == [
        ("debug.level", "must be one of 'debug', 'info', 'warning', 'error' (got 'chatty')"),
        ("debug.formt", f"not a key of pycrid {release.VERSION}; did you mean `format`?")]


def test_bad_toml_and_versions(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not valid TOML"):
        load(write(tmp_path, "version = = 2"), REGS)
    with pytest.raises(ConfigError, match="unsupported config version 99"):
        load(write(tmp_path, "version = 99"), REGS)
    with pytest.raises(ConfigError, match="cannot read"):
        load(str(tmp_path / "missing.toml"), REGS)


def test_default_rendering_round_trips() -> None:
    text = render_default(REGS)
    raw = tomllib.loads(text)
    assert raw["version"] == CURRENT_VERSION
    assert raw["grpc"]["address"] == "/run/pycrid/pycrid.sock"
    assert raw["plugins"]["pycrid.cri.v1.images"]["image_pull_progress_timeout"] == "5m"
    assert raw["plugins"]["pycrid.cri.v1.images"]["registry"]["config_path"]
    # Every key of every section appears, and reading the output back warns about nothing.
    for field in ImagesConfig.__dataclass_fields__:
        assert field in raw["plugins"]["pycrid.cri.v1.images"]
    assert "# Log level." in text


def test_default_rendering_loads_cleanly(tmp_path: Path) -> None:
    loaded = load(write(tmp_path, render_default(REGS)), REGS)
    assert loaded.warnings == []
    assert loaded.config.grpc.max_recv_message_size == 16 * 1024 * 1024


V1 = """
version = 1
root = "/srv/x"
[plugins."pycrid.grpc.v1.cri"]
sandbox_image = "example.com/pause:9"
max_concurrent_downloads = 5
systemd_cgroup = true
disable_tcp_service = false
[plugins."pycrid.grpc.v1.cri".containerd]
snapshotter = "overlayfs"
[plugins."pycrid.grpc.v1.cri".registry]
config_path = "/etc/old/certs.d"
"""


def test_migrate_v1(tmp_path: Path) -> None:
    raw, from_version = migrate(tomllib.loads(V1), REGS)
    assert from_version == 1
    assert raw["version"] == CURRENT_VERSION
    images = raw["plugins"]["pycrid.cri.v1.images"]
    assert images == {
        "sandbox_image": "example.com/pause:9",
        "max_concurrent_downloads": 5,
        "snapshotter": "overlayfs",
        "registry": {"config_path": "/etc/old/certs.d"},
    }
    assert raw["plugins"]["pycrid.cri.v1.runtime"] == {"cgroup_driver": "systemd"}
    assert raw["plugins"]["pycrid.grpc.v1.cri"] == {"disable_tcp_service": False}
    # The rewritten file loads as the current version with no warnings and the same values.
    rewritten = write(tmp_path, render_raw(raw))
    loaded = load(rewritten, REGS)
    assert loaded.warnings == []
    assert loaded.plugins["pycrid.cri.v1.images"].sandbox_image == "example.com/pause:9"
    assert loaded.plugins["pycrid.cri.v1.runtime"].cgroup_driver == "systemd"


def test_loading_v1_warns_and_upgrades(tmp_path: Path) -> None:
    loaded = load(write(tmp_path, V1), REGS)
    assert any("config migrate" in w for w in loaded.warnings)
    assert loaded.plugins["pycrid.cri.v1.images"].max_concurrent_downloads == 5


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("5s", 5), ("1m30s", 90), ("250ms", 0.25), ("2h", 7200), ("0", 0), ("1.5s", 1.5)],
)
def test_duration(text: str, seconds: float) -> None:
    assert float(Duration.parse(text)) == pytest.approx(seconds)
    assert float(Duration.parse(str(Duration.parse(text)))) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["5", "s", "5x", "1m 2s", "-1s", "abc"])
def test_bad_duration(text: str) -> None:
    with pytest.raises(ValueError):
        Duration.parse(text)
