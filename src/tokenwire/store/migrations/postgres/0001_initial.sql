-- tokenwire store, PostgreSQL schema version 1 (tables in the first schema of search_path).
-- sessions: one row per session, the last seq handed out and its counters. A commit locks
-- the rows of its sessions (SELECT ... FOR UPDATE) and updates them with the steps it adds.
CREATE TABLE sessions (
    session   TEXT    PRIMARY KEY,
    last_seq  BIGINT  NOT NULL DEFAULT 0,
    steps     BIGINT  NOT NULL DEFAULT 0,
    messages  BIGINT  NOT NULL DEFAULT 0,
    errors    BIGINT  NOT NULL DEFAULT 0,
    chunks    BIGINT  NOT NULL DEFAULT 0,
    first_ns  BIGINT,
    last_ns   BIGINT
);

-- steps: one row per (session, turn, step); the whole chunk log of the step packed in
-- `chunks` (zlib of the JSON array of envelopes, see `packing`), its outcome as JSON.
-- `json` (not jsonb) keeps the text as written and accepts \u0000 inside strings.
CREATE TABLE steps (
    session       TEXT     NOT NULL,
    turn          BIGINT   NOT NULL,
    step          BIGINT   NOT NULL,
    position      BIGINT   NOT NULL,
    seq_start     BIGINT   NOT NULL,
    seq_end       BIGINT   NOT NULL,
    chunk_count   INTEGER  NOT NULL,
    provider      TEXT     NOT NULL,
    model         TEXT     NOT NULL,
    outcome_kind  TEXT     NOT NULL CHECK (outcome_kind IN ('message', 'error')),
    outcome       JSON     NOT NULL,
    packing       SMALLINT NOT NULL,
    chunks        BYTEA    NOT NULL,
    first_ns      BIGINT   NOT NULL,
    completed_ns  BIGINT   NOT NULL,
    committed_ns  BIGINT   NOT NULL,
    PRIMARY KEY (session, turn, step),
    CHECK (seq_end = seq_start + chunk_count - 1)
);

-- Guards: steps are totally ordered per session, and two steps with chunks never start at
-- the same seq (steps without chunks share their seq_start with the next step).
CREATE UNIQUE INDEX steps_session_position ON steps (session, position);
CREATE UNIQUE INDEX steps_session_seq_start ON steps (session, seq_start) WHERE chunk_count > 0;
CREATE INDEX steps_session_seq_end ON steps (session, seq_end);

-- The blob is compressed already: store it out of line without a second (pglz) compression.
ALTER TABLE steps ALTER COLUMN chunks SET STORAGE EXTERNAL;
