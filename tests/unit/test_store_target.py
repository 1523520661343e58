"""How a ``--store`` value is read (``lightning_store.connect.store_target``)."""

from __future__ import annotations

import pytest

from lightning_store.connect import store_target
from lightning_store.errors import InvalidRequestError


@pytest.mark.parametrize(
    ("given", "read"),
    [
        ("http://127.0.0.1:4747", "http://127.0.0.1:4747"),
        ("http://127.0.0.1:4747/", "http://127.0.0.1:4747"),
        ("http://h:4747/v1/agl", "http://h:4747"),
        ("https://h/store/v1/agl/", "https://h/store"),
        ("http://h:4747/v1", "http://h:4747"),
        ("sqlite:///runs/store.db", "sqlite:///runs/store.db"),
        ("postgresql://u@h:5432/db", "postgresql://u@h:5432/db"),
    ],
)
def test_server_urls_lose_an_api_suffix_and_database_urls_stay(given: str, read: str) -> None:
    assert store_target(given) == read


@pytest.mark.parametrize("given", ["127.0.0.1:4795", "localhost:4747", "store-1.internal:80/", "[::1]:4747"])
def test_a_server_address_without_its_scheme_says_what_to_write(given: str) -> None:
    with pytest.raises(InvalidRequestError) as refused:
        store_target(given)
    assert refused.value.field == "store" and f"http://{given.rstrip('/')}" in str(refused.value)
