"""The release and the commit it was built from: one place for the version, the commit from
a build, ``git archive`` or the checkout itself."""

from __future__ import annotations

import re
import subprocess
import tomllib
from pathlib import Path

import pytest

import pycrid
from pycrid import release

REPO = Path(__file__).resolve().parents[2]


def test_the_version_is_written_once() -> None:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert "version" not in project and "version" in project["dynamic"]
    assert release.VERSION == pycrid.__version__
    assert re.fullmatch(r"\d+\.\d+\.\d+", release.VERSION)


def test_the_changelog_has_an_entry_for_this_release() -> None:
    text = (REPO / "CHANGELOG.md").read_text()
    assert re.search(rf"^## {re.escape(release.VERSION)}\b", text, re.M), (
        f"CHANGELOG.md has no '## {release.VERSION}' entry")


def _fresh_commit(monkeypatch: pytest.MonkeyPatch, commit_file: Path) -> str:
    monkeypatch.setattr(release, "COMMIT_FILE", str(commit_file))
    release.commit.cache_clear()
    try:
        return release.commit()
    finally:
        release.commit.cache_clear()


def test_a_recorded_commit_wins(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    recorded = tmp_path / "COMMIT"
    recorded.write_text("ab" * 20 + "\n")
    assert _fresh_commit(monkeypatch, recorded) == "ab" * 20
    monkeypatch.setattr(release, "commit", lambda: "ab" * 20)
    assert release.runtime_version() == f"{release.VERSION}+{'ab' * 6}"
    assert release.describe() == f"pycrid {release.VERSION} (commit {'ab' * 20})"


def test_no_commit_outside_a_checkout(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    placeholder = tmp_path / "COMMIT"
    placeholder.write_text("$Format:%H$\n")  # a tarball not made by git archive
    assert _fresh_commit(monkeypatch, placeholder) == ""
    monkeypatch.setattr(release, "commit", lambda: "")
    assert release.runtime_version() == release.VERSION
    assert release.describe().endswith("(commit unknown)")


def test_a_dirty_checkout_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(release, "commit", lambda: "cd" * 20 + "-dirty")
    assert release.runtime_version() == f"{release.VERSION}+{'cd' * 6}.dirty"


def test_in_this_checkout_the_commit_is_git_head() -> None:
    head = subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True,
                          text=True, check=False).stdout.strip()
    if not re.fullmatch(r"[0-9a-f]{40}", head):
        pytest.skip("not a git checkout (a source tarball)")
    release.commit.cache_clear()
    assert release.commit().removesuffix("-dirty") == head


def test_git_archive_records_the_commit(tmp_path: Path) -> None:
    head = subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True,
                          text=True, check=False).stdout.strip()
    if not re.fullmatch(r"[0-9a-f]{40}", head):
        pytest.skip("not a git checkout (a source tarball)")
    out = subprocess.run(["git", "-C", str(REPO), "archive", "HEAD", "src/pycrid/COMMIT"],
                         capture_output=True, check=True).stdout
    import io
    import tarfile

    with tarfile.open(fileobj=io.BytesIO(out)) as tar:
        member = tar.extractfile("src/pycrid/COMMIT")
        assert member is not None
        assert member.read().decode().strip() == head
