-- tokenwire store, PostgreSQL schema version 4: the log of repaired steps (docs/store.md).
-- `tokenwire rebuild --repair` rewrites a stored step that differs from what the broker
-- retains, in one transaction with one row here: what the step held before (its outcome as
-- JSON text and its chunk count), what it holds now, and how many later steps of the session
-- moved to keep the seqs contiguous.
CREATE TABLE step_repairs (
    session         TEXT    NOT NULL,
    turn            BIGINT  NOT NULL,
    step            BIGINT  NOT NULL,
    repaired_ns     BIGINT  NOT NULL,
    before_kind     TEXT    NOT NULL CHECK (before_kind IN ('message', 'error')),
    before_outcome  TEXT    NOT NULL,
    before_chunks   BIGINT  NOT NULL,
    after_kind      TEXT    NOT NULL CHECK (after_kind IN ('message', 'error')),
    after_chunks    BIGINT  NOT NULL,
    moved_steps     BIGINT  NOT NULL,
    PRIMARY KEY (session, turn, step, repaired_ns)
);
