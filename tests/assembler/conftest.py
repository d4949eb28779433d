"""Fixtures the assembler tests share."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from tokenwire.store import Store, open_store


@pytest.fixture
async def db(db_url: str) -> AsyncIterator[Store]:
    """An open store on ``db_url`` (SQLite file or PostgreSQL), closed afterwards."""
    store = open_store(db_url)
    try:
        yield store
    finally:
        await store.close()
