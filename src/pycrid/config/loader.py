"""Load config.toml: parse, migrate older layouts, decode each section, collect warnings."""

from __future__ import annotations

import copy
import logging
import os
import tomllib
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from pycrid.config.decode import ConfigError, closest, decode, key_join
from pycrid.config.emit import emit_table
from pycrid.config.schema import CURRENT_VERSION, Config
from pycrid.plugin.registry import Registration

log = logging.getLogger(__name__)


@dataclass
class LoadedConfig:
    config: Config
    #: Decoded section of every plugin that has a config type, by plugin uri.
    plugins: dict[str, Any]
    #: Unknown keys and deprecations, said once at start-up and shown in Status verbose info.
    warnings: list[str] = field(default_factory=list)
    source: str = ""


def read_toml(path: str) -> dict[str, Any]:
    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except tomllib.TOMLDecodeError as e:
        raise ConfigError("(file)", f"{path} is not valid TOML: {e}") from None
    except OSError as e:
        raise ConfigError("(file)", f"cannot read {path}: {e.strerror}") from None


def migrate(
    raw: dict[str, Any], registrations: Iterable[Registration]
) -> tuple[dict[str, Any], int]:
    """Upgrade ``raw`` to CURRENT_VERSION in a copy; returns it and the version it came from."""
    version = raw.get("version", CURRENT_VERSION)
    if isinstance(version, bool) or not isinstance(version, int):
        raise ConfigError("version", f"must be an integer, got {version!r}")
    if version < 1 or version > CURRENT_VERSION:
        raise ConfigError(
            "version", f"unsupported config version {version} (this pycrid reads 1 to "
            f"{CURRENT_VERSION})")
    out = copy.deepcopy(raw)
    plugins = out.setdefault("plugins", {})
    if not isinstance(plugins, dict):
        raise ConfigError("plugins", "must be a table")
    regs = list(registrations)
    for v in range(version, CURRENT_VERSION):
        for reg in regs:
            if reg.migrate is not None:
                reg.migrate(v, plugins)
    out["version"] = CURRENT_VERSION
    if not plugins:
        del out["plugins"]
    return out, version


def load(path: str | None, registrations: Iterable[Registration]) -> LoadedConfig:
    """Read ``path`` (None: the embedded defaults) into a validated config.

    Invalid values raise ConfigError naming the key; unknown keys become warnings.
    """
    regs = list(registrations)
    raw: dict[str, Any] = read_toml(path) if path else {}
    warnings: list[str] = []
    if path and "version" not in raw:
        warnings.append(f"{path} has no 'version' key; reading it as version {CURRENT_VERSION}")
    raw, from_version = migrate(raw, regs)
    if from_version < CURRENT_VERSION:
        warnings.append(
            f"{path} uses config version {from_version}; it was upgraded in memory, "
            f"run 'pycrid config migrate --config {path}' to rewrite it as version "
            f"{CURRENT_VERSION}")
    errors: list[ConfigError] = []
    config = Config()
    try:
        config, unknown = decode(Config, {k: v for k, v in raw.items() if k != "plugins"}, "")
    except ConfigError as e:
        errors.append(e)  # the plugin sections are still read, so every mistake is told
        unknown = e.unknown
    warnings.extend(u.warning() for u in unknown)
    sections: dict[str, Any] = raw.get("plugins", {})
    by_uri = {r.uri: r for r in regs}
    plugins: dict[str, Any] = {}
    for name, _section in sections.items():
        if name not in by_uri:
            near = closest(name, by_uri)
            hint = f"; did you mean plugins.\"{near}\"?" if near else ""
            warnings.append(f"unknown config section plugins.\"{name}\" (no such plugin; "
                            f"ignored{hint})")
    for uri, reg in by_uri.items():
        if reg.config is None:
            if sections.get(uri):
                warnings.append(f"plugin {uri} takes no config; plugins.\"{uri}\" ignored")
            continue
        try:
            obj, unknown = decode(reg.config, sections.get(uri, {}), key_join("plugins", uri))
        except ConfigError as e:
            errors.append(e)
            warnings.extend(u.warning() for u in e.unknown)
            continue
        warnings.extend(u.warning() for u in unknown)
        plugins[uri] = obj
    if errors:
        # The warnings too: a misspelt key is often why a value is missing.
        raise ConfigError.combine(errors, notes=warnings)
    config.plugins = plugins
    for name in config.disabled_plugins:
        if name not in by_uri:
            warnings.append(f"disabled_plugins names {name!r}, which is not a plugin")
    return LoadedConfig(config=config, plugins=plugins, warnings=warnings, source=path or "")


def default_config_path(explicit: str | None) -> str | None:
    """The file to read: the one named, else /etc/pycrid/config.toml if it exists, else none."""
    from pycrid.config.schema import DEFAULT_CONFIG_PATH

    if explicit:
        return explicit
    return DEFAULT_CONFIG_PATH if os.path.exists(DEFAULT_CONFIG_PATH) else None


def render_default(registrations: Iterable[Registration]) -> str:
    """Every key with its default, commented: what ``pycrid config default`` prints."""
    top = Config()
    lines = [
        "# pycrid configuration: every key with its default value.",
        f"# Installed at {'/etc/pycrid/config.toml'} it is read by 'pycrid serve'.",
        "",
        emit_table(top),
    ]
    for reg in registrations:
        if reg.config is None:
            continue
        header = key_join("plugins", reg.uri)
        lines += ["", f"[{header}]", emit_table(reg.config(), header)]
    return "\n".join(lines).rstrip() + "\n"


def render_raw(raw: dict[str, Any]) -> str:
    """A config table as TOML (for ``config migrate``): keys kept as the user wrote them."""
    body = {k: v for k, v in raw.items() if k != "plugins"}
    text = emit_table(body)
    for name, section in raw.get("plugins", {}).items():
        header = key_join("plugins", name)
        text += f"\n\n[{header}]\n" + emit_table(section, header)
    return text.strip() + "\n"
