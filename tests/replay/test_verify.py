"""verify: the retained stream, folded, against a real SQLite or PostgreSQL store."""

from __future__ import annotations

import uuid

import pytest

from tests.fixtures.stores import run_sql
from tests.replay.sessions import commit_folded, envelopes, publish
from tokenwire.replay import SessionNotFound, verify, verify_report
from tokenwire.store import open_store


@pytest.fixture
async def db(db_url):
    store = open_store(db_url)
    try:
        yield db_url, store
    finally:
        await store.close()


def alter_outcome(url: str, session: str, turn: int, step: int, old: str, new: str) -> None:
    if url.startswith("sqlite"):
        sql = "UPDATE steps SET outcome = replace(outcome, %s, %s) WHERE session = %s AND turn = %s AND step = %s"  # noqa: E501
    else:
        sql = "UPDATE steps SET outcome = replace(outcome::text, %s, %s)::json WHERE session = %s AND turn = %s AND step = %s"  # noqa: E501
    run_sql(url, sql, (old, new, session, turn, step))


async def test_a_clean_store_verifies(nc, topology, db):
    _, store = db
    session = f"v-{uuid.uuid4().hex[:10]}"
    sent = envelopes(session)
    await publish(nc, topology, sent)
    await commit_folded(store, sent)

    report = await verify_report(nc, topology, store, session)

    assert report.differences == []
    assert (report.steps, report.chunks) == (4, len(sent))


async def test_an_altered_message_is_named_by_its_step(nc, topology, db):
    url, store = db
    session = f"v-{uuid.uuid4().hex[:10]}"
    sent = envelopes(session)
    await publish(nc, topology, sent)
    await commit_folded(store, sent)
    alter_outcome(url, session, 1, 0, "sunny", "rainy")

    differences = await verify(nc, topology, store, session)

    assert [(d.turn, d.step, d.kind) for d in differences] == [(1, 0, "message")]
    assert "rainy" in differences[0].detail
    assert "sunny" in differences[0].detail
    assert str(differences[0]).startswith("turn 1 step 0: message: text differs")


async def test_an_altered_error_and_a_missing_step_are_reported(nc, topology, db):
    url, store = db
    session = f"v-{uuid.uuid4().hex[:10]}"
    sent = envelopes(session)
    await publish(nc, topology, sent)
    await commit_folded(store, [e for e in sent if (e.turn, e.step) != (0, 0)])
    alter_outcome(url, session, 2, 0, "upstream overloaded", "fine")

    differences = await verify(nc, topology, store, session)

    kinds = [(d.turn, d.step, d.kind) for d in differences]
    assert kinds == [(0, 0, "missing-in-store"), (2, 0, "error")]


async def test_a_stored_step_the_broker_does_not_retain_is_reported(nc, topology, db):
    _, store = db
    session = f"v-{uuid.uuid4().hex[:10]}"
    sent = envelopes(session)
    await publish(nc, topology, [e for e in sent if (e.turn, e.step) != (1, 1)])
    await commit_folded(store, sent)

    differences = await verify(nc, topology, store, session)

    assert [(d.turn, d.step, d.kind) for d in differences] == [(1, 1, "not-retained")]


async def test_an_unknown_session_is_not_found(nc, topology, db):
    _, store = db
    with pytest.raises(SessionNotFound):
        await verify(nc, topology, store, "never-seen")
