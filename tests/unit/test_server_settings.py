"""Settings of ``store serve`` that are lists: read from the environment as ``store serve --workers N`` passes
them down to its processes."""

from __future__ import annotations

import pytest

from lightning_store.settings import load_server_settings


def test_cors_origins_come_comma_separated_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LIGHTNING_STORE_CORS_ORIGINS", "http://a.test, http://b.test,,")

    assert load_server_settings().cors_origins == ["http://a.test", "http://b.test"]


def test_an_argument_beats_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LIGHTNING_STORE_CORS_ORIGINS", "http://a.test")

    assert load_server_settings(cors_origins=["*"]).cors_origins == ["*"]
    assert load_server_settings().cors_origins == ["http://a.test"]


def test_no_cors_origins_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("LIGHTNING_STORE_CORS_ORIGINS", raising=False)

    assert load_server_settings().cors_origins == []
