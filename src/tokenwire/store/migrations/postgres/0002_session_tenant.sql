-- tokenwire store, PostgreSQL schema version 2: the tenant a session belongs to.
-- Set from the first step a commit adds to a new session (its first chunk's `tenant`, written
-- by the gateway from the caller's key), never changed after; NULL for a session recorded
-- without one. The session routes scope a tenant key's reads by it (docs/gateway.md).
ALTER TABLE sessions ADD COLUMN tenant TEXT;
CREATE INDEX sessions_tenant ON sessions (tenant, last_ns);
