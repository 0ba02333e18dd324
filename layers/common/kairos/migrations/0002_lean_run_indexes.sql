-- Fewer index entries per run-row update (each claim, heartbeat and terminal update writes a new
-- row version).
--
-- A heartbeat rewrites only lease_expires_at and heartbeat_at of a running run. With neither
-- column indexed (nor in an index predicate) and room left on the row's page, PostgreSQL updates
-- the row in place (a HOT update): no new entries in the run's indexes and far less WAL, every
-- 20 s for every running run. The expired-lease scan reads the running runs instead, which
-- Lambda's concurrency bounds.
ALTER TABLE runs SET (fillfactor = 80);
DROP INDEX runs_lease_idx;
CREATE INDEX runs_running_idx ON runs (id) WHERE state = 'running';
-- No query reads runs by owner and creation time (runs are fetched by id, owner-checked); the index
-- only cost every claim and every terminal update one more entry.
DROP INDEX runs_owner_idx;
