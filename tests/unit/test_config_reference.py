"""docs/config.md is generated from the config schema; it must not drift from it."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from pycrid.builtins import registry
from pycrid.config.decode import Duration
from pycrid.config.reference_doc import render_reference, type_name
from pycrid.config.schema import RuntimeHandlerConfig

DOC = Path(__file__).resolve().parents[2] / "docs" / "config.md"


def test_docs_config_md_is_the_generated_reference() -> None:
    text = render_reference(registry().registrations())
    assert DOC.read_text() == text, (
        "docs/config.md is stale; regenerate it with "
        "`.venv/bin/pycrid config reference > docs/config.md`")


def test_every_key_of_config_default_is_in_the_reference() -> None:
    from pycrid.config.loader import render_default

    regs = registry().registrations()
    reference = render_reference(regs)
    keys = {line.split(" = ", 1)[0] for line in render_default(regs).splitlines()
            if " = " in line and not line.startswith("#")}
    assert keys, "config default printed no keys"
    missing = sorted(k for k in keys if f"| `{k}` |" not in reference)
    # The runtimes.runc defaults are printed by config default; their keys are documented
    # once under runtimes.NAME.
    assert missing == []


def test_reference_rows_carry_type_default_and_help() -> None:
    text = render_reference(registry().registrations())
    assert ("| `plugin_request_timeout` | duration | `\"2s\"` | Deadline of each event call "
            "to a plugin (Synchronize has plugin_registration_timeout); a plugin that misses it "
            "is closed. |") in text
    assert '## `[plugins."pycrid.cri.v1.runtime".runtimes.NAME.options]`' in text
    assert "| `bin_dirs` | array of strings | `[\"/opt/cni/bin\", \"/usr/lib/cni\"]` |" in text
    for f in dataclasses.fields(RuntimeHandlerConfig):
        if not dataclasses.is_dataclass(f.type) and f.name != "options":
            assert f"| `{f.name}` |" in text


def test_type_names() -> None:
    assert type_name(Duration) == "duration"
    assert type_name(list[str]) == "array of strings"
    assert type_name(dict[str, Duration]) == "table of durations"
    assert type_name(dict[str, RuntimeHandlerConfig]) == "table of tables"


def test_cli_prints_the_reference(capsys: object) -> None:
    from pycrid.cli import main

    assert main(["config", "reference"]) == 0
    out = capsys.readouterr().out  # type: ignore[attr-defined]
    assert out == render_reference(registry().registrations())
