"""Fixtures shared by every test directory.

Registries: ``registry`` (plain http, no auth), ``registry_basic`` and ``registry_token``
(user alice/wonderland), ``registry_tls`` (https, client certificates required). Each is
a real ``docker-registry`` process, started once per session on first use and loaded
with the standard set described by ``test_images``. ``push_image`` pushes anything
else (hostile layers, big layers); ``registry_factory`` makes a private registry that
lives for one test.
"""

from __future__ import annotations

import secrets
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support import network
from tests.support.certs import TestPKI, make_pki
from tests.support.images import TestImages, load_standard_set, push, standard_images
from tests.support.registry import LocalRegistry

USERS = {"alice": "wonderland"}


@pytest.fixture(autouse=True)
def _test_network_given_back(request: pytest.FixtureRequest) -> Iterator[None]:
    """A test's daemons under its ``tmp_path`` are stopped when the test ends: their test
    networks (bridge and subnet) go back to the pool the whole session shares."""
    base = (str(request.getfixturevalue("tmp_path")) if "tmp_path" in request.fixturenames
            else None)
    yield
    if base is not None:
        network.release_under(base)


@pytest.fixture(scope="session")
def pki(tmp_path_factory: pytest.TempPathFactory) -> TestPKI:
    """One test CA, server, client and token-signing certificate for the whole session."""
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="session")
def test_images() -> TestImages:
    """Refs and digests of the standard set, identical in every registry fixture."""
    return standard_images()


def _session_registry(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, name: str,
    **kwargs: Any,
) -> LocalRegistry:
    reg = LocalRegistry(tmp_path_factory.mktemp(name), **kwargs)
    # Finalizer first, start second: a start that fails half-way still gets stopped.
    request.addfinalizer(reg.stop)
    reg.start()
    load_standard_set(reg)
    return reg


@pytest.fixture(scope="session")
def registry(request: pytest.FixtureRequest,
             tmp_path_factory: pytest.TempPathFactory) -> LocalRegistry:
    return _session_registry(request, tmp_path_factory, "registry")


@pytest.fixture(scope="session")
def registry_basic(request: pytest.FixtureRequest,
                   tmp_path_factory: pytest.TempPathFactory) -> LocalRegistry:
    return _session_registry(request, tmp_path_factory, "registry-basic",
                             auth="basic", users=USERS)


@pytest.fixture(scope="session")
def registry_token(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory,
                   pki: TestPKI) -> LocalRegistry:
    return _session_registry(request, tmp_path_factory, "registry-token",
                             auth="token", users=USERS, pki=pki)


@pytest.fixture(scope="session")
def registry_tls(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory,
                 pki: TestPKI) -> LocalRegistry:
    return _session_registry(request, tmp_path_factory, "registry-tls",
                             tls=True, client_ca=True, pki=pki)


@pytest.fixture(scope="session")
def push_image() -> Callable[..., str]:
    """``push_image(registry, repo, ref, build, creds=None) -> digest`` (see images.push)."""
    return push


@pytest.fixture
def registry_factory(tmp_path: Path, pki: TestPKI) -> Iterator[Callable[..., LocalRegistry]]:
    """``registry_factory(auth=..., users=..., tls=..., client_ca=..., standard=False)``:
    a started registry private to this test, stopped when the test ends."""
    made: list[LocalRegistry] = []

    def make(*, standard: bool = False, **kwargs: Any) -> LocalRegistry:
        kwargs.setdefault("pki", pki)
        reg = LocalRegistry(tmp_path / f"registry-{len(made)}", **kwargs)
        made.append(reg)
        reg.start()
        if standard:
            load_standard_set(reg)
        return reg

    yield make
    for reg in made:
        reg.stop()


@pytest.fixture
def canary() -> Iterator[Path]:
    """A directory outside every root that no layer may touch (hostile-layer tests)."""
    path = Path("/tmp") / f"pycrid-canary-{secrets.token_hex(4)}"
    path.mkdir()
    (path / "keep").write_text("untouched")
    (path / "sub").mkdir()
    try:
        yield path
    finally:
        shutil.rmtree(path)
