"""scripts/default-cni.sh (run by ``setup.sh serve``): pycrid's pod network goes into a CNI
config directory only when it has no network config at all."""

from __future__ import annotations

import stat
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "default-cni.sh"
OURS = REPO / "contrib" / "cni" / "10-pycrid-net.conflist"


def run(conf_dir: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", str(SCRIPT), str(conf_dir)], capture_output=True, text=True,
                          timeout=30, check=True)


def test_setup_serve_uses_it() -> None:
    setup = (REPO / "scripts" / "setup.sh").read_text()
    assert "scripts/default-cni.sh /etc/cni/net.d" in setup
    assert "contrib/cni/10-pycrid-net.conflist" not in setup  # no second copy of the logic


@pytest.mark.parametrize("make", [False, True], ids=["missing dir", "empty dir"])
def test_installed_where_there_is_no_config(tmp_path: Path, make: bool) -> None:
    conf_dir = tmp_path / "net.d"
    if make:
        conf_dir.mkdir()
        (conf_dir / "README").write_text("not a network config")
        (conf_dir / ".hidden.conf").write_text("{}")  # dotfiles are not read
    proc = run(conf_dir)
    installed = conf_dir / OURS.name
    assert installed.read_bytes() == OURS.read_bytes()
    assert stat.S_IMODE(installed.stat().st_mode) == 0o644
    assert f"installed the default pod network: {installed}" in proc.stdout


@pytest.mark.parametrize("name", ["10-mine.conf", "10-mine.conflist", "10-mine.json"])
def test_any_existing_config_is_left_alone(tmp_path: Path, name: str) -> None:
    conf_dir = tmp_path / "net.d"
    conf_dir.mkdir()
    (conf_dir / name).write_text('{"name": "mine"}')
    proc = run(conf_dir)
    assert sorted(p.name for p in conf_dir.iterdir()) == [name]
    assert proc.stdout == ""


def test_an_edited_copy_of_ours_is_not_overwritten(tmp_path: Path) -> None:
    conf_dir = tmp_path / "net.d"
    conf_dir.mkdir()
    run(conf_dir)
    edited = OURS.read_text().replace("10.88.0.0/16", "10.99.0.0/16")
    (conf_dir / OURS.name).write_text(edited)
    run(conf_dir)
    assert (conf_dir / OURS.name).read_text() == edited
