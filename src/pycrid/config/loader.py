"""Load config.toml: parse, migrate older layouts, decode each section, refuse what this
release does not know, collect warnings.

A key or plugin section this release does not know stops start-up naming it, as an
invalid value does: it is a typo, or a key a newer release added (a config kept through
a rollback), and either way the setting the operator wrote would not apply
(docs/upgrades.md). Deprecations stay warnings."""

from __future__ import annotations

import copy
import logging
import os
import tomllib
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from pycrid import release
from pycrid.config.decode import ConfigError, UnknownKey, closest, decode, key_join
from pycrid.config.emit import emit_table
from pycrid.config.schema import CURRENT_VERSION, Config
from pycrid.plugin.registry import Registration

log = logging.getLogger(__name__)


@dataclass
class LoadedConfig:
    config: Config
    #: Decoded section of every plugin that has a config type, by plugin uri.
    plugins: dict[str, Any]
    #: Deprecations and the like, said once at start-up and shown in Status verbose info.
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

    Invalid values and unknown keys raise one ConfigError naming every key.
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
    unknown: list[UnknownKey] = []
    config = Config()
    try:
        config, unknown = decode(Config, {k: v for k, v in raw.items() if k != "plugins"}, "")
    except ConfigError as e:
        errors.append(e)  # the plugin sections are still read, so every mistake is told
        unknown = list(e.unknown)
    sections: dict[str, Any] = raw.get("plugins", {})
    by_uri = {r.uri: r for r in regs}
    plugins: dict[str, Any] = {}
    for name, _section in sections.items():
        if name not in by_uri:
            near = closest(name, by_uri)
            hint = f"; did you mean plugins.\"{near}\"?" if near else ""
            errors.append(ConfigError(key_join("plugins", name),
                                      f"no such plugin in pycrid {release.VERSION}{hint}"))
    for uri, reg in by_uri.items():
        if reg.config is None:
            if sections.get(uri):
                errors.append(ConfigError(key_join("plugins", uri),
                                          "this plugin takes no configuration"))
            continue
        try:
            obj, more = decode(reg.config, sections.get(uri, {}), key_join("plugins", uri))
        except ConfigError as e:
            errors.append(e)
            unknown.extend(e.unknown)
            continue
        unknown.extend(more)
        plugins[uri] = obj
    errors.extend(u.error(release.VERSION) for u in unknown)
    if errors:
        notes = list(warnings)
        if unknown:
            notes.append("keys this release does not know are refused, not ignored: a key "
                         "of a newer pycrid comes out of the config before an older one "
                         "runs it (docs/upgrades.md)")
        raise ConfigError.combine(errors, notes=notes)
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
