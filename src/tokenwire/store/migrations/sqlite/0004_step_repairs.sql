-- tokenwire store, SQLite schema version 4: the log of repaired steps (docs/store.md).
-- `tokenwire rebuild --repair` rewrites a stored step that differs from what the broker
-- retains, in one transaction with one row here: what the step held before (its outcome as
-- JSON text and its chunk count), what it holds now, and how many later steps of the session
-- moved to keep the seqs contiguous.
CREATE TABLE step_repairs (
    session         TEXT    NOT NULL,
    turn            INTEGER NOT NULL,
    step            INTEGER NOT NULL,
    repaired_ns     INTEGER NOT NULL,
    before_kind     TEXT    NOT NULL CHECK (before_kind IN ('message', 'error')),
    before_outcome  TEXT    NOT NULL,
    before_chunks   INTEGER NOT NULL,
    after_kind      TEXT    NOT NULL CHECK (after_kind IN ('message', 'error')),
    after_chunks    INTEGER NOT NULL,
    moved_steps     INTEGER NOT NULL,
    PRIMARY KEY (session, turn, step, repaired_ns)
);
