-- tokenwire store, PostgreSQL schema version 3: the usage and cost ledger (docs/ledger.md).
-- step_usage: one line per stored step, written in the same transaction as the step's row.
-- Token counts are what the provider reported (NULL: not reported); cost_pusd is the cost
-- in pico-USD (10^-12 USD) from genai-prices, NULL with cost_reason when it was not priced.
-- `day` is an ISO date compared as text: COLLATE "C" orders it byte by byte.
CREATE TABLE step_usage (
    session             TEXT     NOT NULL,
    turn                BIGINT   NOT NULL,
    step                BIGINT   NOT NULL,
    provider            TEXT     NOT NULL,
    model               TEXT     NOT NULL,
    key_name            TEXT,
    tenant              TEXT,
    day                 TEXT     COLLATE "C" NOT NULL,
    time_ns             BIGINT   NOT NULL,
    outcome_kind        TEXT     NOT NULL CHECK (outcome_kind IN ('message', 'error')),
    reported            SMALLINT NOT NULL CHECK (reported IN (0, 1)),
    input_tokens        BIGINT,
    output_tokens       BIGINT,
    cache_read_tokens   BIGINT,
    cache_write_tokens  BIGINT,
    reasoning_tokens    BIGINT,
    cost_pusd           BIGINT,
    cost_reason         TEXT,
    price_version       TEXT     NOT NULL,
    PRIMARY KEY (session, turn, step),
    CHECK ((cost_pusd IS NULL) <> (cost_reason IS NULL))
);
CREATE INDEX step_usage_day ON step_usage (day);

-- usage_daily: the rollup, one row per (UTC day, provider, model, key name, tenant), updated
-- by every commit with the lines it adds ('' stands for no key name / no tenant). Commits
-- upsert their rows in key order, so two committers never deadlock on them.
CREATE TABLE usage_daily (
    day                 TEXT     COLLATE "C" NOT NULL,
    provider            TEXT     NOT NULL,
    model               TEXT     NOT NULL,
    key_name            TEXT     NOT NULL,
    tenant              TEXT     NOT NULL,
    steps               BIGINT   NOT NULL,
    reported            BIGINT   NOT NULL,
    priced              BIGINT   NOT NULL,
    input_tokens        BIGINT   NOT NULL,
    output_tokens       BIGINT   NOT NULL,
    cache_read_tokens   BIGINT   NOT NULL,
    cache_write_tokens  BIGINT   NOT NULL,
    reasoning_tokens    BIGINT   NOT NULL,
    cost_pusd           BIGINT   NOT NULL,
    PRIMARY KEY (day, provider, model, key_name, tenant)
);
