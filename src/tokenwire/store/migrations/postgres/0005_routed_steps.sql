-- tokenwire store, PostgreSQL schema version 5: routed steps (docs/gateway.md, "Routes").
-- steps.deployment: the routes file's deployment that served the step (for a step that failed,
-- the last one tried); steps.routed: its first chunk's `routed` as JSON (the public name, the
-- deployment, the attempts that failed before it, the deployment's price). NULL for a step
-- routed as provider/model, and for every step stored before this version.
ALTER TABLE steps ADD COLUMN deployment TEXT;
ALTER TABLE steps ADD COLUMN routed TEXT;
-- step_usage.price_source: what decided the cost, `genai-prices` or `deployment` (the routes
-- file's price of the deployment that served the step); lines written before: genai-prices.
ALTER TABLE step_usage ADD COLUMN price_source TEXT NOT NULL DEFAULT 'genai-prices';
