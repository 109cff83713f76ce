"""Fixtures for every component test."""

from __future__ import annotations

import pytest

from pycrid.nri import api


@pytest.fixture(autouse=True)
def _no_nri_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """An NRI_PLUGIN_* variable in the environment would override a Stub's identity."""
    for var in (api.PLUGIN_NAME_ENV, api.PLUGIN_IDX_ENV, api.PLUGIN_SOCKET_ENV):
        monkeypatch.delenv(var, raising=False)
