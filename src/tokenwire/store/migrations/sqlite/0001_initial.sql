-- tokenwire store, SQLite schema version 1.
-- sessions: one row per session, the last seq handed out and its counters. Every commit
-- updates it in the same transaction as the steps it adds.
CREATE TABLE sessions (
    session   TEXT    PRIMARY KEY,
    last_seq  INTEGER NOT NULL DEFAULT 0,
    steps     INTEGER NOT NULL DEFAULT 0,
    messages  INTEGER NOT NULL DEFAULT 0,
    errors    INTEGER NOT NULL DEFAULT 0,
    chunks    INTEGER NOT NULL DEFAULT 0,
    first_ns  INTEGER,
    last_ns   INTEGER
);

-- steps: one row per (session, turn, step); the whole chunk log of the step packed in
-- `chunks` (zlib of the JSON array of envelopes, see `packing`), its outcome as JSON text.
CREATE TABLE steps (
    session       TEXT    NOT NULL,
    turn          INTEGER NOT NULL,
    step          INTEGER NOT NULL,
    position      INTEGER NOT NULL,
    seq_start     INTEGER NOT NULL,
    seq_end       INTEGER NOT NULL,
    chunk_count   INTEGER NOT NULL,
    provider      TEXT    NOT NULL,
    model         TEXT    NOT NULL,
    outcome_kind  TEXT    NOT NULL CHECK (outcome_kind IN ('message', 'error')),
    outcome       TEXT    NOT NULL,
    packing       INTEGER NOT NULL,
    chunks        BLOB    NOT NULL,
    first_ns      INTEGER NOT NULL,
    completed_ns  INTEGER NOT NULL,
    committed_ns  INTEGER NOT NULL,
    PRIMARY KEY (session, turn, step),
    CHECK (seq_end = seq_start + chunk_count - 1)
);

-- Guards: steps are totally ordered per session, and two steps with chunks never start at
-- the same seq (steps without chunks share their seq_start with the next step).
CREATE UNIQUE INDEX steps_session_position ON steps (session, position);
CREATE UNIQUE INDEX steps_session_seq_start ON steps (session, seq_start) WHERE chunk_count > 0;
CREATE INDEX steps_session_seq_end ON steps (session, seq_end);
