-- tokenwire store, SQLite schema version 3: the usage and cost ledger (docs/ledger.md).
-- step_usage: one line per stored step, written in the same transaction as the step's row.
-- Token counts are what the provider reported (NULL: not reported); cost_pusd is the cost
-- in pico-USD (10^-12 USD) from genai-prices, NULL with cost_reason when it was not priced.
CREATE TABLE step_usage (
    session             TEXT    NOT NULL,
    turn                INTEGER NOT NULL,
    step                INTEGER NOT NULL,
    provider            TEXT    NOT NULL,
    model               TEXT    NOT NULL,
    key_name            TEXT,
    tenant              TEXT,
    day                 TEXT    NOT NULL,
    time_ns             INTEGER NOT NULL,
    outcome_kind        TEXT    NOT NULL CHECK (outcome_kind IN ('message', 'error')),
    reported            INTEGER NOT NULL CHECK (reported IN (0, 1)),
    input_tokens        INTEGER,
    output_tokens       INTEGER,
    cache_read_tokens   INTEGER,
    cache_write_tokens  INTEGER,
    reasoning_tokens    INTEGER,
    cost_pusd           INTEGER,
    cost_reason         TEXT,
    price_version       TEXT    NOT NULL,
    PRIMARY KEY (session, turn, step),
    CHECK ((cost_pusd IS NULL) <> (cost_reason IS NULL))
);
CREATE INDEX step_usage_day ON step_usage (day);

-- usage_daily: the rollup, one row per (UTC day, provider, model, key name, tenant), updated
-- by every commit with the lines it adds ('' stands for no key name / no tenant).
CREATE TABLE usage_daily (
    day                 TEXT    NOT NULL,
    provider            TEXT    NOT NULL,
    model               TEXT    NOT NULL,
    key_name            TEXT    NOT NULL,
    tenant              TEXT    NOT NULL,
    steps               INTEGER NOT NULL,
    reported            INTEGER NOT NULL,
    priced              INTEGER NOT NULL,
    input_tokens        INTEGER NOT NULL,
    output_tokens       INTEGER NOT NULL,
    cache_read_tokens   INTEGER NOT NULL,
    cache_write_tokens  INTEGER NOT NULL,
    reasoning_tokens    INTEGER NOT NULL,
    cost_pusd           INTEGER NOT NULL,
    PRIMARY KEY (day, provider, model, key_name, tenant)
);
